"""Run one recipe job: claim it, keep the lease, run the engine, write events and the end.

The engine's `on_event` writes each event as this attempt (refused once a newer attempt owns the
job, which stops the engine); `should_stop` reads the cancel flag that the lease keeper refreshes.
A user's mistake (EngineError, DatasetError) ends the job in `error` with the engine's message; any
other failure gives the job back for another attempt, which resumes from the last checkpoint.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
from pathlib import Path
from typing import Any

from relay_api.db import session_factory
from relay_api.files import output_manifest
from relay_api.settings import Settings, get_settings
from relay_engine.errors import EngineError
from relay_engine.recipe import Recipe, RecipeResult, run_recipe
from relay_engine.training.checkpoint import CheckpointStore
from relay_worker import lifecycle, shutdown
from relay_worker.launched import run_on_processes
from relay_worker.lifecycle import Claim, FencedOut

log = logging.getLogger("relay_worker")


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaseKeeper(threading.Thread):
    """Renews the claim's lease every `heartbeat_seconds` and notes a cancel or a lost claim."""

    def __init__(self, settings: Settings, claim: Claim) -> None:
        super().__init__(name=f"lease-{claim.job_id}", daemon=True)
        self.settings = settings
        self.claim = claim
        self.sessions = session_factory(settings)
        self.cancel_requested = False
        self.lost = False
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self.settings.heartbeat_seconds):
            try:
                self.note(lifecycle.renew(self.sessions, self.settings, self.claim))
            except FencedOut:
                self.lost = True
                return
            except Exception:  # the database is away; the lease may lapse, and fencing keeps us honest
                log.warning("could not renew the lease of %s", self.claim.job_id, exc_info=True)

    def note(self, state: lifecycle.JobState) -> None:
        if state.cancel_requested:
            self.cancel_requested = True

    def should_stop(self) -> bool:
        return self.cancel_requested or self.lost or shutdown.under_way()

    def stop(self) -> None:
        self._stopping.set()


def run_fine_tune(job_id: str, settings: Settings | None = None) -> str:
    """Run the job if this delivery can claim it; returns what happened, for the task's log."""
    settings = settings or get_settings()
    sessions = session_factory(settings)
    claim = lifecycle.claim(sessions, settings, job_id, worker_name())
    if claim is None:
        return "not claimed: the job is taken, ended, or out of attempts"
    log.info("%s: attempt %d starts at step %d", job_id, claim.attempt, claim.step)
    keeper = LeaseKeeper(settings, claim)
    keeper.start()
    try:
        return _train(settings, sessions, claim, keeper)
    except FencedOut:
        log.warning("%s: attempt %d no longer owns the job; stopping", job_id, claim.attempt)
        return "fenced out"
    finally:
        keeper.stop()


def _train(settings: Settings, sessions: Any, claim: Claim, keeper: LeaseKeeper) -> str:
    work_dir = settings.job_dir(claim.job_id)
    work_dir.mkdir(parents=True, exist_ok=True)

    def on_event(event: dict[str, Any]) -> None:
        keeper.note(lifecycle.record_event(sessions, settings, claim, _plain(event)))

    if claim.attempt > 1:
        resumed_from = _last_checkpoint_step(work_dir)
        if resumed_from is not None:
            on_event({"step": resumed_from, "event": "resumed", "attempt": claim.attempt})
    try:
        recipe = Recipe.from_config(claim.config, checkpoint_every=settings.checkpoint_every)
        processes = int(claim.config.get("gpus") or 1)
        if processes > 1:
            outcome = run_on_processes(
                recipe, processes, work_dir, settings.dataset_cache_dir, on_event, keeper.should_stop
            )
            result = RecipeResult(
                outcome["status"],
                outcome["step"],
                outcome["loss"],
                outcome["output_dir"],
                outcome["resumed_from"],
            )
        else:
            result = run_recipe(
                recipe,
                work_dir,
                on_event=on_event,
                should_stop=keeper.should_stop,
                dataset_cache_dir=settings.dataset_cache_dir,
            )
    except FencedOut:
        raise
    except EngineError as error:
        log.info("%s: ends in error: %s", claim.job_id, error)
        return lifecycle.fail(sessions, claim, str(error))
    except Exception as error:
        log.exception("%s: attempt %d failed; giving the job back", claim.job_id, claim.attempt)
        lifecycle.release(sessions, claim, f"{type(error).__name__}: {error}")
        return "given back"

    if keeper.lost:
        raise FencedOut(claim.job_id)
    if result.status == "completed":
        assert result.output_dir is not None
        files = output_manifest(work_dir, Path(result.output_dir))
        loss = _finite(result.loss)
        return lifecycle.complete(sessions, claim, result.step, loss, str(result.output_dir), files)
    if keeper.cancel_requested:
        return lifecycle.cancelled(sessions, claim, result.step)
    lifecycle.hand_back(sessions, claim)
    log.info("%s: stopped at step %d for the worker's shutdown; given back", claim.job_id, result.step)
    return "given back"


def _last_checkpoint_step(work_dir: Path) -> int | None:
    """The step of the checkpoint the engine will resume from, for the `resumed` event."""
    try:
        store = CheckpointStore(work_dir / "checkpoints")
        latest = store.latest()
        return None if latest is None else int(store.manifest(latest)["step"])  # type: ignore[call-overload]
    except Exception:  # the engine decides about odd checkpoint dirs; this is only a report
        return None


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _plain(event: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready values: numbers as Python numbers, a non-finite number as null."""
    plain: dict[str, Any] = {}
    for key, value in event.items():
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        plain[key] = value
    return plain
