"""Faults (what docs/reliability.md promises): a worker killed mid-job, a job the broker never
got, a job out of attempts, and writes from an attempt that no longer owns its job."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from sqlalchemy import select, text, update

from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.job import FineTuneJob
from relay.sft.train import train
from relay_api import fine_tunes
from relay_api.db import utcnow
from relay_api.models import FineTune, FineTuneEvent
from relay_engine.core.checkpoint import CheckpointStore
from relay_worker import lifecycle
from tests.disks import small_disk
from tests.service.stack import Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow


def tiny(dataset: Path, **fields: object) -> SFTConfig:
    return SFTConfig(
        **{"model": "pi05-tiny", "dataset_name": str(dataset), "batch_size": 2, "finetune": "lora", **fields}
    )


def user_id(stack: Stack, key: str) -> int:
    from relay_api.keys import hash_key
    from relay_api.models import ApiKey

    with stack.sessions() as session:
        found = session.scalar(select(ApiKey.user_id).where(ApiKey.key_hash == hash_key(key)))
    assert found is not None
    return found


def checkpoint_steps(stack: Stack, job_id: str) -> list[int]:
    with stack.sessions() as session:
        return list(
            session.scalars(
                select(FineTuneEvent.step).where(
                    FineTuneEvent.job_id == job_id, FineTuneEvent.kind == "checkpoint"
                )
            )
        )


# Long enough that a loaded machine does not finish the job between its first checkpoint and the
# fault (a metrics event and a checkpoint every 10 steps).
FAULTED_STEPS = 60


def checkpointed_job_and_a_standby(
    stack: Stack, client: Client, dataset: Path
) -> tuple[WorkerProcess, FineTuneJob, WorkerProcess]:
    """A job of FAULTED_STEPS steps running on the stack's worker, past its first checkpoint, and a
    second worker started meanwhile (not yet ready), to take the job over: (worker, job, standby)."""
    worker = stack.worker()
    job = train(tiny(dataset, steps=FAULTED_STEPS), client=client)
    wait_for(lambda: job.refresh().status == "running", 120, "the worker to claim the job", every=0.02)
    # The worker that will take over warms up meanwhile; its reconciler will find the lapsed lease.
    standby = stack.start_standby_worker()
    # The checkpoint on disk, not its event: on a loaded machine the event has lagged the disk by
    # every step the job had left (CI once saw the job reach its last step before the event came).
    checkpoints = CheckpointStore(stack.settings.job_dir(job.id) / "checkpoints")
    wait_for(lambda: checkpoints.complete(), 180, "the job's first checkpoint", every=0.02)
    return worker, job, standby


def test_a_job_whose_worker_is_killed_resumes_from_its_last_checkpoint(
    stack: Stack, client: Client, dataset: Path
) -> None:
    worker, job, standby = checkpointed_job_and_a_standby(stack, client, dataset)
    worker.kill()  # SIGKILL, the worker and its pool process at once
    killed_at = dt.datetime.now(dt.UTC)
    # What the resume must read: the newest complete checkpoint on disk when the worker died. Its
    # `checkpoint` event may not have reached the database yet (a loaded machine has seen two
    # checkpoints written but only the first reported), so the disk is asked, not the events.
    on_disk = CheckpointStore(stack.settings.job_dir(job.id) / "checkpoints").complete()
    last_checkpoint = int(CheckpointStore.manifest(on_disk[-1])["step"])
    assert max(checkpoint_steps(stack, job.id), default=0) <= last_checkpoint
    assert job.refresh().status == "running", "the job ended before the kill; make it longer"
    assert last_checkpoint < FAULTED_STEPS

    standby.wait_ready()
    stack.adopt(standby)
    job.wait(poll=1, timeout=300)
    assert job.status == "completed" and job.step == FAULTED_STEPS
    assert job.to_dict()["attempts"] == 2

    events = job.events()
    keys = [(e["step"], e.get("event", "metrics")) for e in events]
    assert len(keys) == len(set(keys)), "an event was written twice"
    assert [e["step"] for e in events if "event" not in e] == list(range(10, FAULTED_STEPS + 1, 10))
    retry = next(e for e in events if e.get("event") == "retry")
    assert retry["attempt"] == 2
    resumed = next(e for e in events if e.get("event") == "resumed")
    # From the newest checkpoint complete at the kill.
    assert resumed["attempt"] == 2 and resumed["step"] == last_checkpoint
    resumed_after = dt.datetime.fromisoformat(resumed.created_at or "") - killed_at
    print(
        f"\nSIGKILL at step {last_checkpoint}+: resumed from step {resumed['step']} "
        f"{resumed_after.total_seconds():.1f} s later (lease {stack.settings.lease_seconds:.0f} s, "
        f"reconciler every {stack.settings.reconcile_seconds:.0f} s)"
    )
    assert events[-2:] == [
        {"step": FAULTED_STEPS, "event": "finished"},
        {"step": FAULTED_STEPS, "event": "stage", "stage": "writing"},
    ]


def test_a_worker_that_shuts_down_hands_its_job_to_another(
    stack: Stack, client: Client, dataset: Path
) -> None:
    worker, job, standby = checkpointed_job_and_a_standby(stack, client, dataset)

    assert worker.shut_down() == 0  # a warm shutdown that does not wait for the whole job
    # On a fast machine the standby may resume (even finish) the job while the first worker exits,
    # so the check that the first attempt did not finish it is made on the events.
    standby.wait_ready()
    stack.adopt(standby)
    job.wait(poll=1, timeout=300)
    assert job.status == "completed" and job.step == FAULTED_STEPS

    events = job.events()
    retries = [e for e in events if e.get("event") == "retry"]
    assert retries, "the job ended before the shutdown; make it longer"
    retry = retries[0]
    assert retry == {"step": retry["step"], "event": "retry", "attempt": 2, "reason": "its worker shut down"}
    assert next(e for e in events if e.get("event") == "resumed")["step"] >= 10
    keys = [(e["step"], e.get("event", "metrics")) for e in events]
    assert len(keys) == len(set(keys))


def test_a_job_the_broker_never_got_is_published_by_the_reconciler(
    stack: Stack, client: Client, dataset: Path
) -> None:
    stack.worker()
    # As if the API died between committing the job and publishing it.
    with stack.sessions() as session:
        row, _ = fine_tunes.create(
            session, user_id(stack, client.api_key or ""), tiny(dataset, steps=10), None
        )
    job = FineTuneJob(client.request("GET", f"/v1/fine-tunes/{row['id']}"), client)
    assert job.status == "queued"
    job.wait(poll=1, timeout=180)
    assert job.status == "completed"


def test_a_job_out_of_attempts_ends_in_error_with_a_clear_message(
    stack: Stack, client: Client, dataset: Path
) -> None:
    stack.worker()
    with stack.sessions() as session:
        row, _ = fine_tunes.create(
            session, user_id(stack, client.api_key or ""), tiny(dataset, steps=10), None
        )
        # Its third attempt's worker died: the lease lapsed and no attempts are left.
        session.execute(
            update(FineTune)
            .where(FineTune.id == row["id"])
            .values(
                status="running",
                attempt=stack.settings.max_attempts,
                enqueued_at=utcnow(),
                lease_until=utcnow() - dt.timedelta(seconds=1),
            )
        )
        session.commit()
    job = FineTuneJob(client.request("GET", f"/v1/fine-tunes/{row['id']}"), client)
    with pytest.raises(
        RuntimeError, match="gave up after 3 failed attempts; the last one ended with: the worker of attempt"
    ):
        job.wait(poll=1, timeout=60)
    assert job.status == "error"
    assert job.events()[-1]["event"] == "error"


def test_an_attempt_that_lost_its_job_cannot_write(stack: Stack, dataset: Path) -> None:
    settings = stack.settings
    with stack.sessions() as session:
        row, _ = fine_tunes.create(
            session, user_id(stack, stack.new_user()[1]), tiny(dataset, steps=10), None
        )
        fine_tunes.mark_enqueued(session, row["id"])  # (so the running worker's reconciler leaves it be)
    first = lifecycle.claim(stack.sessions, settings, row["id"], "zombie")
    assert first is not None and first.attempt == 1
    assert lifecycle.claim(stack.sessions, settings, row["id"], "too-early") is None  # the lease is live

    with stack.sessions() as session:  # the zombie stalls past its lease
        session.execute(
            update(FineTune)
            .where(FineTune.id == row["id"])
            .values(lease_until=utcnow() - dt.timedelta(seconds=1))
        )
        session.commit()
    second = lifecycle.claim(stack.sessions, settings, row["id"], "successor")
    assert second is not None and second.attempt == 2

    event = {"step": 10, "loss": 0.5, "grad_norm": 1.0, "lr": 1e-5, "skipped": 0.0}
    with pytest.raises(lifecycle.FencedOut):
        lifecycle.record_event(stack.sessions, settings, first, event)
    with pytest.raises(lifecycle.FencedOut):
        lifecycle.renew(stack.sessions, settings, first)
    with pytest.raises(lifecycle.FencedOut):
        lifecycle.complete(stack.sessions, first, 10, 0.5, "/nowhere", {})
    with pytest.raises(lifecycle.FencedOut):
        lifecycle.fail(stack.sessions, first, "late")

    lifecycle.record_event(stack.sessions, settings, second, event)
    lifecycle.record_event(stack.sessions, settings, second, event)  # the same step again adds nothing
    assert lifecycle.complete(stack.sessions, second, 10, 0.5, "/out", {}) == "completed"
    with pytest.raises(lifecycle.FencedOut):  # and a terminal status never changes again
        lifecycle.fail(stack.sessions, second, "after the end")
    with stack.sessions() as session:
        final = session.get(FineTune, row["id"])
        assert final is not None and (final.status, final.step, final.error) == ("completed", 10, None)
        stored = session.execute(
            select(FineTuneEvent.step, FineTuneEvent.kind, FineTuneEvent.data)
            .where(FineTuneEvent.job_id == row["id"])
            .order_by(FineTuneEvent.id)
        ).all()
    # The successor took the lapsed job before any reconciler saw it (as a redelivered task can):
    # its claim reports the retry (CI once saw a job resumed by attempt 2 with no retry event).
    assert [(step, kind) for step, kind, _ in stored] == [(0, "retry:2"), (10, "metrics")]
    assert stored[0].data == {
        "attempt": 2,
        "reason": "the worker of attempt 1 stopped responding (killed or lost)",
    }


def test_a_session_or_deployment_holder_that_lost_its_row_cannot_renew_and_its_keeper_says_so(
    stack: Stack,
) -> None:
    """The one fenced renewal (relay_worker.leases) as sessions and deployments use it: once another
    worker holds the row, the old holder's renewal writes nothing and raises FencedOut, and its
    keeper thread ends noting `lost`."""
    from dataclasses import replace

    from relay.serving.config import DeploymentConfig
    from relay.training.config import SessionConfig
    from relay_api import deployments, sessions
    from relay_api.models import deployments as deployment_table
    from relay_api.models import training_sessions as session_table
    from relay_worker import deployment_lifecycle, session_lifecycle
    from relay_worker.deployment import DeploymentKeeper
    from relay_worker.leases import FencedOut
    from relay_worker.session import SessionKeeper

    settings = stack.settings.model_copy(update={"heartbeat_seconds": 0.05})
    owner = user_id(stack, stack.new_user()[1])
    with stack.sessions() as db:
        session_row, _ = sessions.create(db, owner, SessionConfig(base_model="pi05-tiny"), None, settings)
        deployment_row, _ = deployments.create(
            db, owner, DeploymentConfig(model="pi05-tiny"), "pi05-tiny", None
        )
    held = session_lifecycle.claim(stack.sessions, settings, session_row["id"], "first-worker")
    serving = deployment_lifecycle.claim(stack.sessions, settings, deployment_row["id"], "first-worker")
    assert held is not None and serving is not None
    assert session_lifecycle.renew(stack.sessions, settings, held).status == "starting"
    assert not deployment_lifecycle.renew(stack.sessions, settings, serving).stop_requested

    with stack.sessions() as db:  # another worker holds each row now
        db.execute(update(session_table).where(session_table.c.id == held.session_id).values(worker="second"))
        db.execute(
            update(deployment_table)
            .where(deployment_table.c.id == serving.deployment_id)
            .values(attempt=serving.attempt + 1)
        )
        db.commit()
    with pytest.raises(FencedOut):
        session_lifecycle.renew(stack.sessions, settings, held)
    with pytest.raises(FencedOut):
        deployment_lifecycle.renew(stack.sessions, settings, serving, {"requests": 1})
    with stack.sessions() as db:
        stats = db.execute(
            select(deployment_table.c.stats).where(deployment_table.c.id == serving.deployment_id)
        ).scalar()
    assert stats is None  # the refused renewal wrote nothing

    keepers = [SessionKeeper(settings, held), DeploymentKeeper(settings, serving)]
    for keeper in keepers:
        keeper.start()
        keeper.join(timeout=10)
        assert not keeper.is_alive() and keeper.lost, keeper.what
    # The rightful holder renews on.
    assert (
        session_lifecycle.renew(stack.sessions, settings, replace(held, worker="second")).status == "starting"
    )


def worker_owning(workers: list[WorkerProcess], owner: str) -> WorkerProcess:
    """The worker whose pool process is `owner` (host:pid, a job's lease owner)."""
    pid = int(owner.rsplit(":", 1)[1])
    return next(w for w in workers if w.process is not None and os.getpgid(pid) == w.process.pid)


@dataclass(frozen=True)
class Backend:
    """One of a worker's connections, as pg_stat_activity shows it."""

    pid: int
    state: str
    transaction_started: Any  # None outside a transaction
    query: str  # the last statement it ran


def backends_of(watch: psycopg.Connection[Any], worker: WorkerProcess) -> list[Backend]:
    """The worker's connections to the service's database: those whose client port is a socket of
    one of the worker's processes (its main process and its pool's)."""
    assert worker.process is not None
    main = psutil.Process(worker.process.pid)
    ports = set()
    for process in [main, *main.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            ports |= {c.laddr.port for c in process.net_connections(kind="tcp") if c.raddr}
    rows = watch.execute(
        "SELECT pid, client_port, state, xact_start, query FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    return [
        Backend(pid, state or "", started, query or "")
        for pid, port, state, started, query in rows
        if port in ports
    ]


def row_locked(watch: psycopg.Connection[Any], job_id: str) -> bool:
    """Whether another transaction holds the job's row (an UPDATE's lock) right now."""
    try:
        with watch.transaction():
            watch.execute("SELECT id FROM fine_tunes WHERE id = %s FOR NO KEY UPDATE NOWAIT", (job_id,))
    except psycopg.errors.LockNotAvailable:
        return True
    return False


def freeze_inside_a_transaction(stack: Stack, worker: WorkerProcess, job_id: str) -> float:
    """SIGSTOP the worker between an UPDATE of the job's row and its COMMIT: wait until one of its
    connections shows `idle in transaction` after an UPDATE of fine_tunes, stop it, and keep it
    stopped if that transaction is still open and the job's row is locked (else let it go and try
    again). Returns the moment of the freeze (time.monotonic())."""
    with psycopg.connect(stack.database_url, autocommit=True) as watch:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            caught = {
                (b.pid, b.transaction_started)
                for b in backends_of(watch, worker)
                if b.state == "idle in transaction" and b.query.startswith("UPDATE fine_tunes")
            }
            if not caught:
                continue
            worker.freeze()
            frozen_at = time.monotonic()
            time.sleep(0.2)  # (a statement under way runs to its end)
            still = {(b.pid, b.transaction_started) for b in backends_of(watch, worker)}
            if caught & still and row_locked(watch, job_id):
                return frozen_at
            worker.thaw()
    raise AssertionError("the worker was never caught inside a transaction on the job's row")


def open_transactions(stack: Stack) -> int:
    """Connections to the service's database holding a transaction open (besides this one's)."""
    with stack.sessions() as session:
        return int(
            session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
                )
            )
            or 0
        )


def attempt_of(stack: Stack, job_id: str) -> int:
    with stack.sessions() as session:
        return int(session.scalar(select(FineTune.attempt).where(FineTune.id == job_id)) or 0)


def first_lease_lapsed(stack: Stack, job_id: str) -> bool:
    """Whether the job's first attempt's committed lease has lapsed (a read: it never waits on a
    row lock): lapsed now, or already handed on to a second attempt (an idle standby can claim
    the job within a fraction of a second of the lapse, too soon for a poll to see it lapsed)."""
    with stack.sessions() as session:
        lease, attempt = session.execute(
            select(FineTune.lease_until, FineTune.attempt).where(FineTune.id == job_id)
        ).one()
    return attempt > 1 or (lease is not None and lease < utcnow())


def test_a_worker_frozen_inside_a_transaction_holds_up_no_other_jobs_failover(
    stack: Stack, dataset: Path
) -> None:
    """A worker frozen between an UPDATE of its job's row and the COMMIT (SIGSTOP; a paused VM, a
    partition) holds that row locked. The reconcilers must not wait on it: another job, whose worker
    is killed once the frozen job's lease has lapsed, fails over within its lease and a reconciler
    pass while the first worker stays frozen (the reconcilers used to wait on the lock for as long
    as the freeze lasted, and handed on nothing after it). The server ends the frozen transaction
    after half the lease, which frees the row and fences the frozen attempt."""
    lease = 10.0
    stack.stop_worker()  # the workers below must be the only ones
    # The frozen worker renews its lease 20 times a second: more moments inside a transaction to catch.
    frozen = stack.start_standby_worker(RELAY_LEASE_SECONDS=str(lease), RELAY_HEARTBEAT_SECONDS="0.05")
    killed = stack.start_standby_worker(RELAY_LEASE_SECONDS=str(lease))
    for started in (frozen, killed):
        started.wait_ready()
    client = Client(stack.api_url, stack.new_user()[1], max_retries=0)
    standbys: list[WorkerProcess] = []
    jobs: list[FineTuneJob] = []
    try:
        # One job each (long: both are cancelled at the end).
        jobs += [train(tiny(dataset, steps=5000), client=client) for _ in range(2)]
        wait_for(lambda: all(job.refresh().status == "running" for job in jobs), 300, "both jobs to run")
        with stack.sessions() as session:
            owners = dict(
                session.execute(
                    select(FineTune.id, FineTune.lease_owner).where(FineTune.id.in_([j.id for j in jobs]))
                ).all()
            )
        held, other = (
            next(j for j in jobs if worker_owning([frozen, killed], owners[j.id] or "") is w)
            for w in (frozen, killed)
        )
        # Two idle workers to take both jobs over: each takes one (the frozen job is handed on first).
        standbys += [stack.start_standby_worker(RELAY_LEASE_SECONDS=str(lease)) for _ in range(2)]
        for standby in standbys:
            standby.wait_ready()

        frozen_at = freeze_inside_a_transaction(stack, frozen, held.id)
        wait_for(
            lambda: first_lease_lapsed(stack, held.id),
            3 * lease,
            "the frozen job's lease to lapse",
            every=0.1,
        )
        killed.kill()  # the other job's worker and its training process
        killed_at = time.monotonic()
        with stack.sessions() as session:
            other_lease_until = session.scalar(select(FineTune.lease_until).where(FineTune.id == other.id))
        wait_for(
            lambda: attempt_of(stack, other.id) == 2,
            6 * lease,
            "the killed worker's job to be claimed again while the other worker is frozen",
            every=0.05,
        )
        reclaimed_at, reclaimed_on = time.monotonic(), utcnow()
        with psycopg.connect(stack.database_url, autocommit=True) as watch:
            # The server ended the frozen worker's transaction (its attempt fenced): none of the
            # frozen worker's connections is inside one. (The job's row itself may be locked for a
            # moment by the worker that took it over, renewing its lease.)
            assert not any(b.transaction_started for b in backends_of(watch, frozen))
        lapsed_for = (reclaimed_on - (other_lease_until or reclaimed_on)).total_seconds()
        print(
            "\nfrozen inside a transaction, then another job's worker killed: that job was claimed "
            f"again {reclaimed_at - frozen_at:.1f} s after the freeze, {reclaimed_at - killed_at:.1f} s "
            f"after the kill, {lapsed_for:.1f} s after its lease lapsed (lease {lease:.0f} s, "
            f"reconciler every {stack.settings.reconcile_seconds:.0f} s), the other worker still frozen"
        )
    finally:
        frozen.thaw()
        for job in jobs:
            with contextlib.suppress(Exception):
                job.cancel()
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: all(job.refresh().status in ("cancelled", "completed", "error") for job in jobs),
                120,
                "the jobs to end",
            )
        client.close()
        for started in (frozen, killed, *standbys):
            started.stop()


def temporaries(stack: Stack, job_id: str, since: float) -> list[Path]:
    """The job's temporary checkpoint directories made after `since` (a time.time())."""
    root = stack.settings.job_dir(job_id) / "checkpoints"
    found = []
    for path in root.iterdir() if root.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):  # a write that was sealed meanwhile
            if path.name.startswith(".tmp-") and path.stat().st_ctime > since:
                found.append(path)
    return found


def test_a_worker_frozen_past_its_lease_leaves_its_successors_checkpoint_alone(
    stack: Stack, dataset: Path
) -> None:
    """The frozen attempt wakes while its successor is in the middle of a checkpoint write and tidies
    up as it stops: the successor's temporary directory must survive, and its save with it."""
    steps = 240
    stack.stop_worker()  # the two workers below must be the only ones to read the jobs' queue
    # (The successor is held still below while the thawed worker stops: in a full run's load that
    # once took over 10 s, the held successor's lease lapsed, and a third attempt rightly tidied its
    # write away; a 30 s lease keeps the job the successor's.) Leases renewed 20 times a second:
    # more moments inside a transaction, for the freeze to catch.
    settings = {"RELAY_LEASE_SECONDS": "30", "RELAY_HEARTBEAT_SECONDS": "0.05"}
    workers = [stack.start_standby_worker(**settings) for _ in range(2)]
    for started in workers:
        started.wait_ready()
    client = Client(stack.api_url, stack.new_user()[1], max_retries=0)
    try:
        # Long enough that the job is still running when the freeze lands on a loaded machine (80 steps
        # once finished between the first checkpoint's event and the SIGSTOP, and no successor came).
        job = train(tiny(dataset, steps=steps), client=client)
        wait_for(lambda: checkpoint_steps(stack, job.id), 300, "the job's first checkpoint", every=0.05)
        with stack.sessions() as session:
            owner = session.scalar(select(FineTune.lease_owner).where(FineTune.id == job.id))
        frozen = worker_owning(workers, owner or "")
        successor = next(w for w in workers if w is not frozen)
        # Between an UPDATE of the job's row and its COMMIT: the row stays locked until the server
        # ends that transaction, and the successor's claim must not wait for the thaw.
        freeze_inside_a_transaction(stack, frozen, job.id)
        frozen_at = time.time()  # what the frozen worker had begun to write is older
        assert job.refresh().status == "running", "the job ended before the freeze; make it longer"
        wait_for(lambda: job.refresh().to_dict()["attempts"] == 2, 120, "the successor's claim", every=0.1)
        # Catch the successor in the middle of a checkpoint write (the frozen worker writes nothing).
        while True:
            writing = lambda: temporaries(stack, job.id, frozen_at)  # noqa: E731
            wait_for(writing, 300, "the successor's next checkpoint write", every=0.002)
            successor.freeze()
            time.sleep(0.2)  # (a statement under way runs to its end)
            caught = writing()
            if caught and not open_transactions(stack):
                break
            successor.thaw()  # it finished meanwhile, or holds a lock: the next one
        frozen.thaw()
        stopped = f"{job.id}: attempt 1 no longer owns the job; stopping"
        wait_for(lambda: stopped in frozen.log_since_start(), 60, "the thawed worker to stop", every=0.05)
        surviving = [path for path in caught if path.exists()]
        attempts = job.refresh().to_dict()["attempts"]
        successor.thaw()
        assert attempts == 2, "the held successor's lease lapsed (a third attempt may tidy its write)"
        assert surviving == caught, "the fenced-out attempt removed its successor's checkpoint write"

        job.wait(poll=0.5, timeout=300)
        assert job.status == "completed" and job.step == steps, (job.to_dict(), successor.log_tail())
        assert job.to_dict()["attempts"] == 2
        events = job.events()
        assert [e["attempt"] for e in events if e.get("event") == "retry"] == [2]
        assert [e["step"] for e in events if e.get("event") == "checkpoint"] == list(range(10, steps + 1, 10))
    finally:
        client.close()
        for started in workers:
            started.thaw()
            started.stop()


def test_a_disk_that_fills_during_the_first_checkpoint_ends_the_job_once_saying_so(
    stack: Stack, dataset: Path
) -> None:
    """The first checkpoint has no earlier one to size the free-space check by, so it starts, and
    the disk fills while torch writes it: torch raises a CheckpointException (a BaseException)."""
    with small_disk("1m") as disk:  # a pi05-tiny checkpoint takes about 2.4 MB
        stack.stop_worker()  # the job must reach the worker whose jobs directory is on the small disk
        worker = stack.start_standby_worker(RELAY_HOME=str(disk))
        client = Client(stack.api_url, stack.new_user()[1], max_retries=0)
        try:
            worker.wait_ready()
            job = train(tiny(dataset, steps=20), client=client)
            with pytest.raises(
                RuntimeError,
                match=r"no space left on device at the service's jobs directory \(at ft-\w+/checkpoints",
            ):
                job.wait(poll=0.5, timeout=300)
            assert job.status == "error"
            assert "the disk filled up while writing a checkpoint" in (job.error or "")
            assert (job.error or "").endswith(
                "no checkpoint is complete yet (this was the first), so there is none to resume from"
            )
            assert job.to_dict()["attempts"] == 1  # not retried: the same disk would fail the same way
            events = job.events()
            assert [e["event"] for e in events if e.get("event") in ("retry", "error")] == ["error"]
            assert not checkpoint_steps(stack, job.id)
        finally:
            client.close()
            worker.stop()
