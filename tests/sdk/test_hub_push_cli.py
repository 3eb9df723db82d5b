"""`relay fine-tunes push` and `FineTuneJob.push_to_hub` against the served API, a real worker and
the loopback Hub: a completed job's output, downloaded through the API, pushed with its model card,
and read back from the Hub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from relay.cli import app
from relay.errors import ConfigError
from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.job import FineTuneJob
from relay.sft.train import train
from tests.hub import FakeHub, without_xet
from tests.service.stack import Stack, WorkerProcess

TOKEN = "hf_cli_secret_0123456789"


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def printed_json(output: str) -> dict[str, Any]:
    """The --json line of stdout."""
    line = next(line for line in output.splitlines() if line.startswith("{"))
    value = json.loads(line)
    assert isinstance(value, dict)
    return value


@pytest.mark.slow
def test_push_through_the_cli_and_the_sdk(
    stack: Stack,
    worker: WorkerProcess,
    user: tuple[str, str],
    dataset: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = Client(stack.api_url, user[1], max_retries=0)
    config = SFTConfig(
        model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=2, name="push me", finetune="full"
    )
    job = train(config, client=client).wait(poll=0.5, progress=False)
    assert job.status == "completed", job.error
    downloaded = files_under(job.download(tmp_path / "download", progress=False))

    runner = CliRunner()
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": user[1], "RELAY_HOME": str(tmp_path / "home")}
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        without_xet(monkeypatch)

        pushed_cli = runner.invoke(
            app,
            ["fine-tunes", "push", job.id, "team/cli", "--public", "--revision", "exp", "--json"],
            env=env,
        )
        assert pushed_cli.exit_code == 0, pushed_cli.output
        pushed = printed_json(pushed_cli.stdout)
        assert (pushed["repo_id"], pushed["revision"], pushed["private"]) == ("team/cli", "exp", False)
        assert hub.created[-1] == {
            "name": "cli",
            "organization": "team",
            "visibility": "public",
            "type": "model",
        }
        repo = hub.models["team/cli"]
        assert not repo.private and repo.branches["exp"] == pushed["commit"]
        # Read back from the Hub: the output as the API serves it, the card beside it.
        on_hub = files_under(repo.commits[pushed["commit"]])
        card = on_hub.pop("README.md").decode()
        on_hub.pop(".gitattributes")
        on_hub.pop(".relay_push.json")  # what this push wrote, for the next one (relay.hub_push)
        assert on_hub == downloaded
        meta = yaml.safe_load(card[4 : card.index("\n---\n", 4)])
        assert meta["library_name"] == "lerobot" and "pi05" in meta["tags"]
        assert "datasets" not in meta and "base_model" not in meta  # a local dataset, the shipped base
        assert f"(job `{job.id}`)" in card and "# push me" in card
        assert f"| dataset | a local LeRobot dataset ({dataset.name}) |" in card
        assert 'from_checkpoint="team/cli"' in card
        assert str(dataset.parent) not in card  # no path of the service's disk

        # The SDK: private by default, on main.
        sdk = job.push_to_hub("team/sdk")
        assert (sdk.repo_id, sdk.revision, sdk.private) == ("team/sdk", "main", True)
        assert hub.created[-1]["visibility"] == "private" and hub.models["team/sdk"].private
        assert hub.models["team/sdk"].branches["main"] == sdk.commit
        assert set(files_under(hub.models["team/sdk"].commits[sdk.commit])) == {
            *downloaded,
            "README.md",
            ".gitattributes",
            ".relay_push.json",
        }

        # The token went to the Hub's write routes, and is in nothing the service or the Hub stored.
        writes = {
            auth
            for (method, _), auth in zip(hub.requests, hub.authorizations, strict=True)
            if method == "POST"
        }
        assert writes == {f"Bearer {TOKEN}"}
        stored = [
            json.dumps(job.refresh().to_dict()),
            json.dumps([dict(event) for event in job.events()]),
            job.summary().model_dump_json(),
            json.dumps(job.files(checkpoints=True)),
            pushed_cli.output,
        ]
        assert not [text for text in stored if TOKEN in text]
        for name in ("team/cli", "team/sdk"):
            for commit in hub.models[name].commits.values():
                assert all(TOKEN.encode() not in data for data in files_under(commit).values())

        # A malformed repo id: refused before the API or the Hub is asked, naming the argument.
        created = len(hub.created)
        bad = runner.invoke(app, ["fine-tunes", "push", job.id, "no owner"], env=env)
        assert bad.exit_code == 2 and 'error: bad repo: "no owner" (must be a Hub model repo id' in bad.output
        assert "Traceback" not in bad.output and len(hub.created) == created
        with pytest.raises(ConfigError, match=r'^bad repo_id: "team/x\.\.y"') as refused:
            job.push_to_hub("team/x..y")
        assert refused.value.param == "repo_id"

    # The Hub down (one that never answered: a closed hub's kept-alive connections still would): one
    # line saying so, exit 1, no traceback, no token.
    with FakeHub() as hub:
        pass
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    down = runner.invoke(app, ["fine-tunes", "push", job.id, "team/down"], env=env)
    assert down.exit_code == 1, down.output
    assert f"cannot push to team/down at {hub.endpoint}" in down.output
    assert "Traceback" not in down.output and TOKEN not in down.output, down.output
    client.close()


def test_a_bad_repo_or_branch_is_refused_without_a_service(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"RELAY_BASE_URL": "http://127.0.0.1:9", "RELAY_API_KEY": "relay-x", "RELAY_HOME": str(tmp_path)}
    bad = runner.invoke(app, ["fine-tunes", "push", "ft-0123456789ab", "a/b/c"], env=env)
    assert bad.exit_code == 2 and 'error: bad repo: "a/b/c"' in bad.output and "Traceback" not in bad.output
    branch = runner.invoke(app, ["fine-tunes", "push", "ft-0123456789ab", "a/b", "--revision", "-x"], env=env)
    assert branch.exit_code == 2 and 'error: bad --revision: "-x" (must be a branch name' in branch.output
    job = FineTuneJob(
        {"id": "ft-0123456789ab"}, client=Client("http://127.0.0.1:9", "relay-x", max_retries=0)
    )
    with pytest.raises(ConfigError, match=r'^bad revision: "a b"'):
        job.push_to_hub("team/ok", revision="a b")
