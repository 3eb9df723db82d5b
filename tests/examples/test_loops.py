"""The flat training loops of examples/ run as a user runs them: the local one on this machine, the
session one against the real service (API, PostgreSQL, Redis and a Celery worker), both on
pi05-tiny and a small synthetic dataset, a few steps each, then again to resume."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest

from relay_engine.datasets import write_synthetic_dataset
from relay_engine.models import load_policy
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / name), *args])
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")


def test_local_loop_trains_saves_resumes_and_writes_a_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RELAY_CACHE_DIR", str(tmp_path / "cache"))
    dataset = write_synthetic_dataset(tmp_path / "look", episodes=4, episode_length=(10, 12), seed=5)
    out_dir = tmp_path / "run"
    settings = [f"--dataset={dataset}", f"--out_dir={out_dir}", "--steps=4", "--batch_size=4"]
    settings += ["--held_out_episodes=1", "--log_every=2", "--checkpoint_every=2"]

    run_example("local_loop.py", settings, monkeypatch)
    first = capsys.readouterr().out
    assert re.search(r"^step 2/4  loss \d+\.\d+  grad_norm \d+\.\d+  lr ", first, re.MULTILINE), first
    assert "step 4/4" in first and "resuming" not in first
    errors = re.search(r"untrained (\d+\.\d+), trained (\d+\.\d+)", first)
    assert errors is not None and float(errors[2]) != float(errors[1]), first
    assert load_policy(str(out_dir / "model")).config.robot_action_dim == 2

    run_example("local_loop.py", settings, monkeypatch)  # all 4 steps are in the checkpoint
    again = capsys.readouterr().out
    assert "resuming from step 4" in again and "step 2/4" not in again
    assert f"trained {errors[2]}" in again  # the checkpoint holds the trained weights


def test_session_loop_trains_through_the_service_and_resumes_from_a_saved_state(
    stack: Stack,
    user: tuple[str, str],
    worker: WorkerProcess,
    dataset: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("RELAY_BASE_URL", stack.api_url)
    monkeypatch.setenv("RELAY_API_KEY", user[1])
    monkeypatch.setenv("RELAY_HOME", str(tmp_path / "no-client-file-here"))
    monkeypatch.setenv("RELAY_CACHE_DIR", str(tmp_path / "cache"))
    settings = ["--dataset", str(dataset), "--steps", "4", "--batch-size", "2", "--rank", "4"]
    settings += ["--held-out-episodes", "1", "--eval-frames", "4", "--log-every", "2", "--save-every", "2"]

    run_example("session_loop.py", settings, monkeypatch)
    first = capsys.readouterr().out
    assert "session ready: {'model': 'pi05-tiny'" in first, first
    assert re.search(r"^step 2/4  loss \d+\.\d+  grad_norm \d+\.\d+  lr ", first, re.MULTILINE), first
    assert "saved step-2" in first and "saved step-4" in first
    assert re.search(r"untrained \d+\.\d+, trained \d+\.\d+", first), first

    run_example("session_loop.py", [*settings, "--resume", "step-4"], monkeypatch)
    again = capsys.readouterr().out
    assert "resumed from step-4" in again and "step 2/4" not in again
