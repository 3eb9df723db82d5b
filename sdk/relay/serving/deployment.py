"""Deployment: a model served to robots by the service, as the API last reported it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from relay import http_client
from relay.serving import status as st
from relay.serving.config import DeploymentConfig
from relay.serving.images import observation_json

DEPLOYMENTS = "/v1/deployments"


class Deployment:
    """A deployment. Attributes: ``id``, ``status`` (relay.serving.status), ``model``, ``gpus``,
    ``max_batch``, ``max_wait_ms``, ``idle_timeout_seconds``, ``websocket_url`` (for
    ``openpi_client.WebsocketClientPolicy``), ``actions_url``, ``info`` (the model's cameras,
    state and action sizes, once loaded), ``stats`` (requests/s, latency percentiles, connected
    robots), ``error``, ``attempt``, ``created_at``, ``ready_at``, ``ended_at``."""

    id: str
    status: str
    model: str
    gpus: int
    max_batch: int
    max_wait_ms: float
    idle_timeout_seconds: float
    websocket_url: str
    actions_url: str
    info: dict[str, Any] | None
    stats: dict[str, Any] | None
    error: str | None
    attempt: int
    created_at: str
    ready_at: str | None
    ended_at: str | None

    def __init__(self, data: Mapping[str, Any], client: http_client.Client | None = None) -> None:
        self._client = client or http_client.default_client()
        self._update(data)

    def _update(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)
        for key, value in data.items():
            if key != "object":
                setattr(self, key, value)

    def __repr__(self) -> str:
        return f"Deployment(id={self.id!r}, status={self.status!r}, model={self.model!r})"

    def to_dict(self) -> dict[str, Any]:
        return dict(self._data)

    @property
    def path(self) -> str:
        return f"{DEPLOYMENTS}/{self.id}"

    def refresh(self) -> Deployment:
        self._update(self._client.request("GET", self.path))
        return self

    def wait_ready(self, timeout: float = 600.0, poll: float = 1.0) -> Deployment:
        """Wait until the deployment is ready; RuntimeError if it ends first, TimeoutError after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            self.refresh()
            if self.status == st.READY:
                return self
            if self.status in st.ENDED:
                raise RuntimeError(f"deployment {self.id} {self.status}: {self.error}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"deployment {self.id} is still {self.status} after {timeout:g} s")
            time.sleep(poll)

    def stop(self, wait: bool = False, timeout: float = 120.0, poll: float = 0.5) -> Deployment:
        """Stop serving; `status` reads `stopped` once its worker has let go (within its heartbeat,
        a few seconds). With `wait`, return only then (TimeoutError after `timeout` seconds)."""
        self._update(self._client.request("DELETE", self.path, retry=True))
        deadline = time.monotonic() + timeout
        while wait and self.status not in st.ENDED:
            if time.monotonic() > deadline:
                raise TimeoutError(f"deployment {self.id} is still {self.status} after {timeout:g} s")
            time.sleep(poll)
            self.refresh()
        return self

    def events(self) -> list[dict[str, Any]]:
        """Its moves between statuses (starting, ready, stopped, error) with why, oldest first."""
        found: list[dict[str, Any]] = []
        after: int | None = None
        while True:
            page = self._client.request("GET", f"{self.path}/events", params={"after": after, "limit": 100})
            found += page["data"]
            if not page["has_more"] or not page["data"]:
                return found
            after = page["data"][-1]["id"]

    def actions(self, observation: Mapping[str, Any], seed: int | None = None) -> np.ndarray:
        """The action chunk (action_horizon, action width) for one observation, in the robot's raw
        units: ``{"images": {CAMERA: uint8 (H, W, 3)}, "state": [...], "prompt": "..."}``. The same
        seed gives the same chunk. A deployment that is restarting is waited for (503s are
        retried with backoff)."""
        body: dict[str, Any] = {"observation": observation_json(observation)}
        if seed is not None:
            body["seed"] = seed
        answer = self._client.request("POST", f"{self.path}/actions", json_body=body, retry=True)
        return np.asarray(answer["actions"], dtype=np.float32)

    def actions_batch(
        self, observations: Sequence[Mapping[str, Any]], seeds: Sequence[int | None] | None = None
    ) -> list[np.ndarray]:
        """Chunks for several observations in one request (one forward pass on the service)."""
        body: dict[str, Any] = {"observations": [observation_json(o) for o in observations]}
        if seeds is not None:
            body["seeds"] = list(seeds)
        answer = self._client.request("POST", f"{self.path}/actions", json_body=body, retry=True)
        return [np.asarray(chunk, dtype=np.float32) for chunk in answer["actions"]]

    def predictions(self, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """A tuned RT-J's predictions for rows of its task's entity table, ``{"primary_key": ...,
        "time": "2021-06-01T00:00:00Z"}`` (``time`` optional: the database's latest): one dict a
        row with ``primary_key``, ``time``, ``prediction`` (a probability, or the value in the
        label's units) and ``score`` (the model's raw output)."""
        body = {"rows": [dict(row) for row in rows]}
        answer = self._client.request("POST", f"{self.path}/predictions", json_body=body, retry=True)
        return list(answer["predictions"])


def deploy(
    model: str,
    *,
    gpus: int | None = None,
    max_batch: int | None = None,
    max_wait_ms: float | None = None,
    idle_timeout_seconds: float | None = None,
    idempotency_key: str | None = None,
    client: http_client.Client | None = None,
) -> Deployment:
    """Deploy `model` (a completed fine-tune's id, a session's saved weights ``ses-.../NAME``, or a
    base model) and return at once (``starting``); ``wait_ready()`` waits for it. The settings are
    checked here first (DeploymentConfig), with the API's own rules."""
    given: dict[str, Any] = {
        "gpus": gpus,
        "max_batch": max_batch,
        "max_wait_ms": max_wait_ms,
        "idle_timeout_seconds": idle_timeout_seconds,
    }
    config = DeploymentConfig(model=model, **{k: v for k, v in given.items() if v is not None})
    client = client or http_client.default_client()
    headers = {"idempotency-key": idempotency_key or uuid.uuid4().hex}
    body = config.model_dump(mode="json")
    created = client.request("POST", DEPLOYMENTS, json_body=body, headers=headers, retry=True)
    return Deployment(created, client)


def retrieve(deployment_id: str, *, client: http_client.Client | None = None) -> Deployment:
    client = client or http_client.default_client()
    return Deployment(client.request("GET", f"{DEPLOYMENTS}/{deployment_id}"), client)


def list_deployments(
    *, limit: int = 20, after: str | None = None, client: http_client.Client | None = None
) -> tuple[list[Deployment], bool]:
    """A page of your deployments, newest first, and whether more follow (pass the last id as
    `after` for the next)."""
    client = client or http_client.default_client()
    page = client.request("GET", DEPLOYMENTS, params={"limit": limit, "after": after})
    return [Deployment(d, client) for d in page["data"]], bool(page["has_more"])
