"""A gang job that the live workers cannot form (they have fewer slots than it needs): it must not
hold a worker from the jobs that worker can run. One worker of one slot, a job of two GPUs
(accepted while more workers were live), and a job of one GPU behind it. And a host whose gang
gave up a moment ago: it starts no gathering of its own for a while, but joins one that another
host has begun."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, select, update

from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api import fine_tunes
from relay_api.db import utcnow
from relay_api.keys import hash_key
from relay_api.models import ApiKey, FineTune, FineTuneHost, WorkerHeartbeat
from relay_api.queue import Publisher
from relay_worker import gang, heartbeat
from relay_worker.fine_tune import _join_gang, worker_name
from tests.service.stack import Stack, wait_for

pytestmark = pytest.mark.slow


def tiny(dataset: Path, **fields: object) -> SFTConfig:
    return SFTConfig(**{"model": "pi05-tiny", "dataset_name": str(dataset), "batch_size": 2, **fields})


def live_slots(stack: Stack) -> int:
    with stack.sessions() as session:
        return sum(w.gpus for w in fine_tunes.live_workers(session, stack.settings.reconcile_seconds))


def owner_of(stack: Stack, client: Client) -> int:
    with stack.sessions() as session:
        owner = session.scalar(
            select(ApiKey.user_id).where(ApiKey.key_hash == hash_key(client.api_key or ""))
        )
    assert owner is not None
    return owner


def seats_of(stack: Stack, job_id: str) -> int:
    with stack.sessions() as session:
        count = select(func.count()).select_from(FineTuneHost).where(FineTuneHost.job_id == job_id)
        return session.scalar(count) or 0


def test_a_gang_that_cannot_form_leaves_the_worker_to_a_job_it_can_run(
    stack: Stack, client: Client, dataset: Path
) -> None:
    stack.stop_worker()  # the one worker below must be the only live one
    worker = stack.start_standby_worker(RELAY_WORKER_SLOTS="1")
    try:
        worker.wait_ready()
        wait_for(lambda: live_slots(stack) == 1, 60, "the stopped workers' heartbeats to go stale", every=0.2)
        # The API refuses a job of more GPUs than the live workers have; this one was accepted when
        # more were live. It is written and published as the API does.
        with stack.sessions() as session:
            owner = session.scalar(
                select(ApiKey.user_id).where(ApiKey.key_hash == hash_key(client.api_key or ""))
            )
            assert owner is not None
            gang_job, _ = fine_tunes.create(session, owner, tiny(dataset, gpus=2, steps=10), None)
            fine_tunes.mark_enqueued(session, gang_job["id"])
        Publisher(stack.settings).fine_tune(gang_job["id"])
        parked = f"{gang_job['id']}: the live workers have 1 slot(s) of the 2 its gang needs"
        try:
            wait_for(
                lambda: parked in worker.log_since_start() or seats_of(stack, gang_job["id"]),
                120,
                "the worker to take the gang job's delivery",
                every=0.1,
            )
        except AssertionError as timed_out:
            raise AssertionError(worker.log_tail()) from timed_out
        seated: list[int] = []  # a seat taken at any moment while the one-GPU job waits or runs
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                seated.append(seats_of(stack, gang_job["id"]))
                done.wait(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        alone = train(tiny(dataset, gpus=1, steps=10), client=client)
        alone.wait(poll=0.5, timeout=300)
        done.set()
        watcher.join()
        assert alone.status == "completed", alone.to_dict()
        assert not any(seated), "the worker held a seat in a gang that could not form"
        with stack.sessions() as session:
            row = session.get(FineTune, gang_job["id"])
            assert row is not None
            assert (row.status, row.attempt, row.error) == ("queued", 0, None)
            assert row.enqueued_at is None  # no message in the broker: the reconciler publishes it later
            fine_tunes.cancel(session, owner, gang_job["id"])  # so it waits for no later test's workers
    finally:
        worker.stop()


def test_a_host_whose_gang_gave_up_still_joins_a_gang_another_host_has_begun(
    stack: Stack, client: Client, dataset: Path
) -> None:
    """This host (the test process, as a worker of one slot) gave up a gang of each job a moment
    ago, so it leaves the job alone for RELAY_GANG_WAIT_SECONDS (300 s by default): its own wake-ups
    must not seat it again, alone. But where another host is seated now, its seat forms the gang at
    once, and it must take it rather than wait out the window (a gang that could form waited 45 s)."""
    stack.stop_worker()  # no reconciler may publish these jobs, and no worker may seat in them
    settings = stack.settings.model_copy(update={"gang_wait_seconds": 300.0})
    owner = owner_of(stack, client)
    with stack.sessions() as session:
        jobs = [fine_tunes.create(session, owner, tiny(dataset, gpus=2, steps=10), None)[0] for _ in range(2)]
        for job in jobs:
            fine_tunes.mark_enqueued(session, job["id"])
    formable, lonely = (job["id"] for job in jobs)
    here, other = worker_name(), "other-host:1"
    try:
        for job_id in (formable, lonely):
            gang.leave_alone(job_id, settings.gang_wait_seconds)  # as wait_for_gang does on giving up
        taken = gang.take_seat(stack.sessions, settings, formable, other)
        assert taken is not None and taken[1] is False  # the other host waits for a second one
        for name in (other, here):  # two live slots: the cluster can hold the gang
            heartbeat.beat(stack.sessions, name, utcnow(), gpus=1)
        joined: Any = _join_gang(settings, stack.sessions, formable, 2, publish=None)
        assert joined is not None, "the host waited out its window though its seat formed the gang"
        assert (joined.claim.attempt, joined.hosts, joined.seat.seat) == (1, 2, 1)
        with stack.sessions() as session:
            row = session.get(FineTune, formable)
            assert row is not None and (row.status, row.attempt) == ("running", 1)

        # With no other host seated, the window still keeps this host from gathering alone.
        assert _join_gang(settings, stack.sessions, lonely, 2, publish=None) is None
        assert seats_of(stack, lonely) == 0
    finally:
        with stack.sessions() as session:  # no worker runs these: end them here
            session.execute(
                update(FineTune)
                .where(FineTune.id.in_([formable, lonely]))
                .values(status="cancelled", lease_until=None, finished_at=utcnow())
            )
            session.execute(delete(FineTuneHost).where(FineTuneHost.job_id.in_([formable, lonely])))
            session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.name.in_([other, here])))
            session.commit()
