"""ServiceClient, TrainingClient and SamplingClient: a training loop that runs each step on a GPU.

examples/session_loop.py is a whole training loop over these clients, flat in one file: data,
schedule, logging, saved states, resuming and a held-out evaluation.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from relay import http_client
from relay.catalog import ACTION_HORIZON, LORA_RANK_DEFAULT, RelationalSessionProblem
from relay.codec import Codec
from relay.errors import APIError, RequestFailedError
from relay.training import types
from relay.training._calls import SESSIONS, CallStream, failed
from relay.training.config import SessionConfig, check_name
from relay.training.futures import APIFuture
from relay.training.status import READY, STARTING

DEFAULT_START_TIMEOUT = 600.0
NUM_STEPS_MAX = 1000
# The built-in losses: pi05's flow matching, and an RT-J session's task loss (BCE or Huber).
LOSS_FNS = ("flow_matching", "task")
STATES = "/v1/states"
SESSIONS_PAGE = 100


class ServiceClient:
    """Relay's training service: starts training sessions, each a GPU with pi0.5 loaded.

    The API and key come from the arguments, else ``RELAY_BASE_URL`` / ``RELAY_API_KEY``, else the
    file ``relay server`` writes. `start_timeout` bounds the wait for a free worker (and, once one
    took the session, for the model to load); `progress` shows a spinner while waiting (default: on
    a terminal).
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        progress: bool | None = None,
    ) -> None:
        self._http = http_client.Client(base_url, api_key)
        self.start_timeout = start_timeout
        self.progress = progress

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = LORA_RANK_DEFAULT,
        targets: list[str] | None = None,
        alpha: float | None = None,
        action_horizon: int = ACTION_HORIZON,
        *,
        codec: Codec = Codec.LOSSLESS,
        from_checkpoint: str | None = None,
    ) -> TrainingClient:
        """A session training LoRA adapters (by default on the action expert); returns once ready.

        `rank` and `alpha` are the session's `lora_rank` and `lora_alpha`; `from_checkpoint` (a Hub
        repo[@revision], a directory or a completed fine-tune's id) starts from those weights."""
        config = SessionConfig(
            base_model=base_model,
            finetune="lora",
            lora_rank=rank,
            targets=targets,
            lora_alpha=alpha,
            action_horizon=action_horizon,
            codec=codec,
            from_checkpoint=from_checkpoint,
        )
        return self._start(config)

    def create_full_training_client(
        self,
        base_model: str,
        targets: list[str] | None = None,
        action_horizon: int = ACTION_HORIZON,
        *,
        codec: Codec = Codec.LOSSLESS,
        problem_type: RelationalSessionProblem | None = None,
        from_checkpoint: str | None = None,
    ) -> TrainingClient:
        """A session training every weight of its targets (by default the whole model); returns once ready.

        For ``rt-j`` / ``rt-j-tiny`` (tuned in full, always): `problem_type` "binary" (the default)
        or "regression" picks the task loss; `targets` and `action_horizon` are pi05's."""
        config = SessionConfig(
            base_model=base_model,
            finetune="full",
            targets=targets,
            action_horizon=action_horizon,
            codec=codec,
            problem_type=problem_type,
            from_checkpoint=from_checkpoint,
        )
        return self._start(config)

    def _start(self, config: SessionConfig) -> TrainingClient:
        body = config.model_dump(mode="json")
        headers = {"idempotency-key": uuid.uuid4().hex}
        session = self._http.request("POST", SESSIONS, json_body=body, headers=headers, retry=True)
        try:
            session = _wait_until_ready(self._http, session, self.start_timeout, self.progress)
        except BaseException:
            self._http.send("POST", f"{SESSIONS}/{session['id']}/close", retry=True)
            raise
        return TrainingClient(self._http, session, Codec(config.codec))

    # -- finding sessions and states again ------------------------------------------------------------

    def list_sessions(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Your sessions as the API shows them, newest first: all of them, or the newest `limit`."""
        sessions: list[dict[str, Any]] = []
        after: str | None = None
        while limit is None or len(sessions) < limit:
            page_size = SESSIONS_PAGE if limit is None else min(SESSIONS_PAGE, limit - len(sessions))
            page = self._http.request("GET", SESSIONS, params={"after": after, "limit": page_size})
            sessions.extend(page["data"])
            if not page.get("has_more") or not page["data"]:
                break
            after = sessions[-1]["id"]
        return sessions

    def retrieve_session(self, session_id: str) -> dict[str, Any]:
        """One session (``"ses-..."``), as the API reports it now."""
        session: dict[str, Any] = self._http.request("GET", f"{SESSIONS}/{session_id}")
        return session

    def close_session(self, session_id: str) -> dict[str, Any]:
        """Close a session from outside its program (its worker is freed once the calls already sent
        have run); closing an ended session again is harmless."""
        session: dict[str, Any] = self._http.request("POST", f"{SESSIONS}/{session_id}/close", retry=True)
        return session

    def list_states(self) -> list[dict[str, Any]]:
        """The states your sessions saved (``save_state``), newest first, with what each belongs to."""
        states: list[dict[str, Any]] = self._http.request("GET", STATES)["data"]
        return states

    def close(self) -> None:
        self._http.close()


# Where a waiting session looks for what holds the workers: your own running jobs and live sessions.
FINE_TUNES = "/v1/fine-tunes"
HOLDERS_LOOKED_AT = 20
HOLDERS_EVERY_SECONDS = 10.0


def _holders(http: http_client.Client, session_id: str) -> str:
    """What of yours holds a worker now ("fine-tune ft-... (running, step 40/1500)"), for the wait
    message; on a shared service other users' work may hold them too, which the API does not show."""
    try:
        jobs = http.request("GET", FINE_TUNES, params={"limit": HOLDERS_LOOKED_AT})["data"]
        sessions = http.request("GET", SESSIONS, params={"limit": HOLDERS_LOOKED_AT})["data"]
    except (APIError, RuntimeError):  # only a message: the wait goes on without it
        return ""
    held = [
        f"fine-tune {j['id']} (running, step {j['step']}/{j['steps']})"
        for j in jobs
        if j["status"] == "running"
    ]
    held += [
        f"session {s['id']} ({s['status']})"
        for s in sessions
        if s["id"] != session_id and s["status"] == READY
    ]
    return (
        f"; held by your {', '.join(held)}" if held else "; none of yours holds one (other users' work may)"
    )


def _wait_until_ready(
    http: http_client.Client, session: dict[str, Any], timeout: float, progress: bool | None
) -> dict[str, Any]:
    """Poll the session until it is ready; raise with what happened if it fails or nobody takes it."""
    show = sys.stderr.isatty() if progress is None else progress
    spinner = _Spinner() if show else None
    phase_started = started = time.monotonic()
    worker = None
    holders, holders_at = "", -HOLDERS_EVERY_SECONDS
    try:
        while session["status"] == STARTING:
            if session.get("worker") != worker:  # a worker took it: the model loads now
                worker, phase_started = session.get("worker"), time.monotonic()
            waited = time.monotonic() - phase_started
            if worker is None and time.monotonic() - holders_at >= HOLDERS_EVERY_SECONDS:
                holders, holders_at = _holders(http, session["id"]), time.monotonic()
                if spinner is None and progress is not False:  # no terminal: a line each look-up
                    print(f"session {session['id']}: waiting for a free worker{holders}", file=sys.stderr)
            if waited > timeout:
                if worker is None:
                    raise TimeoutError(
                        f"no worker took session {session['id']} within {timeout:.0f} s: every worker is "
                        f"busy with other fine-tunes or sessions, or none is running{holders}. Try again "
                        "later, or wait longer with ServiceClient(start_timeout=...)"
                    )
                raise TimeoutError(
                    f"session {session['id']}: {session['base_model']} did not finish loading on {worker} "
                    f"within {timeout:.0f} s"
                )
            if spinner is not None:
                doing = (
                    f"waiting for a free worker{holders}"
                    if worker is None
                    else f"loading {session['base_model']} on {worker}"
                )
                spinner.update(f"session {session['id']}: {doing} ({time.monotonic() - started:.0f} s)")
            time.sleep(min(1.0, 0.1 + waited / 10))
            session = http.request("GET", f"{SESSIONS}/{session['id']}")
    finally:
        if spinner is not None:
            spinner.close()
    if session["status"] != READY:
        raise RuntimeError(
            f"session {session['id']} could not start: {session.get('error') or session['status']}"
        )
    return session


class _Spinner:
    def __init__(self) -> None:
        from rich.console import Console
        from rich.status import Status

        self._status = Status("starting a session", console=Console(stderr=True))
        self._status.start()

    def update(self, text: str) -> None:
        self._status.update(text)

    def close(self) -> None:
        self._status.stop()


class TrainingClient:
    """A session: a GPU with the model loaded, driven one call at a time (docs/sessions.md).

    Every call returns an APIFuture at once; the GPU runs calls in the order they were made.
    ``close()`` (or leaving a ``with`` block) ends the session; what was not saved is lost.
    """

    def __init__(
        self, http: http_client.Client, session: Mapping[str, Any], codec: Codec = Codec.LOSSLESS
    ) -> None:
        self.id: str = session["id"]
        self.info: dict[str, Any] = dict(session["info"])
        self.codec = codec
        idle = float(session.get("idle_timeout_seconds") or 600.0)
        self._calls = CallStream(http, self.id, heartbeat_seconds=min(30.0, idle / 4))
        _open_clients.add(self)

    def __repr__(self) -> str:
        return f"TrainingClient(id={self.id!r}, info={self.info})"

    def __enter__(self) -> TrainingClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        # Leaving normally: the calls made so far run first. Leaving on an error: they are dropped.
        self._close(drain=kind is None)

    def close(self) -> None:
        """End the session once the calls already made have run, and free its GPU."""
        self._close(drain=True)

    def _close(self, drain: bool) -> None:
        self._calls.close(drain=drain)
        _open_clients.discard(self)

    # -- steps ------------------------------------------------------------------------------------

    def forward_backward(
        self, batch: Sequence[types.Datum | types.RelationalDatum], loss_fn: str | None = None
    ) -> APIFuture[types.ForwardBackwardOutput]:
        """The model's loss on `batch` (pi05: flow matching on Datums; rt-j: the task loss on
        RelationalDatums); its gradients add to those accumulated until optim_step."""
        if loss_fn is not None and loss_fn not in LOSS_FNS:
            raise ValueError(
                f"bad loss_fn: {loss_fn!r} (the built-in losses are 'flow_matching' for pi05 and 'task' "
                "for rt-j; for your own, use forward_backward_custom)"
            )
        fields = {} if loss_fn is None else {"loss_fn": loss_fn}
        return self._datums_call("forward_backward", batch, _forward_backward_output, **fields)

    def forward(
        self, batch: Sequence[types.Datum | types.RelationalDatum]
    ) -> APIFuture[dict[str, np.ndarray]]:
        """The model's outputs as numpy arrays, without gradients: pi05's flow-matching outputs
        (velocity, target, x_t, noise, time); rt-j's target_scores and loss per context."""
        return self._datums_call("forward", batch, _arrays)

    def forward_backward_custom(
        self,
        batch: Sequence[types.Datum],
        loss_fn: Callable[[Sequence[types.Datum], dict[str, Any]], tuple[Any, dict[str, Any]]],
    ) -> APIFuture[types.ForwardBackwardOutput]:
        """Your loss, in PyTorch on this machine: the GPU's forward pass sends back velocity (which
        requires grad), target, x_t, noise and time; ``loss_fn(batch, outputs)`` returns
        ``(loss, metrics)``; d(loss)/d(velocity) goes back and is backpropagated through the model.

        Waits for the forward pass, so that calls stay in order. Needs torch
        (``pip install "relay-intelligence[train]"``).
        """
        torch = _require_torch()
        name = "forward_backward_custom"
        with self._calls.order:  # nothing may run between the forward pass and its gradient
            forward = self._datums_call("forward_custom", batch, _arrays, name=name)
            try:
                arrays = forward.result()
            except RequestFailedError as error:
                return failed(name, error, _forward_backward_output)
            outputs = {key: torch.from_numpy(np.array(value)) for key, value in arrays.items()}
            velocity = outputs["velocity"].requires_grad_(True)
            try:
                loss, metrics = loss_fn(batch, outputs)
                (gradient,) = torch.autograd.grad(loss, velocity, allow_unused=True)
                if gradient is None:
                    gradient = torch.zeros_like(velocity)
                message = {
                    "op": "backward_custom",
                    "grad": gradient.detach().float().numpy(),
                    "loss": float(loss.detach()),
                    "metrics": {str(k): _plain_number(k, v) for k, v in dict(metrics or {}).items()},
                }
            except BaseException:
                # The GPU holds the forward pass for its gradient; drop it so the next call runs.
                self._calls.submit("discard_custom", {"op": "discard_custom"}, _nothing)
                raise
            return self._calls.submit(name, message, _forward_backward_output)

    def optim_step(self, adam_params: types.AdamParams) -> APIFuture[types.OptimStepOutput]:
        """An AdamW step with the accumulated gradients, then clear them."""
        if not isinstance(adam_params, types.AdamParams):
            raise TypeError(f"optim_step takes a types.AdamParams, got {type(adam_params).__name__}")
        message = {"op": "optim_step", "adam": adam_params.to_dict()}
        return self._calls.submit(
            "optim_step", message, lambda v: types.OptimStepOutput(metrics=dict(v["metrics"]))
        )

    def sample(
        self, observation: Mapping[str, Any] | Sequence[Mapping[str, Any]], num_steps: int = 10
    ) -> APIFuture[np.ndarray]:
        """Actions for one observation, (action_horizon, 32), or for a list, (N, action_horizon, 32),
        with the weights as they are now."""
        return self._sample(observation, num_steps, None)

    def _sample(
        self,
        observation: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        num_steps: int,
        sampler: str | None,
    ) -> APIFuture[np.ndarray]:
        if (
            isinstance(num_steps, bool)
            or not isinstance(num_steps, int)
            or not 1 <= num_steps <= NUM_STEPS_MAX
        ):
            raise ValueError(f"bad num_steps: {num_steps!r} (must be an integer from 1 to {NUM_STEPS_MAX})")
        single = isinstance(observation, Mapping)
        observations = [observation] if single else list(observation)
        try:
            encoded = [
                types.observation_message(i, o, self.codec, "observation") for i, o in enumerate(observations)
            ]
        except types.DatumError as error:
            return failed("sample", RequestFailedError(str(error), category="user", call="sample"), _nothing)
        message = {"op": "sample", "observations": encoded, "num_steps": num_steps, "sampler": sampler}
        return self._calls.submit("sample", message, (lambda a: np.array(a[0])) if single else np.array)

    # -- saving -----------------------------------------------------------------------------------

    def save_weights_and_get_sampling_client(self, name: str) -> SamplingClient:
        """Save the weights (adapters merged in) as `name` and return a client that samples with
        them however training goes on. Waits for the save."""
        check_name(name, "name")
        saved = self._calls.submit("save_weights", {"op": "save_weights", "name": name}, dict).result()
        return SamplingClient(self, name, str(saved["path"]))

    def save_state(self, name: str) -> APIFuture[types.SaveStateOutput]:
        """Save the trainable weights and the optimizer under your account, as `name` (replacing it)."""
        check_name(name, "name")
        return self._calls.submit(
            "save_state",
            {"op": "save_state", "name": name},
            lambda v: types.SaveStateOutput(name=v["name"], path=v["path"]),
        )

    def load_state(self, name: str) -> APIFuture[types.LoadStateOutput]:
        """Load a state saved by a session of the same model and targets."""
        check_name(name, "name")
        return self._calls.submit(
            "load_state",
            {"op": "load_state", "name": name},
            lambda v: types.LoadStateOutput(name=v["name"], path=v["path"]),
        )

    # -- helpers ----------------------------------------------------------------------------------

    def _datums_call(
        self,
        op: str,
        batch: Sequence[types.Datum | types.RelationalDatum],
        convert: Callable[[Any], Any],
        name: str | None = None,
        **fields: Any,
    ) -> APIFuture[Any]:
        name = name or op
        try:
            datums = types.batch_message(batch, self.codec)
        except types.DatumError as error:
            return failed(name, RequestFailedError(str(error), category="user", call=name), convert)
        return self._calls.submit(name, {"op": op, "datums": datums, **fields}, convert)


class SamplingClient:
    """Samples with weights saved by ``save_weights_and_get_sampling_client``, however training goes
    on. ``path`` is where those weights lie on the service (model.safetensors, adapters merged in).
    It samples through its training session, in order with its calls, so it works while that is open."""

    def __init__(self, training_client: TrainingClient, name: str, path: str) -> None:
        self.name = name
        self.path = path
        self._training = training_client

    def __repr__(self) -> str:
        return f"SamplingClient(name={self.name!r}, path={self.path!r})"

    def sample(
        self, observation: Mapping[str, Any] | Sequence[Mapping[str, Any]], num_steps: int = 10
    ) -> APIFuture[np.ndarray]:
        return self._training._sample(observation, num_steps, self.name)


def _forward_backward_output(value: Mapping[str, Any]) -> types.ForwardBackwardOutput:
    return types.ForwardBackwardOutput(
        metrics=dict(value["metrics"]), loss_fn_outputs=[dict(x) for x in value.get("loss_fn_outputs") or []]
    )


def _arrays(value: Mapping[str, Any]) -> dict[str, np.ndarray]:
    # Copies: the decoded arrays share the (read-only) response body.
    return {key: np.array(array) for key, array in value.items()}


def _nothing(value: Any) -> Any:
    return value


def _plain_number(name: Any, value: Any) -> float:
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__}") from None


def _require_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError(
            "forward_backward_custom runs your loss in PyTorch on this machine: "
            'pip install "relay-intelligence[train]"'
        ) from None
    return torch


# Sessions still open when the program ends are closed, so their GPUs are free at once rather than
# after the idle timeout. Calls not yet sent are dropped.
_open_clients: weakref.WeakSet[TrainingClient] = weakref.WeakSet()
_exit_lock = threading.Lock()


@atexit.register
def _close_open_clients() -> None:
    with _exit_lock:
        for client in list(_open_clients):
            with contextlib.suppress(Exception):  # best effort, at exit
                client._close(drain=False)
