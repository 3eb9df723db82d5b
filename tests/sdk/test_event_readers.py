"""What the SDK's readers of a job's events show of each kind: `relay fine-tunes events`, the live
panel, `relay local train`'s progress and a waiting job's stage. An event of a kind this SDK does not
know (one a newer worker reports) is shown as it stands, or passed over, never a crash."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from relay.cli.fine_tunes import _print_event
from relay.cli.local import _TrainingProgress
from relay.cli.watch import LossPanel
from relay.events import (
    CheckpointEvent,
    DatasetEvent,
    EvalEvent,
    FinishedEvent,
    MetricsEvent,
    ResumedEvent,
    SnapshotEvent,
    StageEvent,
    WeightsEvent,
    parse_event,
)
from relay.http_client import Client
from relay.progress import ProgressReport
from relay.sft.job import Event, FineTuneJob, _StageWatch

# An event of a kind from a newer worker: this SDK has no class for it.
UNKNOWN = {"step": 20, "event": "video", "kind": "video", "frames": 12, "seconds": 0.5}
VALIDATION = {
    "step": 20,
    "event": "validation",
    "kind": "validation",
    "validation_loss": 0.1043,
    "mean_action_mse": 0.01,
    "action_spread": 0.0023,
    "action_mse": 0.0123,
    "blind_mse": 0.0281,
    "chunks": 4,
    "frames": 48,
    "episodes": 4,
    "seconds": 3.21,
}
VALIDATION_LINE = (
    "action error 0.01 (mean of 4 chunks) vs blind 0.0281 (2.81x better), one chunk 0.0123, "
    "spread 0.0023, validation loss 0.1043, 48 frames of 4 episodes"
)


def api_events() -> list[Event]:
    """A job's events as the API answers them, ids 1 to 7, the unknown kind among them."""
    answered: list[dict[str, Any]] = [
        {
            "kind": "metrics",
            "created_at": "2025-01-01T00:00:00Z",
            "step": 10,
            "loss": 0.2134567,
            "grad_norm": 0.91,
            "lr": 2.4e-06,
            "skipped": 0.0,
            "steps_per_second": 1.2345,
            "samples_per_second": 9.8,
            "data_wait": 0.01,
        },
        {"step": 20, "loss": 0.2, "grad_norm": 0.8, "lr": 1e-6},  # an older row: no kind, no pace
        {"step": 20, "event": "checkpoint", "kind": "checkpoint", "seconds": 1.23456},
        VALIDATION,
        UNKNOWN,
        {"step": 20, "event": "finished", "kind": "finished"},
        {"step": 20, "event": "stage", "kind": "stage", "stage": "writing"},
    ]
    return [Event.from_api({"id": number, **data}) for number, data in enumerate(answered, start=1)]


def test_an_unknown_kind_is_refused_by_parse_event() -> None:
    """What the readers below must stand: the typed form of an unknown kind is a ValueError."""
    with pytest.raises(ValueError, match="unknown event kind 'video'"):
        parse_event(UNKNOWN)


def test_fine_tunes_events_prints_a_line_per_event_and_an_unknown_kind_as_it_stands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for event in api_events():
        _print_event(event, False, 20)
    assert capsys.readouterr().out.splitlines() == [
        "id      1  step     10  loss 0.2135  grad_norm 0.91  lr 2.4e-06  skipped 0%  1.23 steps/s",
        "id      2  step     20  loss 0.2  grad_norm 0.8  lr 1e-06  skipped -  - steps/s",
        "id      3  step     20  checkpoint  seconds 1.235",
        f"id      4  step     20  validation  {VALIDATION_LINE}  (3.21 s)",
        "id      5  step     20  video  frames 12  seconds 0.5",
        "id      6  step     20  finished",
        "id      7  step     20  stage  stage writing",
    ]
    _print_event(api_events()[4], True, 20)
    assert json.loads(capsys.readouterr().out) == {
        "id": 5,
        "created_at": None,
        **{k: v for k, v in UNKNOWN.items() if k != "kind"},
    }


def test_the_live_panel_takes_losses_and_ends_and_passes_over_an_unknown_kind() -> None:
    fields = {"id": "ft-1", "status": "queued", "step": 0, "steps": 100, "loss": None}
    panel = LossPanel(FineTuneJob(fields, client=Client("http://127.0.0.1:9", "unused")))
    events = api_events()
    panel.add(events[0])
    assert (panel.losses, panel.status, panel.step) == ([0.2134567], "running", 10)
    panel.status = "queued"
    panel.add(Event.from_api({"id": 8, "step": 30, "event": "video", "frames": 1}))
    assert (panel.status, panel.step) == ("queued", 30)  # its step counts, nothing else
    panel.add(Event.from_api({"id": 9, "step": 30, "grad_norm": 0.5}))  # metrics without a loss
    assert (panel.losses, panel.status) == ([0.2134567], "queued")
    panel.add(events[2])  # a checkpoint leaves the status as it was
    assert panel.status == "queued"
    for ended, status in [("cancelled", "cancelled"), ("error", "error"), ("finished", "completed")]:
        extra = {"message": "out of memory"} if ended == "error" else {}
        panel.add(Event.from_api({"id": 10, "step": 30, "event": ended, **extra}))
        assert panel.status == status


def local_events() -> list[dict[str, Any]]:
    """What the engine reports to `relay local train`, the unknown kind among them."""
    return [
        DatasetEvent(
            step=0,
            repo="lerobot/pusht",
            revision="v2.1",
            sha="1a2b3c4d5e",
            format="v2.1",
            frames=25650,
            episodes=206,
        ),
        WeightsEvent(
            step=0, model="pi05-tiny", repo="team/p", revision="v2", sha="abcdef123456", path=None, job=None
        ),
        SnapshotEvent(
            step=0,
            source="postgresql://u:***@h/db",
            path="/snap",
            taken_at="2025-01-01T00:00:00Z",
            row_counts={"review": 240, "user": 1200},
        ),
        ResumedEvent(step=10),
        MetricsEvent(step=10, loss=0.2134567, grad_norm=0.91, lr=2.4e-6, skipped=0.1, steps_per_second=1.5),
        CheckpointEvent(step=10, seconds=1.2),
        dict(UNKNOWN),
        StageEvent(step=20, stage="validating", detail="the held-out episodes"),
        parse_event(VALIDATION),
        EvalEvent(
            step=20,
            env="relay/Dot-v0",
            success_rate=0.6,
            mean_reward=0.6,
            mean_length=31.2,
            episodes=10,
            seconds=4.1,
        ),
        FinishedEvent(step=20),
        StageEvent(step=20, stage="writing"),
        {"step": 20, "loss": 0.3, "grad_norm": 0.5, "lr": 1e-6, "skipped": 0.0},  # a plain dict, no kind
    ]


def test_local_train_notes_each_kind_and_passes_over_an_unknown_one() -> None:
    progress = _TrainingProgress(20, Path("/runs/one"), json_lines=False)
    shown = io.StringIO()
    progress.report = ProgressReport("training", 20, stream=shown, every=0, clock=lambda: 0.0)
    for event in local_events():
        progress.on_event(event)
    progress.close()
    assert shown.getvalue().splitlines() == [
        "reading lerobot/pusht at v2.1 (commit 1a2b3c4d), LeRobot v2.1, 206 episodes, 25,650 frames",
        "starting from pi05-tiny weights of team/p at v2 (commit abcdef12)",
        "reading a snapshot of postgresql://u:***@h/db (review 240, user 1,200 rows) at /snap",
        "resuming from step 10 (the last checkpoint in /runs/one/checkpoints)",
        "training  step 10/20  - steps/s  0s",
        "training  step 10/20  loss 0.2135 (10-step mean)  grad_norm 0.91  lr 2.4e-06  - steps/s  0s",
        "step 10: 10% of steps skipped (non-finite gradient)",
        "validating the held-out episodes  step 20/20  - steps/s  0s",
        f"step 20: validation: {VALIDATION_LINE}",
        "step 20: closed loop: relay/Dot-v0: success 60% of 10 episodes, mean reward 0.6, mean length "
        "31.2 steps (4.1 s)",
        "writing the output  step 20/20  - steps/s  0s",
        "training  step 20/20  loss 0.3 (10-step mean)  grad_norm 0.5  lr 1e-06  - steps/s  0s",
    ]
    assert progress.window_loss == 0.3
    assert progress.validation == {k: v for k, v in VALIDATION.items() if k != "kind"}


def test_local_train_json_prints_every_event_the_unknown_kind_too(capsys: pytest.CaptureFixture[str]) -> None:
    progress = _TrainingProgress(20, Path("/runs/one"), json_lines=True)
    events = local_events()
    for event in events:
        progress.on_event(event)
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == events
    assert progress.window_loss == 0.3
    assert progress.validation == {k: v for k, v in VALIDATION.items() if k != "kind"}


def test_a_waiting_jobs_stage_is_its_newest_stage_event_until_any_later_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fields = {"id": "ft-1", "status": "running", "step": 20, "steps": 20, "loss": None}
    job = FineTuneJob(fields, client=Client("http://127.0.0.1:9", "unused"))
    answered = api_events()[:6]  # up to the finished event, the unknown kind among them

    def events(after: int | None = None) -> list[Event]:
        return [event for event in answered if after is None or event.id > after]

    monkeypatch.setattr(job, "events", events)
    watch = _StageWatch(job)
    assert watch.now() is None
    answered.append(api_events()[6])  # stage: writing
    assert watch.now() == "writing the output" and watch.now() == "writing the output"
    answered.append(Event.from_api({"id": 8, **UNKNOWN}))
    assert watch.now() is None  # a later event ends the stage, one of a kind unknown here too


def test_a_jobs_evaluations_pass_over_an_unknown_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {"id": "ft-1", "status": "completed", "step": 20, "steps": 20, "loss": None}
    job = FineTuneJob(fields, client=Client("http://127.0.0.1:9", "unused"))
    evaluation = {"step": 20, "event": "eval", "env": "relay/Dot-v0", "success_rate": 0.6, "mean_reward": 0.6}
    answered = [
        *api_events(),
        Event.from_api({"id": 8, **evaluation, "mean_length": 31.2, "episodes": 10, "seconds": 4.1}),
    ]
    monkeypatch.setattr(job, "events", lambda after=None: answered)
    assert [(e.env, e.step, e.success_rate) for e in job.evaluations()] == [("relay/Dot-v0", 20, 0.6)]
