"""A recipe's `hub` block through the service: the worker pushes a completed job's output and its
model card to the loopback Hub with its own token, records the push in a `pushed` event and on the
results card (the CLI's and the console's, in a real browser); a push the Hub refuses leaves the
job completed and says why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from playwright.sync_api import Browser, expect
from typer.testing import CliRunner

from relay.cli import app
from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from tests.hub import FakeHub
from tests.service.browser import fenced_page, sign_in
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow

TOKEN = "hf_worker_secret_0123456789"


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as server:
        yield server


@pytest.fixture
def hub_worker(stack: Stack, hub: FakeHub) -> Iterator[WorkerProcess]:
    """The only worker, its environment pointing at the loopback Hub with a token (LFS uploads: the
    loopback Hub speaks no Xet). The shared worker starts again, as it was, for the next test."""
    stack.stop_worker()
    worker = stack.start_standby_worker(HF_ENDPOINT=hub.endpoint, HF_TOKEN=TOKEN, HF_HUB_DISABLE_XET="1")
    worker.wait_ready()
    yield worker
    worker.stop()


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_worker_pushes_a_completed_job_and_records_it(
    stack: Stack,
    hub_worker: WorkerProcess,
    hub: FakeHub,
    user: tuple[str, str],
    dataset: Path,
    tmp_path: Path,
    browser: Browser,
) -> None:
    hub.forbidden.add("someone-else/denied")
    client = Client(stack.api_url, user[1], max_retries=0)
    tiny = {"model": "pi05-tiny", "dataset_name": str(dataset), "batch_size": 2, "steps": 2}
    job = train(SFTConfig(**tiny, hub={"repo_id": "team/auto", "revision": "nightly"}), client=client)
    assert job.to_dict()["hub"] == {"repo_id": "team/auto", "private": True, "revision": "nightly"}
    denied = train(SFTConfig(**tiny, hub={"repo_id": "someone-else/denied"}), client=client)
    job.wait(poll=0.5, progress=False)
    denied.wait(poll=0.5, progress=False)
    assert (job.status, denied.status) == ("completed", "completed"), (job.error, denied.error)

    # Pushed: a new private repo's branch, its commit on the results card and in the event.
    card = job.summary()
    assert card.pushed is not None and card.pushed.error is None
    repo = hub.models["team/auto"]
    assert repo.private and hub.created[0]["visibility"] == "private"
    assert (card.pushed.repo_id, card.pushed.revision, card.pushed.commit) == (
        "team/auto",
        "nightly",
        repo.branches["nightly"],
    )
    pushed = [event for event in job.events() if event.kind == "pushed"]
    assert [(event["repo_id"], event["commit"]) for event in pushed] == [("team/auto", card.pushed.commit)]
    on_hub = files_under(repo.commits[card.pushed.commit])
    readme = on_hub.pop("README.md").decode()
    on_hub.pop(".gitattributes")
    on_hub.pop(".relay_push.json")  # what this push wrote, for the next one (relay.hub_push)
    assert on_hub == files_under(job.download(tmp_path / "download", progress=False))
    meta = yaml.safe_load(readme[4 : readme.index("\n---\n", 4)])
    assert meta["library_name"] == "lerobot" and f"(job `{job.id}`)" in readme
    assert 'from_checkpoint="team/auto"' in readme

    # Refused by the Hub: the job completed with its output, the card and the event say why.
    refused = denied.summary().pushed
    assert refused is not None and refused.commit is None and refused.repo_id == "someone-else/denied"
    assert refused.error is not None and refused.error.startswith(
        f"cannot push to someone-else/denied at {hub.endpoint}: "
    )
    assert "someone-else/denied" not in hub.models and denied.files()
    runner = CliRunner()
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": user[1], "RELAY_HOME": str(tmp_path / "home")}
    shown = runner.invoke(app, ["fine-tunes", "retrieve", denied.id], env=env)
    assert shown.exit_code == 0 and "not pushed to someone-else/denied at main: cannot push" in shown.output
    shown = runner.invoke(app, ["fine-tunes", "retrieve", job.id], env=env)
    assert f"pushed to team/auto at nightly, commit {card.pushed.commit[:8]}" in shown.output

    # The console's results card: the same line.
    page, _ = fenced_page(browser, stack.api_url)
    sign_in(page, stack.api_url, user[1])
    for each, line in (
        (job, f"pushed to team/auto at nightly, commit {card.pushed.commit[:8]}: {card.pushed.url}"),
        (denied, "not pushed to someone-else/denied at main: cannot push to someone-else/denied at "),
    ):
        page.goto(f"{stack.api_url}/#/jobs/{each.id}")
        expect(page.locator("[data-testid=results] [data-result=pushed]")).to_contain_text(line)
    page.context.close()

    # The worker's token: in the Hub's write requests, in nothing the service or the Hub keeps.
    writes = {
        auth for (method, _), auth in zip(hub.requests, hub.authorizations, strict=True) if method == "POST"
    }
    assert writes == {f"Bearer {TOKEN}"}
    for each in (job, denied):
        stored = [
            json.dumps(each.refresh().to_dict()),
            json.dumps([dict(event) for event in each.events()]),
            each.summary().model_dump_json(),
        ]
        assert not [text for text in stored if TOKEN in text]
    assert all(
        TOKEN.encode() not in data
        for commit in repo.commits.values()
        for data in files_under(commit).values()
    )
    for each in (job, denied):  # the work directory: output, checkpoints, the event journal
        assert not [
            p
            for p in stack.settings.job_dir(each.id).rglob("*")
            if p.is_file() and TOKEN.encode() in p.read_bytes()
        ]
    client.close()


def test_a_bad_hub_block_is_refused_naming_its_field(
    stack: Stack, user: tuple[str, str], dataset: Path
) -> None:
    body = {"model": "pi05-tiny", "dataset_name": str(dataset), "hub": {"repo_id": "no-owner"}}
    answer = httpx.post(
        f"{stack.api_url}/v1/fine-tunes",
        json=body,
        headers={"authorization": f"Bearer {user[1]}"},
        timeout=30,
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "hub.repo_id" and error["message"].startswith('bad hub.repo_id: "no-owner"')
    body["hub"] = {"repo_id": "team/x", "token": "hf_x"}
    answer = httpx.post(
        f"{stack.api_url}/v1/fine-tunes",
        json=body,
        headers={"authorization": f"Bearer {user[1]}"},
        timeout=30,
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "hub.token"
    assert "hf_x" not in answer.text
