"""relay.events: the typed events and the recipe's result, and their wire form."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from relay.events import (
    EVENT_KINDS,
    CheckpointEvent,
    DatasetEvent,
    ErrorEvent,
    FinishedEvent,
    MetricsEvent,
    RecipeResult,
    ResumedEvent,
    RetryEvent,
    dataset_line,
    event_line,
    parse_event,
)
from relay.sft.job import Event


def test_a_metrics_event_keeps_its_figures_at_the_top_level_and_adds_its_kind_on_the_wire() -> None:
    event = MetricsEvent(step=10, loss=0.21, grad_norm=0.9, lr=2.4e-6, skipped=0.0)
    assert event == {"step": 10, "loss": 0.21, "grad_norm": 0.9, "lr": 2.4e-6, "skipped": 0.0}
    assert event.loss == 0.21 and event.kind == "metrics"
    assert event.gpu_memory_bytes is None  # not measured: left out, and read as None
    assert json.loads(event_line(event)) == {**event, "kind": "metrics"}


def test_a_named_event_keeps_its_event_key() -> None:
    assert CheckpointEvent(step=20, seconds=1.5) == {"step": 20, "event": "checkpoint", "seconds": 1.5}
    assert FinishedEvent(step=25) == {"step": 25, "event": "finished"}
    assert ResumedEvent.of_attempt(10, 0) == {"step": 10, "event": "resumed"}  # a local run
    assert ResumedEvent.of_attempt(10, 2).attempt == 2


def test_events_parse_back_with_or_without_their_kind() -> None:
    for event in (
        MetricsEvent(step=10, loss=None, grad_norm=None, lr=1e-4, skipped=1.0),
        RetryEvent(step=3, attempt=2, reason="its worker shut down"),
        ErrorEvent(step=5, message="bad dataset"),
    ):
        wire = json.loads(event_line(event))
        assert type(parse_event(wire)) is type(event) and parse_event(wire) == event
        old_row = {key: value for key, value in wire.items() if key != "kind"}
        assert type(parse_event(old_row)) is type(event)


def test_non_finite_numbers_become_null_and_bad_fields_are_refused() -> None:
    assert MetricsEvent(step=1, loss=math.nan, grad_norm=math.inf, lr=1.0, skipped=0.0).loss is None
    with pytest.raises(ValueError, match="retry"):
        RetryEvent(step=1, attempt="second", reason="x")
    with pytest.raises(ValueError, match="unknown event kind"):
        parse_event({"step": 1, "event": "teleported"})


def test_every_kind_is_in_the_union() -> None:
    assert set(EVENT_KINDS) == {
        "metrics",
        "checkpoint",
        "resumed",
        "retry",
        "cancelled",
        "finished",
        "error",
        "dataset",
        "weights",
        "snapshot",
        "validation",
        "eval",
        "stage",
        "tracker",
        "pushed",
    }


def test_a_dataset_event_says_what_was_read_in_one_line() -> None:
    hub = DatasetEvent(
        step=0,
        repo="lerobot/pusht_image",
        path=None,
        revision="v2.1",
        sha="1a2b3c4d5e6f",
        format="v2.1",
        frames=25650,
        episodes=206,
    )
    assert (
        hub.describe()
        == "lerobot/pusht_image at v2.1 (commit 1a2b3c4d), LeRobot v2.1, 206 episodes, 25,650 frames"
    )
    wire = json.loads(event_line(hub))
    assert wire["kind"] == "dataset" and parse_event(wire) == hub and type(parse_event(wire)) is DatasetEvent
    local = DatasetEvent(step=4, path="/data/robot", format=None, frames=10, episodes=1)
    assert dataset_line(local) == "/data/robot, no codebase_version, 1 episodes, 10 frames"
    with pytest.raises(ValueError, match="dataset"):
        DatasetEvent(step=0, repo="x", frames="many", episodes=1)


def test_the_sdks_events_stay_dicts_and_give_their_typed_form() -> None:
    answer = {"id": 7, "object": "fine_tune.event", "created_at": "2026-01-01T00:00:00Z", "step": 20}
    event = Event.from_api({**answer, "event": "checkpoint", "seconds": 2.0, "kind": "checkpoint"})
    assert event == {"step": 20, "event": "checkpoint", "seconds": 2.0} and event.id == 7
    assert event.kind == "checkpoint" and isinstance(event.typed, CheckpointEvent)
    metrics = Event.from_api({**answer, "loss": 0.5, "grad_norm": 1.0, "lr": 1e-5, "skipped": 0.0})
    assert metrics.kind == "metrics" and metrics.typed.loss == 0.5


def test_a_recipe_result_crosses_a_process_as_json() -> None:
    result = RecipeResult("completed", 20, 0.25, Path("/tmp/out"), 10, {"processes": 2, "strategy": "ddp"})
    assert RecipeResult.from_json(result.to_json()) == result
    stopped = RecipeResult("stopped", 4, None, None)
    assert RecipeResult.from_json(stopped.to_json()) == stopped
