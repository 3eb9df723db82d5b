"""Outages of what the service stands on: PostgreSQL cut off (through a TCP proxy) while a job
trains, for longer than the worker's old retries lasted (about 3 s), and while a deployment serves
robots; Redis restarted without persistence while a job waits in it."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from sqlalchemy import select, update

from relay.http_client import Client
from relay.serving import deploy
from relay.serving.images import observation_json
from relay.sft import status as st
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.db import utcnow
from relay_api.models import FineTune, deployments
from tests.service.proxy import CuttableProxy
from tests.service.stack import ApiServer, Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow

OUTAGE_SECONDS = 8.0  # well past the old ~3 s of retries, well inside the 30 s lease below
LEASE_SECONDS = 30.0


@dataclass
class ProxiedService:
    """The API and a worker that reach PostgreSQL through a proxy the test can cut."""

    proxy: CuttableProxy
    api: ApiServer
    worker: WorkerProcess
    client: Client


@contextlib.contextmanager
def proxied_service(
    stack: Stack, lease_seconds: float, queue: str = "relay.outage", serving: bool = False
) -> Iterator[ProxiedService]:
    """The API and a worker on their own jobs' queue, with the lease given, both through a proxy.
    `serving`: the worker takes deployments only, from a serving queue of its own."""
    parts = urlsplit(stack.database_url)
    proxy = CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    proxied_url = stack.database_url.replace(parts.netloc, f"{parts.username}@127.0.0.1:{proxy.port}")
    settings = stack.settings.model_copy(
        update={
            "database_url": proxied_url.replace("postgresql://", "postgresql+psycopg://", 1),
            "fine_tune_queue": queue,
            "session_queue": queue + "-sessions",
            "serving_queue": queue + "-serving",
            "lease_seconds": lease_seconds,
        }
    )
    api = ApiServer(settings)
    env = {
        **os.environ,
        **stack.env_settings,
        "RELAY_DATABASE_URL": proxied_url,
        "RELAY_FINE_TUNE_QUEUE": queue,
        "RELAY_SESSION_QUEUE": queue + "-sessions",
        "RELAY_SERVING_QUEUE": queue + "-serving",
        "RELAY_LEASE_SECONDS": str(lease_seconds),
    }
    queues = (queue + "-serving",) if serving else ()
    worker = WorkerProcess(env, stack.root / f"worker-{queue}.log", queues)
    worker.start()
    client = Client(api.url, stack.new_user()[1], max_retries=0)
    try:
        worker.wait_ready()
        yield ProxiedService(proxy, api, worker, client)
    finally:
        client.close()
        worker.stop()
        api.stop()
        proxy.close()


def test_a_database_outage_costs_a_training_job_nothing(stack: Stack, dataset: Path) -> None:
    with proxied_service(stack, LEASE_SECONDS) as service:
        proxy, api, worker, client = service.proxy, service.api, service.worker, service.client
        key = client.api_key
        config = SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=60)
        job = train(config, client=client)
        wait_for(lambda: job.refresh().step >= 10, 300, "the job's first events", every=0.2)

        step_at_cut = job.step
        proxy.cut()
        cut_at = time.monotonic()
        answers: list[httpx.Response] = []
        with httpx.Client(base_url=api.url, headers={"authorization": f"Bearer {key}"}) as http:
            while time.monotonic() - cut_at < OUTAGE_SECONDS:
                answers.append(http.get(f"/v1/fine-tunes/{job.id}", timeout=30))
                time.sleep(0.5)
        proxy.restore()

        statuses = {answer.status_code for answer in answers}
        assert 503 in statuses and not {s for s in statuses if s >= 500} - {503}, statuses
        refused = next(answer for answer in answers if answer.status_code == 503)
        assert refused.headers["retry-after"].isdigit()
        assert refused.json()["error"]["code"] == "database_unavailable"

        wait_for(lambda: job.refresh().status in ("completed", "error"), 300, "the job to end", every=0.5)
        assert job.status == "completed", (job.error, worker.log_tail())
        assert job.to_dict()["attempts"] == 1
        events = job.events()
        kinds = [(e["step"], e.get("event", "metrics")) for e in events]
        assert [s for s, kind in kinds if kind == "metrics"] == [10, 20, 30, 40, 50, 60], kinds
        assert [s for s, kind in kinds if kind == "checkpoint"] == [10, 20, 30, 40, 50, 60], kinds
        assert not [kind for _, kind in kinds if kind in ("retry", "resumed", "error")], kinds
        assert "the database is unreachable" in worker.log_since_start()
        refusals = sum(answer.status_code == 503 for answer in answers)
        print(
            f"\nPostgreSQL cut for {OUTAGE_SECONDS:.0f} s at step {step_at_cut}: {refusals} of "
            f"{len(answers)} API answers meanwhile were 503; the job completed on attempt 1 with all "
            f"{len(events)} events"
        )


def test_an_outage_longer_than_the_lease_loses_no_event_and_counts_no_attempt(
    stack: Stack, dataset: Path
) -> None:
    """PostgreSQL cut for 2.5 leases while a job trains: the attempt stops before its lease lapses,
    training meanwhile past checkpoints whose events it cannot write; it gives the job back once
    the database answers, and the next attempt writes those events before resuming."""
    stack.stop_worker()  # its reconciler, not cut off, would judge the lapsed lease a lost worker
    lease = 12.0
    with proxied_service(stack, lease, queue="relay.long-outage") as service:
        steps = 120
        config = SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=steps)
        job = train(config, client=service.client)
        wait_for(lambda: job.refresh().step >= 10, 300, "the job's first events", every=0.2)
        service.proxy.cut()
        time.sleep(2.5 * lease)  # the fault itself: an outage of this length
        service.proxy.restore()

        wait_for(lambda: job.refresh().status in st.TERMINAL, 300, "the job to end", every=0.5)
        log = service.worker.log_since_start()
        assert job.status == "completed", (job.error, service.worker.log_tail())
        assert "this attempt stopped so that another could resume" in log, "the cut was too short to stop it"
        events = job.events()
        kinds = [(e["step"], e.get("event", "metrics")) for e in events]
        assert len(kinds) == len(set(kinds)), "an event was written twice"
        every_tenth = list(range(10, steps + 1, 10))
        assert [s for s, kind in kinds if kind == "metrics"] == every_tenth, kinds
        assert [s for s, kind in kinds if kind == "checkpoint"] == every_tenth, kinds
        # The outage's attempt was given back, not lost: one retry, saying why, not counted.
        retries = [e for e in events if e.get("event") == "retry"]
        assert len(retries) == 1 and "database was unreachable" in retries[0]["reason"], retries
        assert "not a fault of the job" in retries[0]["reason"]
        with stack.sessions() as session:
            row = session.execute(
                select(FineTune.attempt, FineTune.handovers).where(FineTune.id == job.id)
            ).one()
        assert (row.attempt, row.handovers) == (2, 1)  # so no attempt failed: the job had all its retries
        assert job.to_dict()["attempts"] == 2


def robot_observation(info: dict[str, object], seed: int) -> dict[str, object]:
    """An observation for the served model, from what its metadata says it reads."""
    rng = np.random.default_rng(seed)
    cameras = info["cameras"]
    assert isinstance(cameras, list)
    width = info.get("state_dim") or 8
    assert isinstance(width, int)
    return {
        "images": {camera: rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for camera in cameras},
        "state": rng.uniform(-1, 1, width).astype(np.float32),
        "prompt": "move to the orange dot",
    }


def test_a_deployment_serves_its_robots_through_a_database_outage_longer_than_its_lease(
    stack: Stack,
) -> None:
    """PostgreSQL cut for 2.5 leases while a deployment serves: the robot already connected keeps
    its answers, a robot that connects during the cut is served, and HTTP /actions answers from the
    worker (the API takes the key and the deployment's route as it last read them). Once the
    database is back, the deployment is the same attempt, never restarted as "killed or lost"."""
    stack.stop_worker()  # its reconciler, not cut off, would judge the lapsed lease a lost worker
    lease = 6.0
    with proxied_service(stack, lease, queue="relay.serving-outage", serving=True) as service:
        key = service.client.api_key or ""
        deployment = deploy("pi05-tiny", client=service.client).wait_ready(timeout=180, poll=0.2)
        obs = robot_observation(deployment.info or {}, 0)
        ws_host = deployment.websocket_url.removeprefix("ws://")
        robot = WebsocketClientPolicy(host=ws_host, port=None, api_key=key)
        expected = robot.infer({**obs, "seed": 7})["actions"]
        path = f"/v1/deployments/{deployment.id}"
        body = {"observation": observation_json(obs), "seed": 7}
        with httpx.Client(base_url=service.api.url, headers={"authorization": f"Bearer {key}"}) as http:
            assert http.post(f"{path}/actions", json=body, timeout=30).status_code == 200

            service.proxy.cut()
            cut_at = time.monotonic()
            answers: list[httpx.Response] = []
            newcomer: WebsocketClientPolicy | None = None
            while time.monotonic() - cut_at < 2.5 * lease:
                answers.append(http.post(f"{path}/actions", json=body, timeout=30))
                np.testing.assert_allclose(robot.infer({**obs, "seed": 7})["actions"], expected, atol=1e-4)
                if newcomer is None and time.monotonic() - cut_at > lease:  # past the lease, cut off
                    newcomer = WebsocketClientPolicy(host=ws_host, port=None, api_key=key)
                    answer = newcomer.infer({**obs, "seed": 7})["actions"]
                    np.testing.assert_allclose(answer, expected, atol=1e-4)
                time.sleep(0.2)
            shown_during_the_cut = http.get(path, timeout=30)
            service.proxy.restore()
            restored_at = time.monotonic()

        assert [a.status_code for a in answers if a.status_code != 200] == [], answers[0].text
        for answer in answers:
            np.testing.assert_allclose(answer.json()["actions"], expected, atol=1e-4)
        assert newcomer is not None
        # What needs the database still says it is away.
        assert shown_during_the_cut.status_code == 503
        assert shown_during_the_cut.json()["error"]["code"] == "database_unavailable"

        # The worker renews its lease once the database answers; the reconcilers judge no lease
        # that lapsed during the outage until a lease after it, and by then it is renewed.
        wait_for(lambda: _lease_held(stack, deployment.id), 60, "a live lease again", every=0.2)
        time.sleep(max(0.0, restored_at + lease + 3 * stack.settings.reconcile_seconds - time.monotonic()))
        deployment.refresh()
        events = deployment.events()
        assert (deployment.status, deployment.attempt) == ("ready", 1), events
        assert [e["event"] for e in events] == ["starting", "ready"], events
        np.testing.assert_allclose(robot.infer({**obs, "seed": 7})["actions"], expected, atol=1e-4)
        print(
            f"\nPostgreSQL cut for {2.5 * lease:.0f} s (lease {lease:.0f} s) while a deployment served: "
            f"{len(answers)} HTTP /actions answered meanwhile, the connected robot and one that "
            "connected during the cut served, the deployment still attempt 1"
        )
        robot._ws.close()
        newcomer._ws.close()
        deployment.stop()
        wait_for(lambda: deployment.refresh().status == "stopped", 30, "the deployment to stop", every=0.2)


def test_a_redis_restart_without_persistence_republishes_queued_jobs_at_once(
    stack: Stack, worker: WorkerProcess, dataset: Path
) -> None:
    """A job handed to a queue that no worker reads sits in Redis; Redis restarts and forgets it.
    The stack republishes after a day (RELAY_REPUBLISH_SECONDS), so only noticing the restart runs it."""
    with stack.sessions() as db:  # jobs other tests left queued on purpose would be republished too
        db.execute(update(FineTune).where(FineTune.status == "queued").values(status="cancelled"))
        db.commit()
    api = ApiServer(stack.settings.model_copy(update={"fine_tune_queue": "relay.nobody"}))
    _, key = stack.new_user()
    client = Client(api.url, key, max_retries=0)
    try:
        job = train(
            SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=2), client=client
        )
        wait_for(lambda: _enqueued(stack, job.id), 30, "the API to note the job reached the broker")
        stack.redis.restart()
        restarted = time.monotonic()
        # Within a minute, not RELAY_REPUBLISH_SECONDS (a day here, 600 s by default).
        wait_for(lambda: job.refresh().status != "queued", 60, "a worker to take the job", every=0.5)
        taken_after = time.monotonic() - restarted
        wait_for(lambda: job.refresh().status in ("completed", "error"), 120, "the job to end", every=0.5)
        assert job.status == "completed", job.error
        print(f"\na job lost with a Redis restart ran {taken_after:.1f} s after the restart")
    finally:
        client.close()
        api.stop()


def _lease_held(stack: Stack, deployment_id: str) -> bool:
    """Whether the deployment's lease is live (renewed by its worker, or taken by a new attempt)."""
    with stack.sessions() as db:
        lease = db.scalar(select(deployments.c.lease_until).where(deployments.c.id == deployment_id))
    return lease is not None and lease > utcnow()


def _enqueued(stack: Stack, job_id: str) -> bool:
    with stack.sessions() as db:
        return db.scalar(select(FineTune.enqueued_at).where(FineTune.id == job_id)) is not None
