"""RT-J jobs on a PostgreSQL database named by URL, through the SDK, the HTTP API and the CLI, on
the real server, Redis and a Celery worker: the job trains on a snapshot taken at its start (a
`snapshot` event with the row counts), and the URL's password is in no answer, no stored config, no
event and no file of the job; it is held apart until the snapshot, then deleted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import select, text

from relay.errors import ConfigError
from relay.http_client import Client
from relay.sft import list_jobs, retrieve
from relay.sft.config import SFTConfig
from relay.sft.job import FineTuneJob
from relay.sft.train import train
from relay_api.models import dataset_credentials, fine_tunes
from relay_engine.families.rtj.database import Database, open_database
from relay_engine.families.rtj.synth import write_fake_shop
from relay_engine.relational import RelationalTransformer
from tests.service.stack import Stack, WorkerProcess
from tests.sql_shop import postgres_database, write_shop

pytestmark = pytest.mark.slow

PASSWORD = "Tr0ub4dor-3x"
TRAIN = {"model": "rt-j-tiny", "task": "user-churn", "batch_size": 4, "steps": 4, "learning_rate": 1e-3}


@pytest.fixture(scope="module")
def shop(stack: Stack) -> Database:
    path = stack.root / "databases" / "url-shop"
    if not path.exists():
        write_fake_shop(path, customers=20, reviews=120)
    return open_database(path)


@pytest.fixture(scope="module")
def url(shop: Database) -> Iterator[str]:
    """The shop in a new PostgreSQL database, its tasks as tables in it, named with a password (the
    local server trusts its clients, so any password connects: it must still be stored nowhere)."""
    with postgres_database() as plain:
        write_shop(plain, shop, task_tables=True)
        yield plain.replace("postgres@", f"postgres:{PASSWORD}@")


@pytest.fixture(scope="module")
def url_without_tasks(shop: Database) -> Iterator[str]:
    """The shop's tables alone in PostgreSQL: its tasks stay in the shop's directory (a tasks_dir)."""
    with postgres_database() as plain:
        write_shop(plain, shop)
        yield plain.replace("postgres@", f"postgres:{PASSWORD}@")


def assert_trained_on_a_snapshot(stack: Stack, job: FineTuneJob, shop: Database, tmp_path: Path) -> None:
    """Completed, from a snapshot event of the shop's row counts, the password nowhere it could be."""
    assert job.status == "completed", job.error
    masked = job.dataset_name
    assert PASSWORD not in masked and ":***@" in masked
    events = job.events()
    snapshot = next(e for e in events if e.get("event") == "snapshot")
    assert snapshot["source"] == masked
    assert snapshot["row_counts"] == {name: table.num_rows for name, table in shop.tables.items()}
    with stack.sessions() as session:
        stored = session.scalar(select(fine_tunes.c.config).where(fine_tunes.c.id == job.id))
        held = session.scalar(select(dataset_credentials.c.url).where(dataset_credentials.c.job_id == job.id))
        rows = session.execute(text("SELECT data FROM fine_tune_events WHERE job_id = :id"), {"id": job.id})
        stored_events = [json.dumps(row[0]) for row in rows]
    assert stored["dataset_name"] == masked and held is None, "the password outlived the snapshot"
    for written in (json.dumps(job.to_dict()), json.dumps(events), *stored_events):
        assert PASSWORD not in written
    job_dir = stack.settings.job_dir(job.id)
    for path in job_dir.rglob("*"):
        assert not path.is_file() or PASSWORD.encode() not in path.read_bytes(), path
    # The output reads its rows from the job's snapshot (what `relay serve` predicts for).
    tuned = RelationalTransformer(str(job.download(tmp_path / "tuned")), device="cpu")
    assert Path(tuned.config["relay"]["dataset"]) == Path(snapshot["path"])
    assert Path(snapshot["path"]).is_relative_to(job_dir)


def test_an_rt_j_job_trains_from_a_postgresql_url_through_the_sdk(
    stack: Stack, worker: WorkerProcess, client: Client, shop: Database, url: str, tmp_path: Path
) -> None:
    job = train(SFTConfig(dataset_name=url, **TRAIN), client=client)  # type: ignore[arg-type]
    assert PASSWORD not in job.dataset_name  # the answer to the create already holds it masked
    job.wait(poll=0.5, timeout=300)
    assert_trained_on_a_snapshot(stack, job, shop, tmp_path)


def test_an_rt_j_job_trains_from_a_postgresql_url_through_http(
    stack: Stack, worker: WorkerProcess, client: Client, shop: Database, url: str, tmp_path: Path
) -> None:
    """What `curl -d '{...}' /v1/fine-tunes` sends."""
    answer = httpx.post(
        f"{stack.api_url}/v1/fine-tunes",
        json={"dataset_name": url, **TRAIN},
        headers={"authorization": f"Bearer {client.api_key}"},
    )
    assert answer.status_code == 200, answer.text
    assert PASSWORD not in answer.text
    job = retrieve(answer.json()["id"], client=client).wait(poll=0.5, timeout=300)
    assert_trained_on_a_snapshot(stack, job, shop, tmp_path)


def test_an_rt_j_job_trains_from_a_postgresql_url_through_the_cli(
    stack: Stack,
    worker: WorkerProcess,
    client: Client,
    shop: Database,
    url_without_tasks: str,
    tmp_path: Path,
) -> None:
    """With its tasks in a --tasks-dir on the workers' disk, copied into the job's snapshot."""
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": client.api_key, "RELAY_HOME": str(tmp_path)}
    options = ["--model", "rt-j-tiny", "--dataset", url_without_tasks, "--task", "user-churn"]
    options += ["--tasks-dir", str(shop.root / "tasks"), "--batch-size", "4"]
    created = subprocess.run(
        [
            sys.executable,
            "-m",
            "relay.cli",
            "fine-tunes",
            "create",
            *options,
            "--steps",
            "4",
            "--wait",
            "--json",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert created.returncode == 0, created.stderr
    assert PASSWORD not in created.stdout + created.stderr
    job = retrieve(json.loads(created.stdout)["id"], client=client)
    assert job.to_dict()["tasks_dir"] == str(shop.root / "tasks")
    assert_trained_on_a_snapshot(stack, job, shop, tmp_path)


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"model": "pi05-tiny", "task": None},
            "dataset_name",
            "pi05-tiny trains on LeRobot datasets; a database URL or RelBench name is read by",
        ),
        (
            {"dataset_name": "sqlite:///relative/shop.db"},
            "dataset_name",
            "must be named by its absolute path",
        ),
        ({"dataset_name": "sqlite://"}, "dataset_name", "must be named by its absolute path"),
        ({"tasks_dir": "shop-tasks"}, "tasks_dir", "an absolute path (/data/shop-tasks, or ~/...)"),
    ],
)
def test_a_database_url_no_worker_could_read_is_a_400(
    stack: Stack, client: Client, url: str, fields: dict[str, object], param: str, words: str
) -> None:
    body = {k: v for k, v in {"dataset_name": url, **TRAIN, **fields}.items() if v is not None}
    answer = httpx.post(
        f"{stack.api_url}/v1/fine-tunes", json=body, headers={"authorization": f"Bearer {client.api_key}"}
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert PASSWORD not in answer.text
    assert list_jobs(client=client) == [], "a refused job was created"


def test_the_datasets_endpoint_says_a_database_url_is_not_a_lerobot_dataset(
    stack: Stack, client: Client, url: str
) -> None:
    answer = httpx.get(
        f"{stack.api_url}/v1/datasets/{quote(url, safe='')}",
        headers={"authorization": f"Bearer {client.api_key}"},
    )
    assert answer.status_code == 400, answer.text
    assert "relay datasets check" in answer.json()["error"]["message"] and PASSWORD not in answer.text


# URLs that no parser reads as a database URL, each holding the password where no mask could find
# it: refused at create, naming dataset_name, and the password in no answer, row or log line.
MALFORMED_URLS = [
    f"postgresql://ana:{PASSWORD}@[::1/shop",  # an IPv6 host's bracket left open
    f"postgresql://ana:{PASSWORD}@[::1]:port/shop",  # a port that is no number
    f"postgresql://ana:{PASSWORD}@db.example:70000/shop",  # a port out of range
    f"postgresql://ana:{PASSWORD}@db example/shop",  # a space in the host
    f"postgres://ana:{PASSWORD}@db/shop",  # a backend SQLAlchemy does not know
    f"postgresql+://ana:{PASSWORD}@db/shop",  # an empty driver
    f"mysql+pymysql://ana:{PASSWORD}@[db/shop",
    f"https://ana:{PASSWORD}@huggingface.co/datasets/x",  # a URL of no database
    f"ana:{PASSWORD}@db/shop",  # no // at all
    f"postgresql://ana:{PASSWORD}@db/shop\n",  # a control character
]


CLI_MALFORMED = ["--model", "rt-j-tiny", "--task", "user-churn", "--dataset", MALFORMED_URLS[0]]


def test_a_malformed_database_url_is_refused_and_its_password_is_nowhere(
    stack: Stack, worker: WorkerProcess, client: Client, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    headers = {"authorization": f"Bearer {client.api_key}"}
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": client.api_key, "RELAY_HOME": str(tmp_path)}
    worker_log_before = worker.log_since_start()
    seen: list[str] = []
    with caplog.at_level("DEBUG"):
        for name in MALFORMED_URLS:
            for model in ({"model": "rt-j-tiny", "task": "user-churn"}, {"model": "pi05-tiny"}):
                answer = httpx.post(
                    f"{stack.api_url}/v1/fine-tunes", json={"dataset_name": name, **model}, headers=headers
                )
                assert answer.status_code == 400, (name, answer.text)
                assert answer.json()["error"]["param"] == "dataset_name", answer.text
                assert "does not parse" in answer.json()["error"]["message"], answer.text
                seen.append(answer.text)
            described = httpx.get(f"{stack.api_url}/v1/datasets/{quote(name, safe='')}", headers=headers)
            assert described.status_code == 400, described.text
            seen.append(described.text)
            with pytest.raises(ConfigError) as raised:
                SFTConfig(model="rt-j-tiny", task="user-churn", dataset_name=name)
            seen.append(str(raised.value))
        created = subprocess.run(
            [sys.executable, "-m", "relay.cli", "fine-tunes", "create", *CLI_MALFORMED],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert created.returncode != 0 and "dataset_name" in created.stdout + created.stderr
        seen.append(created.stdout + created.stderr)
    # The API's own log lines (it runs in this process); not this test's client's.
    seen.extend(f"{r.getMessage()} {r.exc_text}" for r in caplog.records if not r.name.startswith("http"))
    seen.append(worker.log_since_start().removeprefix(worker_log_before))
    with stack.sessions() as session:
        for table in ("fine_tunes", "fine_tune_events", "dataset_credentials", "deployments"):
            rows = session.execute(text(f"SELECT * FROM {table}")).all()
            seen.extend(repr(tuple(row)) for row in rows)
    assert list_jobs(client=client) == [], "a refused job was created"
    leaks = [text_ for text_ in seen if PASSWORD in text_]
    assert not leaks, leaks[:3]
