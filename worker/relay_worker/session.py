"""Host one training session: claim it, load the model, run its calls in order until it ends.

A session holds this worker process (one GPU) for its life. The lease keeper renews the claim
every `heartbeat_seconds` and learns from the row whether the client asked to close or has been
silent for `session_idle_seconds`; the loop takes the next call from the channel, runs it on the
engine's TrainingSession and leaves the result, until a close call, a close request with no calls
left, the idle timeout, a lost claim or the worker's shutdown.

A call that fails on the user's input (EngineError, a bad name or setting, a malformed body) gets a
"user" error for its own result and the session goes on; any other failure is a "server" error,
logged with its request id, and the session goes on too (the user decides whether to continue).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from sqlalchemy import select

from relay.errors import ConfigError
from relay.training import status as st
from relay.training import types, wire
from relay.training.config import check_name, state_address, with_current_names
from relay_api.channel import ChannelUnavailable, QueuedCall, WorkerChannel, worker_channel
from relay_api.db import utcnow, worker_session_factory
from relay_api.models import training_sessions
from relay_api.settings import Settings, get_settings
from relay_engine.core.session import Session
from relay_engine.errors import EngineError
from relay_engine.families import family_for
from relay_worker import session_lifecycle as lifecycle
from relay_worker import shutdown
from relay_worker.fine_tune import completed_output, worker_name
from relay_worker.leases import LeaseRenewer
from relay_worker.session_lifecycle import SessionClaim

CLOSED_BY_CLIENT = "closed by its client"
log = logging.getLogger("relay_worker")
T = TypeVar("T")

USER_ERRORS = (EngineError, ConfigError, wire.WireError)

# A call's arrays are read straight from its body, read-only: the engine only reads them (frames
# become new float tensors), so the copy that would make them writable is not worth 10 MB a batch.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
WAIT_FOR_CALL_SECONDS = 0.5  # how often the loop looks up from an empty channel
CHANNEL_PATIENCE_SECONDS = 60.0  # how long a session rides out Redis (or the database) being away


class SessionKeeper(LeaseRenewer[lifecycle.SessionState]):
    """Renews the session's lease and notes why it should end: closed, idle, lost."""

    def __init__(self, settings: Settings, claim: SessionClaim) -> None:
        super().__init__(settings, claim.session_id, "session")
        self.claim = claim
        self.db_sessions = worker_session_factory(settings)
        self.close_requested = False
        self.last_contact: dt.datetime = utcnow()
        self.counts = lifecycle.SessionCounts()  # the host counts, the keeper reports

    def renew(self) -> lifecycle.SessionState:
        return lifecycle.renew(self.db_sessions, self.settings, self.claim, self.counts)

    def took(self, state: lifecycle.SessionState) -> None:
        self.close_requested = state.close_requested
        self.last_contact = state.last_contact_at

    def idle_for(self) -> float:
        return (utcnow() - self.last_contact).total_seconds()


def run_session(session_id: str, settings: Settings | None = None) -> str:
    """Host the session if this delivery can claim it; returns what happened, for the task's log."""
    settings = settings or get_settings()
    db_sessions = worker_session_factory(settings)
    claim = lifecycle.claim(db_sessions, settings, session_id, worker_name())
    if claim is None:
        return "not claimed: the session is taken or ended"
    keeper = SessionKeeper(settings, claim)
    keeper.start()
    channel = worker_channel(settings)
    status, reason = st.ERROR, "the worker failed unexpectedly"
    try:
        status, reason = _host(settings, db_sessions, claim, keeper, channel)
        return f"{status}: {reason}"
    except Exception as error:
        log.exception("session %s failed", session_id)
        reason = f"the worker failed: {type(error).__name__}: {error}"
        raise
    finally:
        keeper.stop()
        with contextlib.suppress(Exception):
            channel.clear(session_id)
        # A session its client closed ended as it should: its `error` stays empty.
        lifecycle.end(
            db_sessions, claim, status, None if reason == CLOSED_BY_CLIENT else reason, keeper.counts
        )
        channel.close()
        log.info("session %s ended %s: %s", session_id, status, reason)


def _host(
    settings: Settings, db_sessions: Any, claim: SessionClaim, keeper: SessionKeeper, channel: WorkerChannel
) -> tuple[str, str]:
    config = with_current_names(claim.config)
    log.info("session %s: loading %s (%s)", claim.session_id, config["base_model"], config["finetune"])
    try:
        # A completed fine-tune's id: its output directory, for the engine to load.
        owner = select(training_sessions.c.user_id).where(training_sessions.c.id == claim.session_id)
        config["checkpoint_output"] = completed_output(
            db_sessions, owner.scalar_subquery(), config.get("from_checkpoint"), "this session's owner"
        )
        training = open_session(config, device="cuda" if torch.cuda.is_available() else "cpu")
    except EngineError as error:
        return st.ERROR, f"could not load the model: {error}"
    if not lifecycle.mark_ready(db_sessions, settings, claim, training.info):
        return st.CLOSED, "closed before it was ready"
    keeper.last_contact = utcnow()  # the idle clock starts now; loading was not the client's silence
    log.info("session %s: ready (%s)", claim.session_id, training.info)
    host = SessionHost(training, settings, claim, keeper.counts)
    opened = time.perf_counter()
    try:
        return host.serve(keeper, channel)
    finally:
        log.info(
            "session %s: %d calls in %.1f s of %.1f s open",
            claim.session_id,
            host.calls_run,
            host.seconds_running,
            time.perf_counter() - opened,
        )


def open_session(config: dict[str, Any], device: str) -> Session[Any]:
    """The session's model, loaded by the family of its base model (relay_engine.families)."""
    return family_for(config["base_model"]).open_session(config, device=device)


class SessionHost:
    """Runs a session's calls on its model's session (pi05 or RT-J)."""

    def __init__(
        self,
        training: Session[Any],
        settings: Settings,
        claim: SessionClaim,
        counts: lifecycle.SessionCounts | None = None,
    ) -> None:
        self.training = training
        self.counts = counts or lifecycle.SessionCounts()
        self.settings = settings
        self.claim = claim
        self.user_dir = settings.user_dir(claim.user_id)
        self.handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
            "forward_backward": self._forward_backward,
            "forward": self._forward,
            "forward_custom": self._forward_custom,
            "backward_custom": self._backward_custom,
            "discard_custom": self._discard_custom,
            "optim_step": self._optim_step,
            "sample": self._sample,
            "save_weights": self._save_weights,
            "save_state": self._save_state,
            "load_state": self._load_state,
        }
        self.calls_run = 0
        self.seconds_running = 0.0  # in calls, as against waiting for them

    def serve(self, keeper: SessionKeeper, channel: WorkerChannel) -> tuple[str, str]:
        """Run calls in order until the session should end; returns (status, why)."""
        session_id = self.claim.session_id
        idle_limit = self.settings.session_idle_seconds
        after = 0
        while True:
            if keeper.lost:
                return st.ERROR, "the worker lost its claim on the session (its lease lapsed)"
            if shutdown.under_way():
                return st.ERROR, "its worker shut down; what was not saved is lost"
            if keeper.idle_for() > idle_limit:
                return (
                    st.CLOSED,
                    f"no contact from its client for {idle_limit:.0f} s; what was not saved is lost",
                )
            call = _patiently(partial(channel.next_call, session_id, after, WAIT_FOR_CALL_SECONDS))
            if call is None:
                if keeper.close_requested:
                    return st.CLOSED, CLOSED_BY_CLIENT
                continue
            after = call.seq
            payload, ended = self.run_call(call)
            _patiently(partial(channel.put_result, session_id, call.seq, payload))
            if ended:
                return st.CLOSED, CLOSED_BY_CLIENT

    def run_call(self, call: QueuedCall) -> tuple[bytes, bool]:
        """The call's result as wire bytes, and whether it closed the session."""
        started = time.perf_counter()
        try:
            return self._run_call(call)
        finally:
            self.calls_run += 1
            self.counts.calls += 1
            self.seconds_running += time.perf_counter() - started

    def _run_call(self, call: QueuedCall) -> tuple[bytes, bool]:
        started = time.perf_counter()
        op = "?"
        try:
            request = wire.decode(call.payload)
            if not isinstance(request, dict):
                raise wire.WireError("a call must be an object with an op")
            op = str(request.get("op"))
            if op == "close":
                return self._ok(call, None), True
            handler = self.handlers.get(op)
            if handler is None:
                raise wire.WireError(f"unknown op {op!r}; known: close, {', '.join(self.handlers)}")
            value = handler(request)
            log.debug(
                "session %s call %d %s: %.1f ms",
                self.claim.session_id,
                call.seq,
                op,
                (time.perf_counter() - started) * 1000,
            )
            return self._ok(call, value), False
        except USER_ERRORS as error:
            return self._error(call, "user", str(error)), False
        except Exception as error:
            log.exception(
                "session %s call %d (%s, request %s) failed",
                self.claim.session_id,
                call.seq,
                op,
                call.request_id,
            )
            return self._error(call, "server", f"{type(error).__name__}: {error}"), False

    @staticmethod
    def _ok(call: QueuedCall, value: Any) -> bytes:
        return wire.encode({"ok": True, "request_id": call.request_id, "value": value})

    @staticmethod
    def _error(call: QueuedCall, category: str, message: str) -> bytes:
        body = {
            "ok": False,
            "request_id": call.request_id,
            "error": {"message": message, "category": category},
        }
        return wire.encode(body)

    # -- the calls ----------------------------------------------------------------------------------

    def _forward_backward(self, request: dict[str, Any]) -> Any:
        built_in = self.training.loss_fn
        if request.get("loss_fn", built_in) != built_in:
            raise ConfigError(
                f"bad loss_fn: {request.get('loss_fn')!r} (this session's built-in loss is {built_in!r})"
            )
        return self.training.forward_backward(_datums(request))

    def _forward(self, request: dict[str, Any]) -> Any:
        return self.training.forward(_datums(request))

    def _forward_custom(self, request: dict[str, Any]) -> Any:
        return self.training.forward_custom(_datums(request))

    def _backward_custom(self, request: dict[str, Any]) -> Any:
        grad = request.get("grad")
        if not isinstance(grad, np.ndarray):
            raise ConfigError("backward_custom needs grad, the gradient of the loss with respect to velocity")
        metrics = {str(k): float(v) for k, v in dict(request.get("metrics") or {}).items()}
        return self.training.backward_custom(grad, float(request.get("loss", 0.0)), metrics)

    def _discard_custom(self, request: dict[str, Any]) -> None:
        # The client's loss function failed: drop the forward pass waiting for its gradient.
        self.training.discard_custom()

    def _optim_step(self, request: dict[str, Any]) -> Any:
        adam = request.get("adam")
        if not isinstance(adam, dict):
            raise ConfigError("optim_step needs adam: the AdamParams' fields")
        try:
            params = types.AdamParams(**adam)
        except TypeError as error:
            raise ConfigError(f"bad adam: {error}") from None
        result = self.training.optim_step(params)
        self.counts.steps += 1
        return result

    def _sample(self, request: dict[str, Any]) -> Any:
        observations = request.get("observations")
        if not isinstance(observations, list):
            raise ConfigError("sample needs observations: a list of observations")
        num_steps = request.get("num_steps", 10)
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ConfigError(f"bad num_steps: {num_steps!r} (must be an integer >= 1)")
        sampler = request.get("sampler")
        if sampler is not None:
            check_name(sampler, "sampler")
        return self.training.sample(observations, num_steps=num_steps, sampler=sampler)

    def _save_weights(self, request: dict[str, Any]) -> Any:
        name = check_name(request.get("name"), "name")
        directory = self.user_dir / "sessions" / self.claim.session_id / "weights" / name
        directory.parent.mkdir(parents=True, exist_ok=True)
        self.training.save_weights(name, directory)
        return {"name": name, "path": str(directory)}

    def _save_state(self, request: dict[str, Any]) -> Any:
        name = check_name(request.get("name"), "name")
        directory = self._state_dir(name)
        directory.parent.mkdir(parents=True, exist_ok=True)
        self.training.save_state(directory)
        self.counts.saved_states += 1
        return {"name": name, "path": state_address(name)}

    def _load_state(self, request: dict[str, Any]) -> Any:
        name = check_name(request.get("name"), "name")
        directory = self._state_dir(name)
        self.training.load_state(directory, name)
        return {"name": name, "path": state_address(name)}

    def _state_dir(self, name: str) -> Path:
        return self.user_dir / "states" / name


def _datums(request: dict[str, Any]) -> list[dict[str, Any]]:
    datums = request.get("datums")
    if not isinstance(datums, list):
        raise ConfigError("the call needs datums: a list of datums")
    for index, datum in enumerate(datums):
        if not isinstance(datum, dict):
            raise ConfigError(
                f"datum {index}: must be an object with observation, actions and weight "
                "(for rt-j: context, label and weight)"
            )
    return datums


def _patiently(operation: Callable[[], T]) -> T:
    """Run a channel operation, trying again while the channel is unreachable (a Redis restart)."""
    waited, delay = 0.0, 0.2
    while True:
        try:
            return operation()
        except ChannelUnavailable as error:
            if waited >= CHANNEL_PATIENCE_SECONDS:
                raise
            log.warning("the session channel is unavailable (%s); trying again in %.1f s", error, delay)
            time.sleep(delay)
            waited, delay = waited + delay, min(delay * 2, 5.0)
