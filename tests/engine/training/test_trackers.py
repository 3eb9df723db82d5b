"""A recipe's integrations (relay_engine.trackers) with the real libraries: TensorBoard's event
files read back with its own reader, and W&B in offline mode read back from the run's record files
(the run's config, summary and history), across a stop and a resume; and a W&B server that cannot
be reached, which costs the run one warning event and nothing else."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2

from relay.events import TrackerEvent, parse_event
from tests.engine.training.test_recipe import losses, recipe_for, run

# Not a real key: what the tests look for in every file and event the run leaves.
FAKE_KEY = "f4k3" * 10
INTEGRATIONS = [
    {"type": "tensorboard"},
    {"type": "wandb", "wandb": {"project": "relay-tests", "name": "tiny", "tags": ["ci"]}},
]


@pytest.fixture
def offline_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_SILENT", "true")


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of a W&B run's ``.wandb`` file: a 7-byte header (``:W&B``, magic, version),
    then LevelDB's log format (32 KiB blocks of chunks: crc32, length, type; a record is one FULL
    chunk or FIRST, MIDDLE..., LAST), each record a ``wandb_internal_pb2.Record``."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, header, at, pieces = 32768, 7, 7, b""
    while at + header <= len(data):
        left = block - at % block
        if left < header:  # the block's tail is padding
            at += left
            continue
        _, length, kind = struct.unpack("<IHB", data[at : at + header])
        if length == 0 and kind == 0:
            break
        chunk = data[at + header : at + header + length]
        at += header + length
        pieces = chunk if kind in (1, 2) else pieces + chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            yield record


def wandb_run(run_dir: Path) -> dict[str, Any]:
    """One offline run directory as its id, config, summary and history rows (by ``_step``)."""
    import json

    (record_file,) = run_dir.glob("*.wandb")
    found: dict[str, Any] = {"id": None, "config": {}, "summary": {}, "history": {}}
    for record in wandb_records(record_file):
        which = record.WhichOneof("record_type")
        if which == "run":
            found["id"] = record.run.run_id
            found["project"] = record.run.project
            found["tags"] = list(record.run.tags)
            found["config"].update({u.key: json.loads(u.value_json) for u in record.run.config.update})
        elif which == "config":
            found["config"].update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif which == "summary":
            found["summary"].update({u.key: json.loads(u.value_json) for u in record.summary.update if u.key})
        elif which == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            found["history"][int(row["_step"])] = row
    return found


def tensorboard_scalars(log_dir: Path, tag: str) -> dict[int, float]:
    reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    reader.Reload()
    scalars = reader.Scalars(tag)
    steps = [s.step for s in scalars]
    assert len(steps) == len(set(steps)), f"{tag}: a step logged twice: {steps}"
    return {s.step: s.value for s in scalars}


def test_a_stopped_and_resumed_run_logs_each_step_once_to_one_run_of_each_tracker(
    synthetic_dataset_path: Path, dataset_cache: Path, tmp_path: Path, offline_wandb: None
) -> None:
    recipe = recipe_for(synthetic_dataset_path, integrations=INTEGRATIONS)
    work = tmp_path / "job"
    # Stop after step 6: the last checkpoint is step 4, so steps 5 and 6 are trained again.
    first, first_events = run(recipe, work, dataset_cache, stop_after=6)
    assert first.status == "stopped" and first.step == 6
    second, second_events = run(recipe, work, dataset_cache)
    assert second.status == "completed" and second.resumed_from == 4
    events = first_events + second_events
    assert not [e for e in events if e.kind == TrackerEvent.kind]

    # The job's metrics, as a reader of its events has them: the resumed run's for steps 5 on.
    job_losses = {**losses(first_events), **losses(second_events)}
    assert sorted(job_losses) == list(range(1, 13))

    # TensorBoard: every step once (the purge dropped the stopped run's 5 and 6), equal to the events.
    board = tensorboard_scalars(work / "tensorboard", "train/loss")
    assert sorted(board) == list(range(1, 13))
    for step, loss in job_losses.items():
        assert board[step] == pytest.approx(loss, rel=1e-5), step
    assert sorted(tensorboard_scalars(work / "tensorboard", "checkpoint/seconds")) == [4, 8, 12]

    # W&B: one run id over both runs; history continuous, each step once, equal to the events.
    runs = [wandb_run(d) for d in sorted((work / "wandb").glob("offline-run-*"))]
    assert len(runs) == 2 and runs[0]["id"] == runs[1]["id"] and runs[0]["id"].startswith("relay-")
    assert runs[0]["project"] == "relay-tests" and runs[0]["tags"] == ["ci"]
    assert sorted(runs[0]["history"]) == list(range(1, 7))
    assert sorted(runs[1]["history"]) == list(range(7, 13))
    history = {**runs[0]["history"], **runs[1]["history"]}
    first_losses = losses(first_events)
    for step in range(1, 13):
        # Steps 5 and 6 went to W&B once, from the stopped run; the resume is exact, so the same.
        expected = first_losses[step] if step <= 6 else job_losses[step]
        assert history[step]["train/loss"] == pytest.approx(expected, rel=1e-9), step
        assert history[step]["train/loss"] == pytest.approx(job_losses[step], abs=1e-6), step
    assert {s for s, row in history.items() if "checkpoint/seconds" in row} == {4, 8, 12}
    config = runs[1]["config"]
    assert config["recipe"]["model"] == "pi05-tiny" and config["recipe"]["steps"] == 12
    assert config["recipe"]["integrations"] == recipe.config.model_dump(mode="json")["integrations"]
    assert config["dataset"]["path"] == str(synthetic_dataset_path)
    assert config["resumed_from"] == 4 and config["job_id"] is None
    assert runs[0]["summary"]["status"] == "stopped"
    assert runs[1]["summary"]["status"] == "completed" and runs[1]["summary"]["step"] == 12
    assert runs[1]["summary"]["final_loss"] == pytest.approx(second.loss)

    # The key of the environment is in no file the run left and no event.
    for path in work.rglob("*"):
        if path.is_file():
            assert FAKE_KEY.encode() not in path.read_bytes(), path
    assert FAKE_KEY not in str(events)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_tracker_costs_one_warning_and_the_run_completes(
    synthetic_dataset_path: Path, dataset_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "2")
    monkeypatch.setenv("RELAY_TRACKER_FLUSH_SECONDS", "1")
    recipe = recipe_for(synthetic_dataset_path, integrations=INTEGRATIONS, steps=8, checkpoint_every=4)
    result, events = run(recipe, tmp_path / "job", dataset_cache)

    assert result.status == "completed" and result.step == 8
    warnings = [parse_event(e) for e in events if e.kind == TrackerEvent.kind]
    assert len(warnings) == 1, warnings
    (warning,) = warnings
    assert warning.tracker == "wandb" and "could not be opened" in warning.message
    assert FAKE_KEY not in warning.message
    # The other tracker is untouched by it.
    assert sorted(tensorboard_scalars(tmp_path / "job" / "tensorboard", "train/loss")) == list(range(1, 9))


def test_relay_local_train_takes_the_options_and_logs_the_same(
    synthetic_dataset_path: Path, tmp_path: Path
) -> None:
    """`relay local train --integration tensorboard --wandb-project P`, as a user runs it: its
    --json stdout stays one event a line (W&B captures no console), and both trackers hold its
    metrics; the W&B run's id is the one kept in the output directory."""
    import json
    import os
    import subprocess
    import sys

    output = tmp_path / "out"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": FAKE_KEY, "WANDB_SILENT": "true"}
    command = [sys.executable, "-m", "relay.cli", "local", "train", "--model", "pi05-tiny"]
    command += ["--dataset", str(synthetic_dataset_path), "--output-dir", str(output), "--steps", "10"]
    command += ["--batch-size", "4", "--json"]
    # A bad option is refused before anything runs.
    bad = subprocess.run([*command, "--integration", "wandb"], capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "wandb needs a project" in bad.stderr, bad.stderr
    command += ["--integration", "tensorboard", "--wandb-project", "relay-tests"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    (metrics,) = [e for e in lines if e.get("kind") == "metrics" or "grad_norm" in e]
    assert metrics["step"] == 10 and not [e for e in lines if e.get("event") == "tracker"]

    assert tensorboard_scalars(output / "tensorboard", "train/loss") == pytest.approx({10: metrics["loss"]})
    kept = json.loads((output / "trackers" / "wandb.json").read_text())
    (run_dir,) = (output / "wandb").glob("offline-run-*")
    logged = wandb_run(run_dir)
    assert logged["id"] == kept["run_id"] and kept["step"] == 10
    assert logged["history"][10]["train/loss"] == pytest.approx(metrics["loss"])
    assert logged["summary"]["status"] == "completed"


class FlakyTracker:
    """A tracker that fails its first `failures` calls (opening included), then keeps what it gets."""

    name = "wandb"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.scalars_sent: list[tuple[int, dict[str, Any]]] = []
        self.summaries: list[dict[str, Any]] = []
        self.closed = False

    def _maybe_fail(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("connection refused")

    def open(self, config: Any) -> None:
        self._maybe_fail()

    def scalars(self, step: int, values: Any) -> None:
        self._maybe_fail()
        self.scalars_sent.append((step, dict(values)))

    def update_config(self, values: Any) -> None:
        self._maybe_fail()

    def summary(self, values: Any) -> None:
        self._maybe_fail()
        self.summaries.append(dict(values))

    def close(self) -> None:
        self.closed = True


def test_a_tracker_that_fails_keeps_its_records_retries_them_in_order_and_warns_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from relay.events import MetricsEvent, RecipeResult
    from relay_engine import trackers

    monkeypatch.setattr(trackers, "RETRY_SECONDS_MIN", 0.01)
    flaky = FlakyTracker(failures=4)
    sink = trackers.Trackers([trackers._Sender(flaky, {}, lambda *_: None)])
    warnings = []
    started = time.monotonic()
    for step in range(10, 110, 10):
        warnings += sink.feed(MetricsEvent(step=step, loss=1.0 / step, grad_norm=1.0, lr=1e-3, skipped=0.0))
    assert time.monotonic() - started < 0.5  # feeding never waits on the tracker
    warnings += sink.finish(RecipeResult("completed", 100, 0.01, None), seconds=10)
    assert [w.tracker for w in warnings] == ["wandb"] and "connection refused" in warnings[0].message
    assert [step for step, _ in flaky.scalars_sent] == list(range(10, 110, 10))
    assert flaky.summaries[-1]["status"] == "completed" and flaky.closed

    # One that never comes back costs the end at most the flush bound, and warns once.
    dead = FlakyTracker(failures=10**9)
    sink = trackers.Trackers([trackers._Sender(dead, {}, lambda *_: None)])
    warnings = sink.feed(MetricsEvent(step=10, loss=0.5, grad_norm=1.0, lr=1e-3, skipped=0.0))
    started = time.monotonic()
    warnings += sink.finish(None, seconds=0.5)
    assert time.monotonic() - started < 3
    assert len(warnings) == 1 and warnings[0].unsent is not None
