"""Host one deployment: claim it, load its model into a policy server, serve until it should end.

A deployment holds this worker process (one GPU) for its life. The policy server
(relay_worker.serving.server) runs in threads of this process, on a free port of
`serving_host`, and answers only requests that carry the deployment's own secret: the API's. The
keeper renews the lease every `heartbeat_seconds` with the server's figures and learns whether a
stop was asked for; the deployment ends on a stop, after `idle_timeout_seconds` without a request
(and no robot connected), or when the claim is lost. A worker that shuts down hands it back.
"""

from __future__ import annotations

import functools
import logging
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from relay.errors import InputError
from relay.serving import status as st
from relay_api.db import worker_session_factory
from relay_api.deployments import STOPPED_BY_USER
from relay_api.settings import Settings, get_settings
from relay_worker import deployment_lifecycle as lifecycle
from relay_worker import shutdown
from relay_worker.deployment_lifecycle import DeploymentClaim
from relay_worker.fine_tune import public_message, worker_name
from relay_worker.leases import LeaseRenewer
from relay_worker.serving.server import RunningPolicyServer, ServingOptions, start_policy_server

log = logging.getLogger("relay_worker")

LOOK_EVERY_SECONDS = 0.2  # how often the host looks at why it might end
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class DeploymentKeeper(LeaseRenewer[lifecycle.DeploymentState]):
    """Renews the deployment's lease with the server's figures, and notes a stop or a lost claim."""

    def __init__(self, settings: Settings, claim: DeploymentClaim) -> None:
        super().__init__(settings, claim.deployment_id, "deployment")
        self.claim = claim
        self.db_sessions = worker_session_factory(settings)
        self.server: RunningPolicyServer | None = None  # set once it serves
        self.stop_requested = False

    def renew(self) -> lifecycle.DeploymentState:
        return lifecycle.renew(self.db_sessions, self.settings, self.claim, self.stats())

    def took(self, state: lifecycle.DeploymentState) -> None:
        self.stop_requested = state.stop_requested

    def stats(self) -> dict[str, Any] | None:
        return None if self.server is None else self.server.stats()


def run_deployment(deployment_id: str, settings: Settings | None = None, publish: Any = None) -> str:
    """Host the deployment if this delivery can claim it; returns what happened, for the task's log.
    `publish(deployment_id)` hands it to another worker when this one shuts down."""
    settings = settings or get_settings()
    db_sessions = worker_session_factory(settings)
    claim = lifecycle.claim(db_sessions, settings, deployment_id, worker_name())
    if claim is None:
        return "not claimed: the deployment is held by another worker, stopped or ended"
    keeper = DeploymentKeeper(settings, claim)
    keeper.start()
    server: RunningPolicyServer | None = None
    status, reason = st.ERROR, "the worker failed unexpectedly"
    handed_back = False
    try:
        log.info("deployment %s (attempt %d): loading %s", deployment_id, claim.attempt, claim.model_source)
        try:
            server = start_policy_server(
                claim.model_source,
                host=settings.serving_host,
                port=0,
                token=claim.token,
                options=serving_options(claim.config, settings),
            )
        except (InputError, OSError) as error:  # the log keeps the paths; the owner reads them in words
            log.warning("deployment %s: could not load %s: %s", deployment_id, claim.model_source, error)
            status, reason = st.ERROR, f"could not load the model: {public_message(str(error), settings)}"
            return f"{status}: {reason}"
        url = advertised_url(server.url, settings)
        if not lifecycle.mark_ready(db_sessions, settings, claim, url, dict(server.metadata)):
            status, reason = st.STOPPED, "stopped before it was ready"
            return f"{status}: {reason}"
        keeper.server = server
        log.info("deployment %s: ready at %s", deployment_id, url)
        status, reason = _serve(keeper, server, float(claim.config["idle_timeout_seconds"]))
        if status == st.STARTING:  # this worker is shutting down: another loads it
            handed_back = lifecycle.hand_back(db_sessions, claim, reason)
            if handed_back and publish is not None:
                publish(deployment_id)
            elif not handed_back:  # a stop came first (or the claim is gone): it ends here
                status, reason = st.STOPPED, STOPPED_BY_USER
        return f"{status}: {reason}"
    except Exception as error:
        log.exception("deployment %s failed", deployment_id)
        reason = f"the worker failed: {type(error).__name__}: {public_message(str(error), settings)}"
        raise
    finally:
        keeper.stop()
        stats = keeper.stats()
        if server is not None:
            server.stop()
        if not handed_back and status in st.ENDED:
            lifecycle.end(db_sessions, claim, status, reason, stats)
        log.info("deployment %s ended %s: %s", deployment_id, status, reason)


def serving_options(config: dict[str, Any], settings: Settings) -> ServingOptions:
    """How the deployment's server runs; what its clients see names the model as the deployment
    does (`ft-...`, a base model), and the service's directories in words (public_message), never
    the paths this worker loads from."""
    return ServingOptions(
        max_batch=int(config["max_batch"]),
        max_wait_ms=float(config["max_wait_ms"]),
        max_body_bytes=settings.serving_max_body_bytes,
        model_name=str(config["model"]),
        shown=functools.partial(public_message, settings=settings),
    )


def advertised_url(url: str, settings: Settings) -> str:
    """The policy server's URL as the API reaches it: the advertised host in place of the bound one."""
    parts = urlsplit(url)
    host = settings.serving_advertised_host
    if not host:
        bound = parts.hostname or ""
        host = bound if bound not in WILDCARD_HOSTS else (settings.worker_address or socket.getfqdn())
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"{parts.scheme}://{host}:{parts.port}"


def _serve(keeper: DeploymentKeeper, server: RunningPolicyServer, idle_timeout: float) -> tuple[str, str]:
    """Wait until the deployment should end; returns (status, why): `starting` to hand it back."""
    ready_at = time.time()
    while True:
        if keeper.lost:
            return st.ERROR, "the worker lost its claim on the deployment (its lease lapsed)"
        if keeper.stop_requested:
            return st.STOPPED, STOPPED_BY_USER
        if shutdown.under_way():
            return st.STARTING, "its worker shut down; restarting on another worker"
        stats = server.stats()
        last = max(ready_at, float(stats.get("last_request_at") or 0.0))
        if not stats.get("clients") and time.time() - last > idle_timeout:
            return st.STOPPED, f"no requests for {idle_timeout:g} s (idle_timeout_seconds)"
        time.sleep(LOOK_EVERY_SECONDS)
