"""`relay local train --from-checkpoint`: a directory (relative or absolute) and a Hub repo at a
revision train from those weights; a fine-tune's id is refused with how to get its weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hub import FakeHub, Repo


def relay(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def train_args(dataset: Path, output_dir: Path, *more: str) -> list[str]:
    return [
        "local", "train", "--model", "pi05-tiny", "--dataset", str(dataset), "--output-dir", str(output_dir),
        "--steps", "2", "--batch-size", "4", "--json", *more,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def parent(synthetic_dataset_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("parent")
    done = relay(*train_args(synthetic_dataset_path, output))
    assert done.returncode == 0, done.stderr
    return output


def weights_event(stdout: str) -> dict[str, object]:
    lines = [json.loads(line) for line in stdout.splitlines()]
    return next(line for line in lines if line.get("event") == "weights")


def test_a_relative_directory_is_read_as_that_directory(
    parent: Path, synthetic_dataset_path: Path, tmp_path: Path
) -> None:
    done = relay(
        *train_args(synthetic_dataset_path, tmp_path / "child", "--from-checkpoint", parent.name),
        cwd=parent.parent,
    )
    assert done.returncode == 0, done.stderr
    assert weights_event(done.stdout) == {
        "step": 0, "event": "weights", "model": "pi05-tiny", "repo": None,
        "revision": None, "sha": None, "path": str(parent.resolve()), "job": None,
    }  # fmt: skip
    # Without --json, the progress says where the weights came from.
    shown = relay(
        *[arg for arg in train_args(synthetic_dataset_path, tmp_path / "shown") if arg != "--json"],
        "--from-checkpoint",
        str(parent),
    )
    assert shown.returncode == 0, shown.stderr
    assert f"starting from pi05-tiny weights of {parent}" in shown.stderr


def test_a_hub_repo_at_a_revision(parent: Path, synthetic_dataset_path: Path, tmp_path: Path) -> None:
    repo = Repo()
    sha = repo.add_commit(parent, tag="v2")
    with FakeHub() as hub:
        hub.models["team/my-pi05"] = repo
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(tmp_path / "cache")}
        done = relay(
            *train_args(synthetic_dataset_path, tmp_path / "child", "--from-checkpoint", "team/my-pi05@v2"),
            env=env,
        )
        missing = relay(
            *train_args(synthetic_dataset_path, tmp_path / "none", "--from-checkpoint", "team/my-pi05@v9"),
            env=env,
        )
    assert done.returncode == 0, done.stderr
    event = weights_event(done.stdout)
    assert (event["repo"], event["revision"], event["sha"]) == ("team/my-pi05", "v2", sha)
    assert missing.returncode != 0
    assert (
        "bad from_checkpoint: cannot get model.safetensors of team/my-pi05 at revision v9" in missing.stderr
    )
    assert "Traceback" not in missing.stderr


def test_a_job_id_needs_the_service_and_a_bad_value_is_refused(
    synthetic_dataset_path: Path, tmp_path: Path
) -> None:
    job = relay(*train_args(synthetic_dataset_path, tmp_path, "--from-checkpoint", "ft-0123456789ab"))
    assert job.returncode == 1
    assert "ft-0123456789ab is a fine-tune of the service, and a job id needs the service" in job.stderr
    assert "relay fine-tunes download ft-0123456789ab --dir DIR" in job.stderr
    bad = relay(*train_args(synthetic_dataset_path, tmp_path, "--from-checkpoint", "gpt2"))
    assert bad.returncode == 1 and 'bad from_checkpoint: "gpt2" (must name the weights' in bad.stderr
    wrong = relay(*train_args(synthetic_dataset_path, tmp_path, "--normalization", "checkpoint"))
    assert wrong.returncode == 1 and 'bad normalization: "checkpoint" uses the statistics' in wrong.stderr
