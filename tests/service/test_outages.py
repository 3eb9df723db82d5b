"""Outages of what the service stands on: PostgreSQL cut off (through a TCP proxy) while a job
trains, for longer than the worker's old retries lasted (about 3 s); Redis restarted without
persistence while a job waits in it."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy import select, update

from relay.http_client import Client
from relay.sft import status as st
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.models import FineTune
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
    stack: Stack, lease_seconds: float, queue: str = "relay.outage"
) -> Iterator[ProxiedService]:
    """The API and a worker on their own jobs' queue, with the lease given, both through a proxy."""
    parts = urlsplit(stack.database_url)
    proxy = CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    proxied_url = stack.database_url.replace(parts.netloc, f"{parts.username}@127.0.0.1:{proxy.port}")
    settings = stack.settings.model_copy(
        update={
            "database_url": proxied_url.replace("postgresql://", "postgresql+psycopg://", 1),
            "fine_tune_queue": queue,
            "session_queue": queue + "-sessions",
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
        "RELAY_LEASE_SECONDS": str(lease_seconds),
    }
    worker = WorkerProcess(env, stack.root / f"worker-{queue}.log")
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


def _enqueued(stack: Stack, job_id: str) -> bool:
    with stack.sessions() as db:
        return db.scalar(select(FineTune.enqueued_at).where(FineTune.id == job_id)) is not None
