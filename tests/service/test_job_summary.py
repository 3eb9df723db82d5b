"""The results card's figures (relay_api.job_summary.summarize) from a job row and event rows as the
database holds them: pace and ETA, the training loss, checkpoints beside their figures, why a job
has no metrics yet, the validation and evaluation slots, and the "use this model" block.
(test_jobs.py checks the same card through the real API against a real job's events.)"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from relay.events import checkpoint_dir
from relay.sft.summary import FineTuneSummary, model_use
from relay_api.job_summary import summarize

START = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return START + dt.timedelta(seconds=seconds)


def job(status: str = "running", step: int = 0, steps: int = 100, **row: Any) -> dict[str, Any]:
    config = {"model": "pi05-tiny", "dataset_name": "/data/dots", "steps": steps, "batch_size": 4}
    return {
        "id": "ft-0123456789ab",
        "status": status,
        "step": step,
        "config": config,
        "created_at": at(-5),
        "started_at": at(0) if status != "queued" else None,
        "finished_at": None,
        "dataset": None,
        **row,
    }


class Events:
    """Event rows, oldest first, as fine_tune_events holds them."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, step: int, kind: str, written: float | None = None, **data: Any) -> Events:
        """An event row, written `written` seconds after the start (default: its index)."""
        self.rows.append(
            {
                "id": len(self.rows) + 1,
                "created_at": at(len(self.rows) if written is None else written),
                "step": step,
                "kind": kind,
                "data": data,
            }
        )
        return self

    def metrics(
        self, step: int, loss: float, rate: float, written: float | None = None, **data: Any
    ) -> Events:
        window = {"loss": loss, "grad_norm": 1.0, "lr": 1e-3, "steps_per_second": rate}
        return self.add(step, "metrics", written, **window, **data)


def card(row: dict[str, Any], events: Events, work_dir: Path, now: float = 60) -> FineTuneSummary:
    return summarize(row, events.rows, work_dir, at(now))


def test_a_running_job_has_its_pace_eta_losses_and_checkpoints(tmp_path: Path) -> None:
    events = (
        Events()
        .add(0, "dataset", 1, path="/data/dots", frames=100, episodes=4)
        .metrics(10, 0.9, rate=2.0, written=10, samples_per_second=8.0)
        .metrics(20, 0.5, rate=4.0, written=20, samples_per_second=16.0)
        .add(20, "checkpoint", 25, seconds=0.25)
        .metrics(30, 0.7, rate=5.0, written=40, samples_per_second=20.0)
    )
    kept = tmp_path / "checkpoints" / checkpoint_dir(20)
    kept.mkdir(parents=True)
    (kept / "manifest.json").write_text("{}")
    shown = card(job(step=30), events, tmp_path)

    assert (shown.step, shown.steps, shown.progress) == (30, 100, 0.3)
    assert (shown.queued_seconds, shown.elapsed_seconds, shown.duration_seconds) == (5.0, 60.0, None)
    # 30 steps in 5 + 2.5 + 2 seconds of compute (the engine's windows).
    assert shown.steps_per_second == pytest.approx(30 / 9.5)
    assert shown.samples_per_second == pytest.approx(4 * 30 / 9.5)
    # The ETA at the recent pace: the wall clock between the reports of the last minute, the
    # checkpoint's write included (steps 10 to 30 in 30 s), not the last window's compute (5/s).
    assert shown.latest_steps_per_second == pytest.approx(20 / 30)
    assert shown.eta_seconds == 105.0
    assert shown.loss.first is not None and (shown.loss.first.step, shown.loss.first.loss) == (10, 0.9)
    assert shown.loss.best is not None and (shown.loss.best.step, shown.loss.best.loss) == (20, 0.5)
    assert shown.loss.last is not None and (shown.loss.last.step, shown.loss.last.loss) == (30, 0.7)
    assert shown.metrics_note is None
    [checkpoint] = shown.checkpoints
    assert checkpoint.path == "checkpoints/step-00000020" and checkpoint.kept
    assert (checkpoint.metrics_step, checkpoint.loss, checkpoint.seconds) == (20, 0.5, 0.25)
    assert shown.validation is None and shown.eval is None
    assert not shown.use.ready and shown.use.note == "the output is written when the job completes"


def test_the_eta_pace_is_the_last_minutes(tmp_path: Path) -> None:
    """Reports older than a minute before the latest are out of the pace (a slow start, a long
    validation long ago); with only the latest within the minute, the latest two make it."""
    events = Events().metrics(10, 0.9, 1.0, written=0).metrics(20, 0.8, 1.0, written=100)
    events.metrics(30, 0.7, 1.0, written=130).metrics(40, 0.6, 1.0, written=150)
    shown = card(job(step=40), events, tmp_path, now=150)
    assert shown.latest_steps_per_second == pytest.approx(20 / 50)
    assert shown.eta_seconds == pytest.approx(60 / 0.4)
    first = Events().metrics(10, 0.9, 2.5, written=30)  # one report: its window's own pace
    assert card(job(step=10), first, tmp_path, now=30).latest_steps_per_second == 2.5
    sparse = Events().metrics(10, 0.9, 1.0, written=0).metrics(20, 0.8, 1.0, written=200)
    assert card(job(step=20), sparse, tmp_path, now=200).latest_steps_per_second == pytest.approx(0.05)


def test_an_ended_job_has_a_duration_and_no_eta(tmp_path: Path) -> None:
    events = Events().metrics(10, 0.4, rate=2.0).add(10, "checkpoint").add(10, "finished")
    shown = card(job("completed", step=10, steps=10, finished_at=at(42)), events, tmp_path, now=1000)
    assert (shown.duration_seconds, shown.elapsed_seconds, shown.eta_seconds) == (42.0, 42.0, None)
    assert shown.checkpoints[0].kept is False  # its files are gone (or were never on this disk)
    assert shown.use.ready and shown.use.note is None


def test_a_resumed_attempt_counts_only_its_own_windows(tmp_path: Path) -> None:
    # The lost attempt's events after its checkpoint at 20 never reached the database; the resumed
    # attempt's first window is steps 21-30, not 21-40.
    events = (
        Events()
        .metrics(10, 0.9, rate=1.0)
        .metrics(20, 0.8, rate=1.0)
        .add(20, "checkpoint")
        .add(20, "resumed:2", attempt=2)
        .metrics(40, 0.6, rate=10.0)
    )
    shown = card(job(step=40), events, tmp_path)
    assert shown.steps_per_second == pytest.approx(30 / 21)
    # A checkpoint at a step between windows takes the latest window before it.
    events.add(35, "checkpoint")
    assert [(c.step, c.metrics_step, c.loss) for c in card(job(step=40), events, tmp_path).checkpoints] == [
        (20, 20, 0.8),
        (35, 20, 0.8),
    ]


@pytest.mark.parametrize(
    ("row", "note"),
    [
        (job("queued"), "no metrics yet: the job is queued, waiting for a worker"),
        (job(), "no metrics yet: the worker is loading the model and the data; the first come at step 10"),
        (
            job(dataset={"path": "/data/dots"}),
            "no metrics yet: training has started; the first come at step 10",
        ),
        (
            job(steps=5, dataset={"path": "/d"}),
            "no metrics yet: training has started; the first come at step 5",
        ),
        (job("cancelled", started_at=None), "no metrics: the job was cancelled while it was queued"),
        (job("cancelled"), "no metrics: the job was cancelled before its first metrics (step 10)"),
        (job("error"), "no metrics: the job failed before its first metrics (step 10); its error says why"),
    ],
)
def test_a_job_without_metrics_says_why(row: dict[str, Any], note: str, tmp_path: Path) -> None:
    shown = card(row, Events(), tmp_path)
    assert shown.metrics_note == note
    assert shown.loss.first is None and shown.steps_per_second is None and shown.eta_seconds is None


def test_validation_and_evaluation_events_fill_their_slots(tmp_path: Path) -> None:
    # Step 10's mean of chunks is nearer the data, step 20's single chunks are (they spread less):
    # the best is the headline's, the mean of the chunks.
    scores_10 = {"mean_action_mse": 0.02, "action_spread": 0.01, "action_mse": 0.03, "chunks": 4}
    scores_20 = {"mean_action_mse": 0.025, "action_spread": 0.003, "action_mse": 0.028, "chunks": 4}
    events = (
        Events()
        .metrics(10, 0.9, rate=1.0)
        .add(10, "checkpoint")
        .add(10, "validation", **scores_10, blind_mse=0.03, loss=0.5)
        .add(10, "eval", success_rate=0.4, episodes=20)
        .metrics(20, 0.8, rate=1.0)
        .add(20, "checkpoint")
        .add(20, "validation", **scores_20, blind_mse=0.03)
        .add(20, "eval", success_rate=0.55)
    )
    shown = card(job(step=20), events, tmp_path)
    assert shown.validation is not None and shown.eval is not None
    assert shown.validation.scored == 2 and shown.eval.evaluated == 2
    best, last = shown.validation.best, shown.validation.last
    assert (best.step, best.mean_action_mse, best.action_spread, best.action_mse) == (10, 0.02, 0.01, 0.03)
    assert best.model_dump()["loss"] == 0.5  # figures it does not name ride along
    assert (last.step, last.mean_action_mse, last.chunks) == (20, 0.025, 4)
    assert shown.eval.best is not None and shown.eval.last is not None
    assert (shown.eval.best.step, shown.eval.best.success_rate) == (20, 0.55)
    assert [c.validation.mean_action_mse if c.validation else None for c in shown.checkpoints] == [
        0.02,
        0.025,
    ]
    assert [c.eval.success_rate if c.eval else None for c in shown.checkpoints] == [0.4, 0.55]


def test_validation_events_from_before_the_mean_of_chunks_are_ranked_by_their_one_chunk(
    tmp_path: Path,
) -> None:
    events = (
        Events()
        .metrics(10, 0.9, rate=1.0)
        .add(10, "validation", action_mse=0.02, blind_mse=0.03)
        .metrics(20, 0.8, rate=1.0)
        .add(20, "validation", action_mse=0.025, blind_mse=0.03)
    )
    shown = card(job(step=20), events, tmp_path)
    assert shown.validation is not None
    assert (shown.validation.best.step, shown.validation.best.action_mse) == (10, 0.02)
    assert shown.validation.best.mean_action_mse is None and shown.validation.last.step == 20


def test_use_this_model_names_the_job() -> None:
    pi05 = model_use("ft-0123456789ab", "pi05", "lerobot/pusht_image", "completed")
    assert pi05.download == "relay fine-tunes download ft-0123456789ab --dir ft-0123456789ab"
    assert 'retrieve("ft-0123456789ab").download("ft-0123456789ab")' in pi05.python
    assert pi05.lerobot is not None and 'PI05Policy.from_pretrained("ft-0123456789ab")' in pi05.lerobot
    assert "relay local eval --model ft-0123456789ab --dataset lerobot/pusht_image" in pi05.deploy
    tiny = model_use("ft-0123456789ab", "pi05-tiny", "/data/dots", "running")
    assert tiny.lerobot is None and tiny.lerobot_note is not None and "pi05-tiny" in tiny.lerobot_note
    relational = model_use("ft-0123456789ab", "rt-j-tiny", "/data/shop", "completed", task="user-churn")
    assert 'RelationalTransformer("ft-0123456789ab")' in relational.python
    assert "--task user-churn" in relational.deploy and relational.lerobot is None
