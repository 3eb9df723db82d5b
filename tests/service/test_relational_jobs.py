"""RT-J jobs through the served API, Redis and a real Celery worker: the same statuses, events,
checkpoints and downloads as pi05 jobs, and fields of the other family refused with a 400."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_engine.families.rtj.synth import write_fake_shop
from relay_engine.relational import RelationalTransformer
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shop(stack: Stack) -> Path:
    path = stack.root / "databases" / "shop"
    if not path.exists():
        write_fake_shop(path, customers=20, reviews=120)
    return path


def test_an_rt_j_job_runs_to_completion_with_its_events_and_files(
    worker: WorkerProcess, client: Client, shop: Path, tmp_path: Path
) -> None:
    config = SFTConfig(
        model="rt-j-tiny",
        dataset_name=str(shop),
        task="user-churn",
        batch_size=4,
        steps=10,
        learning_rate=1e-3,
    )
    job = train(config, client=client)
    assert job.status == "queued"
    job.wait(poll=1)
    assert job.status == "completed", job.error
    assert job.step == 10 and job.loss is not None
    described = job.to_dict()
    assert described["task"] == "user-churn" and described["finetune"] == "full"

    events = job.events()
    assert [e["step"] for e in events if "loss" in e] == [10]
    assert [e["step"] for e in events if e.get("event") == "checkpoint"] == [10]
    assert events[-1] == {"step": 10, "event": "finished"}

    files = {f["path"] for f in job.files(checkpoints=True)}
    assert {"output/model.safetensors", "output/config.json"} <= files
    assert any(p.startswith("checkpoints/step-00000010/") for p in files)
    target = job.download(tmp_path / "weights")
    tuned = RelationalTransformer(str(target), device="cpu")
    assert tuned.config["relay"]["task"] == "user-churn" and tuned.problem_type == "binary"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": "rt-j-tiny", "task": "user-churn", "cameras": {"base_0_rgb": "x"}}, "cameras"),
        ({"model": "rt-j-tiny"}, "task"),
        ({"model": "pi05-tiny", "task": "user-churn"}, "task"),
    ],
)
def test_fields_of_the_other_family_are_a_400(
    stack: Stack, user: tuple[str, str], shop: Path, fields: dict[str, object], param: str
) -> None:
    response = httpx.post(
        f"{stack.api_url}/v1/fine-tunes",
        json={"dataset_name": str(shop), **fields},
        headers={"authorization": f"Bearer {user[1]}"},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"]
    listed = httpx.get(f"{stack.api_url}/v1/fine-tunes", headers={"authorization": f"Bearer {user[1]}"})
    assert listed.json()["data"] == [], "a refused job was created"
