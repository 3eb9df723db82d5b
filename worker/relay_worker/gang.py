"""A job of more GPUs than one worker has: several workers run it together, as a gang.

Each worker that a delivery of such a job reaches takes a seat (a row of fine_tune_hosts) for as
many of the job's processes as it has slots, while the job stays queued, and publishes one more
wake-up for the next host while seats are missing. The seat that completes the job's `gpus` starts
the job: it becomes `running` as attempt `round`, the fencing token every host of the gang holds.
Seat 0 serves the launcher's c10d rendezvous; its endpoint is written in every seat.

If the seats do not add up within `gang_wait_seconds` of the first, the first host to notice
deletes them all: the hosts go back to other work, and the job stays queued (the give-back is not
a failed attempt). Such a host then starts no new gathering for the job for `gang_wait_seconds`
(the wake-ups it sent would seat it again at once, alone, holding it from every other job); the
reconciler publishes the job again later. It still takes a seat when other hosts are seated: that
gathering may form now, and must not wait for this host's window.

No host takes a seat while the live workers (their heartbeats) have fewer slots than the job needs:
the gang could not form, and a seat would only hold a worker from jobs it can run. The job is
parked instead (queued, with no message in the broker), and the reconciler publishes it once the
live workers could hold it. Each step is a short transaction that locks the job's row, so seats, the start
and the give-back never cross.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, delete, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from relay.sft import status as st
from relay_api.db import database_now, rows_changed, with_retries
from relay_api.models import fine_tune_hosts, fine_tunes
from relay_api.settings import Settings
from relay_api.workers import live_workers
from relay_worker.lifecycle import LIVE, Claim, claimable

log = logging.getLogger("relay_worker")

POLL_SECONDS = 0.2
# Per process: job -> when this host may take a seat in its gang again, after its gang gave up.
_backing_off: dict[str, float] = {}


def live_slots(db_sessions: sessionmaker[Session], settings: Settings) -> int:
    """The slots of the live workers (heartbeats), this one's included (its beat may be late)."""

    def run() -> int:
        with db_sessions() as db:
            slots = sum(worker.gpus for worker in live_workers(db, settings.reconcile_seconds))
        return max(slots, settings.worker_slots)

    return with_retries(run)


def park(db_sessions: sessionmaker[Session], job_id: str) -> None:
    """Note that the job waiting for a gang has no message in the broker (this one is consumed):
    the reconciler publishes it again once the live workers could hold it."""

    def run() -> None:
        with db_sessions() as db:
            db.execute(
                update(fine_tunes)
                .where(
                    fine_tunes.c.id == job_id,
                    fine_tunes.c.status.in_((st.QUEUED, st.RUNNING)),
                    fine_tunes.c.lease_until.is_(None),
                )
                .values(enqueued_at=None)
            )
            db.commit()

    with_retries(run)


def backing_off(job_id: str) -> bool:
    """Whether this host's gang for the job gave up a moment ago, so it should not start a new
    gathering yet (it still joins one that other hosts have started: `gathering_elsewhere`)."""
    until = _backing_off.get(job_id)
    if until is not None and time.monotonic() >= until:
        del _backing_off[job_id]
        return False
    return until is not None


def leave_alone(job_id: str, seconds: float) -> None:
    """Start a new gathering for the job from this host only after `seconds` (its gang gave up)."""
    _backing_off[job_id] = time.monotonic() + seconds


def gathering_elsewhere(
    db_sessions: sessionmaker[Session], settings: Settings, job_id: str, worker: str
) -> bool:
    """Whether other hosts hold seats in the job's next gang now: a gathering is under way, and
    this host's seat brings the gang closer to forming (or forms it), so it must not wait out its
    leave-alone window. The window is there only to stop a host from seating again, alone, from the
    wake-ups it sent itself."""

    def run() -> bool:
        now = database_now(db_sessions)
        with db_sessions() as db:
            attempt = db.execute(
                select(fine_tunes.c.attempt).where(fine_tunes.c.id == job_id, claimable(settings, now))
            ).scalar()
            seated = 0
            if attempt is not None:
                seated = (
                    db.scalar(
                        select(func.count())
                        .select_from(fine_tune_hosts)
                        .where(
                            fine_tune_hosts.c.job_id == job_id,
                            fine_tune_hosts.c.round == attempt + 1,
                            fine_tune_hosts.c.worker != worker,
                        )
                    )
                    or 0
                )
            db.rollback()
        return seated > 0

    return with_retries(run)


@dataclass(frozen=True)
class Seat:
    """This worker's place in a job's gang."""

    job_id: str
    round: int  # the attempt the gang runs as once complete
    seat: int  # 0 serves the rendezvous
    worker: str
    processes: int
    endpoint: str  # host:port of the rendezvous


@dataclass(frozen=True)
class Gang:
    """A gang that has started: this host's claim of the job, its seat, and how many hosts there are."""

    claim: Claim
    seat: Seat
    hosts: int


def rendezvous_endpoint(settings: Settings) -> str:
    """host:port for a new gang's rendezvous, on this host: a port free now (the launcher binds it
    moments later)."""
    address = settings.worker_address or socket.getfqdn()
    with socket.socket() as probe:
        probe.bind((settings.worker_address or "", 0))
        port = probe.getsockname()[1]
    return f"{address}:{port}"


def take_seat(
    db_sessions: sessionmaker[Session], settings: Settings, job_id: str, worker: str
) -> tuple[Seat, bool] | None:
    """Take a seat in the job's gang with this worker's slots; (the seat, whether it completed the
    gang and so started the job), or None when the job cannot be taken (started, ended, full)."""

    def run() -> tuple[Seat, bool] | None:
        now = database_now(db_sessions)
        with db_sessions() as db:
            job = db.execute(
                select(fine_tunes.c.attempt, fine_tunes.c.config)
                .where(fine_tunes.c.id == job_id, claimable(settings, now))
                .with_for_update()
            ).first()
            if job is None:
                db.rollback()
                return None
            round_ = job.attempt + 1
            seats = _seats_of_round(db, job_id, round_)
            gpus = int(job.config.get("gpus") or 1)
            taken = sum(seat.processes for seat in seats)
            if taken >= gpus or any(seat.worker == worker for seat in seats):
                db.rollback()
                return None
            seat = Seat(
                job_id=job_id,
                round=round_,
                seat=len(seats),
                worker=worker,
                processes=min(settings.worker_slots, gpus - taken),
                endpoint=seats[0].endpoint if seats else rendezvous_endpoint(settings),
            )
            _insert_seat(db, seat, now)
            complete = taken + seat.processes == gpus
            if complete:
                _start_gang(db, settings, seat, [row.worker for row in seats] + [worker], now)
            db.commit()
            return seat, complete

    return with_retries(run)


def _seats_of_round(db: Session, job_id: str, round_: int) -> Sequence[Row[Any]]:
    """The seats taken in the job's gang for `round_`, by seat; those of earlier rounds are deleted
    (they belong to gangs that ran, or gave up, already)."""
    db.execute(
        delete(fine_tune_hosts).where(fine_tune_hosts.c.job_id == job_id, fine_tune_hosts.c.round < round_)
    )
    return db.execute(
        select(fine_tune_hosts)
        .where(fine_tune_hosts.c.job_id == job_id, fine_tune_hosts.c.round == round_)
        .order_by(fine_tune_hosts.c.seat)
    ).all()


def _insert_seat(db: Session, seat: Seat, now: dt.datetime) -> None:
    """Write this worker's seat (a row of fine_tune_hosts)."""
    db.execute(
        insert(fine_tune_hosts).values(
            job_id=seat.job_id,
            round=seat.round,
            seat=seat.seat,
            worker=seat.worker,
            processes=seat.processes,
            endpoint=seat.endpoint,
            joined_at=now,
        )
    )


def _start_gang(db: Session, settings: Settings, seat: Seat, hosts: list[str], now: dt.datetime) -> None:
    """Start the job as the complete gang's round, leased to the gang of `hosts`."""
    # Until rank 0's host renews it: the launch and the rendezvous (which waits up to
    # gang_wait_seconds for every host) come first.
    first_lease = settings.lease_seconds + settings.gang_wait_seconds
    db.execute(
        update(fine_tunes)
        .where(fine_tunes.c.id == seat.job_id)
        .values(
            status=st.RUNNING,
            attempt=seat.round,
            lease_until=now + dt.timedelta(seconds=first_lease),
            lease_lapsed_at=None,
            lease_owner=("gang: " + ", ".join(hosts))[:255],
            updated_at=now,
            last_failure=None,
            started_at=func.coalesce(fine_tunes.c.started_at, now),
        )
    )


def wait_for_gang(
    db_sessions: sessionmaker[Session],
    settings: Settings,
    seat: Seat,
    give_up: Callable[[], bool],
) -> Gang | None:
    """Wait until the gang is complete (the job started as its round): this host's part of it. None
    when the seats were given back (too slow, by this host or another), the job moved on without
    this gang (cancelled, or taken by a worker that runs it alone), or `give_up()` (shutdown)."""
    while True:
        look = with_retries(lambda: _look(db_sessions, settings, seat))
        if isinstance(look, Gang):
            return look
        if look == "forming" and not give_up():
            time.sleep(POLL_SECONDS)
            continue
        if look != "forming":  # the gang is not coming (or the job moved on): not again soon
            leave_alone(seat.job_id, settings.gang_wait_seconds)
        if look != "gone":
            reason = "this worker shuts down" if look == "forming" else look
            if with_retries(lambda: give_back(db_sessions, seat)):
                log.info("%s: gave the gang's hosts back (%s); the job stays queued", seat.job_id, reason)
        return None


def _look(db_sessions: sessionmaker[Session], settings: Settings, seat: Seat) -> Gang | str:
    """The gang as it stands: a Gang once started; "forming"; "gone" when this seat was given
    back; otherwise why the seats should be given back."""
    now = database_now(db_sessions)
    with db_sessions() as db:
        job = db.execute(
            select(
                fine_tunes.c.status,
                fine_tunes.c.attempt,
                fine_tunes.c.user_id,
                fine_tunes.c.config,
                fine_tunes.c.step,
            ).where(fine_tunes.c.id == seat.job_id)
        ).first()
        seats = db.execute(
            select(fine_tune_hosts)
            .where(fine_tune_hosts.c.job_id == seat.job_id, fine_tune_hosts.c.round == seat.round)
            .order_by(fine_tune_hosts.c.seat)
        ).all()
        db.rollback()
    if job is None or not any(row.seat == seat.seat and row.worker == seat.worker for row in seats):
        return "gone"
    gpus = int(job.config.get("gpus") or 1)
    if job.attempt == seat.round and job.status in LIVE and sum(row.processes for row in seats) == gpus:
        claim = Claim(seat.job_id, seat.round, job.user_id, job.config, job.step)
        return Gang(claim, seat, len(seats))
    if job.attempt >= seat.round or job.status not in (st.QUEUED, st.RUNNING):
        return f"the job moved on without this gang: it is {job.status}, attempt {job.attempt}"
    deadline = seats[0].joined_at + dt.timedelta(seconds=settings.gang_wait_seconds)
    if now > deadline:
        arrived = sum(row.processes for row in seats)
        return (
            f"{arrived} of its {gpus} GPUs arrived within {settings.gang_wait_seconds:g} s "
            f"({len(seats)} host(s))"
        )
    return "forming"


def give_back(db_sessions: sessionmaker[Session], seat: Seat) -> int:
    """Delete every seat of the gang's round, unless the gang started meanwhile; how many went."""
    with db_sessions() as db:
        attempt: Any = db.execute(
            select(fine_tunes.c.attempt).where(fine_tunes.c.id == seat.job_id).with_for_update()
        ).scalar()
        if attempt == seat.round:  # it started: the seats are the running gang's
            db.rollback()
            return 0
        gone = rows_changed(
            db.execute(
                delete(fine_tune_hosts).where(
                    fine_tune_hosts.c.job_id == seat.job_id, fine_tune_hosts.c.round == seat.round
                )
            )
        )
        db.commit()
    return gone
