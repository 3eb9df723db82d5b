"""Run one recipe job: claim it, keep the lease, run the engine, write events and the end.

The engine's `on_event` writes each event as this attempt (refused once a newer attempt owns the
job, which stops the engine); `should_stop` reads the cancel flag that the lease keeper refreshes.
A user's mistake (EngineError, DatasetError) ends the job in `error` with the engine's message; any
other failure gives the job back for another attempt, which resumes from the last checkpoint.

A job of more GPUs than this worker has runs on a gang of workers (relay_worker.gang): this worker
takes a seat, waits for the rest, and runs its part of the job's processes. Of the gang's hosts,
only the one holding rank 0 writes the job's events, lease renewals and end; the others only watch
the job (a cancel) until their processes end.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from relay.checkpoints import is_fine_tune_id
from relay.events import Event, MetricsEvent, RecipeResult
from relay.sft.status import COMPLETED
from relay_api.db import is_outage, worker_session_factory
from relay_api.files import output_manifest
from relay_api.models import fine_tunes
from relay_api.settings import Settings, get_settings
from relay_api.tracker_credentials import tracker_secrets_of
from relay_api.workers import live_workers
from relay_engine.core.checkpoint import CheckpointStore
from relay_engine.errors import EngineError
from relay_engine.paths import cache_dir_or_default
from relay_engine.recipe import Recipe, run_recipe
from relay_worker import admission, heartbeat, lifecycle, shutdown
from relay_worker import gang as gangs
from relay_worker.database_snapshot import with_snapshot
from relay_worker.gang import Gang
from relay_worker.hub_push import push_after_run
from relay_worker.journal import EventJournal
from relay_worker.launched import Rendezvous, Role, run_on_processes
from relay_worker.leases import FencedOut
from relay_worker.lifecycle import Claim

log = logging.getLogger("relay_worker")
T = TypeVar("T")


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaseKeeper(threading.Thread):
    """Keeps the claim alive and writes the engine's events, riding out a database outage.

    The engine's events go into a buffer that this thread writes in order (each write renews the
    lease); with none to write, it renews the lease every `heartbeat_seconds`. When the database is
    away, training goes on and the events wait, until the lease would lapse: past that point another
    attempt may own the job, so training stops (`outage` says why). A cancel or a lost claim is noted
    for `should_stop`.
    """

    def __init__(self, settings: Settings, claim: Claim) -> None:
        super().__init__(name=f"lease-{claim.job_id}", daemon=True)
        self.settings = settings
        self.claim = claim
        self.db_sessions = worker_session_factory(settings)
        self.cancel_requested = False
        self.lost = False
        # Set when the database was away for as long as the lease: the message for the job.
        self.outage: str | None = None
        self._pending: collections.deque[Event] = collections.deque()
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        # When the last write that renewed the lease was sent (the claim itself renewed it).
        self._renewed_at = time.monotonic()
        self._away_since: float | None = None
        # False on a gang's host that does not hold rank 0: it reads the job, never writes it.
        self.writes = True

    def follow(self) -> None:
        """From now on only watch the job (a cancel, a newer attempt); rank 0's host keeps the lease."""
        self.writes = False

    def add_event(self, event: Event) -> None:
        """Queue one of the engine's events; it is written at once, or when the database is back."""
        self._pending.append(event)
        self._wake.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.settings.heartbeat_seconds)
            self._wake.clear()
            if self._stopping.is_set() or self.lost or self.outage:
                return
            if self.writes:
                self.sync(renew=True)
            else:
                self._watch()

    def _watch(self) -> None:
        try:
            self.note(lifecycle.observe(self.db_sessions, self.claim))
        except FencedOut:
            self.lost = True
        except SQLAlchemyError as error:
            if not is_outage(error):
                raise
            # Rank 0's host keeps the lease; this host's processes end with the group's.

    def sync(self, renew: bool) -> bool:
        """Write the buffered events (and renew the lease if none were due and `renew`); True when
        nothing is left to write. A database outage leaves them buffered."""
        with self._write_lock:
            wrote = False
            try:
                while self._pending and not self.lost:
                    sent = time.monotonic()
                    self.note(
                        lifecycle.record_event(self.db_sessions, self.settings, self.claim, self._pending[0])
                    )
                    self._pending.popleft()
                    self._contact(sent)
                    wrote = True
                if renew and not wrote and not self.lost:
                    sent = time.monotonic()
                    self.note(lifecycle.renew(self.db_sessions, self.settings, self.claim))
                    self._contact(sent)
            except FencedOut:
                self.lost = True
            except SQLAlchemyError as error:
                if not is_outage(error):
                    raise
                self._database_away(error)
            return not self._pending

    def until_lease_lapses(self, operation: Callable[[], T]) -> T:
        """Run a write of the job's end, again and again while the database is away, as long as the
        lease holds; then raise FencedOut (another attempt may own the job by now)."""
        while True:
            try:
                return operation()
            except SQLAlchemyError as error:
                if not is_outage(error):
                    raise
                self._database_away(error)
                if self.outage:
                    raise FencedOut(self.claim.job_id) from None
                time.sleep(min(1.0, self.settings.heartbeat_seconds))

    def flush(self) -> None:
        """Write every buffered event before the job's end is written (the end comes last); raise
        FencedOut when the claim is lost, or the lease lapses while the database is away."""
        while not self.sync(renew=False):
            if self.lost or self.outage:
                raise FencedOut(self.claim.job_id)
            time.sleep(min(1.0, self.settings.heartbeat_seconds))
        if self.lost:
            raise FencedOut(self.claim.job_id)

    def _contact(self, sent: float) -> None:
        if self._away_since is not None:
            log.warning(
                "%s: the database is back after %.1f s",
                self.claim.job_id,
                time.monotonic() - self._away_since,
            )
        self._renewed_at = sent
        self._away_since = None

    def _database_away(self, error: SQLAlchemyError) -> None:
        now = time.monotonic()
        if self._away_since is None:
            self._away_since = now
            log.warning(
                "%s: the database is unreachable; training goes on and %d event(s) wait (%s)",
                self.claim.job_id,
                len(self._pending),
                str(error).splitlines()[0] if str(error) else type(error).__name__,
            )
        # Stop a little before the lease lapses, so no write of ours lands after another attempt's claim.
        if now - self._renewed_at >= self.settings.lease_seconds * 0.9:
            self.outage = (
                f"the service's database was unreachable for {now - self._away_since:.0f} s, as long as "
                f"the job's lease ({self.settings.lease_seconds:.0f} s); this attempt stopped so that "
                "another could resume the job from its last checkpoint (not a fault of the job)"
            )

    def note(self, state: lifecycle.JobState) -> None:
        if state.cancel_requested:
            self.cancel_requested = True

    def should_stop(self) -> bool:
        return self.cancel_requested or self.lost or self.outage is not None or shutdown.under_way()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()


def run_fine_tune(
    job_id: str, settings: Settings | None = None, publish: Callable[[str], None] | None = None
) -> str:
    """Run the job if this delivery can claim it; returns what happened, for the task's log.

    `publish` wakes another worker up for the job (a gang that still misses hosts)."""
    settings = settings or get_settings()
    if shutdown.under_way():
        # A worker on its way out would give the job straight back, and take the next delivery
        # again: leave it to the others, and make sure one of them hears of it.
        if publish is not None:
            time.sleep(1.0)
            publish(job_id)
        return "not claimed: this worker is shutting down"
    db_sessions = worker_session_factory(settings)
    config = lifecycle.stored_config(db_sessions, job_id)
    if config is None:
        return "not claimed: no such job"
    refused = admission.refusal(config, settings, heartbeat.this_workers_gpu_memory(settings))
    if refused is not None:
        return _refuse(settings, db_sessions, job_id, config, refused, publish)
    gpus = int(config.get("gpus") or 1)
    gang: Gang | None = None
    claim: Claim | None
    if gpus > settings.worker_slots:
        gang = _join_gang(settings, db_sessions, job_id, gpus, publish)
        if gang is None:
            return "no gang: the job is taken or ended, its gang cannot form now, or it gave up"
        claim = gang.claim
    else:
        claim = lifecycle.claim(db_sessions, settings, job_id, worker_name())
    if claim is None:
        return "not claimed: the job is taken, ended, or out of attempts"
    log.info("%s: attempt %d starts at step %d", job_id, claim.attempt, claim.step)
    keeper = LeaseKeeper(settings, claim)
    keeper.start()
    try:
        return _train(settings, db_sessions, claim, keeper, gang)
    except FencedOut:
        if keeper.outage:
            return _give_back_after_outage(db_sessions, settings, claim, keeper.outage)
        log.warning("%s: attempt %d no longer owns the job; stopping", job_id, claim.attempt)
        return "fenced out"
    finally:
        keeper.stop()


def _refuse(
    settings: Settings,
    db_sessions: Any,
    job_id: str,
    config: dict[str, Any],
    reason: str,
    publish: Callable[[str], None] | None,
) -> str:
    """A job this worker cannot hold: left to a live worker that can (published again for it),
    else ended at once with `reason` (the attempt it takes is its last: nothing retries it)."""
    with db_sessions() as db:
        workers = live_workers(db, settings.reconcile_seconds)
    if admission.another_can_hold(config, settings, workers):
        if publish is not None:
            time.sleep(1.0)  # so that the next delivery may reach the worker that can
            publish(job_id)
        return "not claimed: this worker cannot hold it; left to a live worker that can"
    claim = lifecycle.claim(db_sessions, settings, job_id, worker_name())
    if claim is None:
        return "not claimed: the job is taken, ended, or out of attempts"
    log.info("%s: refused: %s", job_id, reason)
    lifecycle.fail(db_sessions, claim, reason)
    return "refused: this worker cannot hold it, and no live worker can"


def _join_gang(
    settings: Settings, db_sessions: Any, job_id: str, gpus: int, publish: Callable[[str], None] | None
) -> Gang | None:
    """Take a seat in the job's gang and wait for the rest of its hosts; None if it did not start.

    No seat when the gang cannot form (the live workers have too few slots; the job is parked until
    they have), nor while this host backs off after its gang gave up, unless other hosts are seated
    now (then the gang may form at once): a seat would hold this worker from jobs it can run."""
    if gangs.backing_off(job_id) and not gangs.gathering_elsewhere(
        db_sessions, settings, job_id, worker_name()
    ):
        # This delivery is consumed: parked, the job is published again by the reconciler, so a
        # worker that can run it (one with the slots, or a gang of others) hears of it.
        gangs.park(db_sessions, job_id)
        log.info("%s: this host's gang for the job gave up a moment ago; leaving it to others", job_id)
        return None
    slots = gangs.live_slots(db_sessions, settings)
    if slots < gpus:
        gangs.park(db_sessions, job_id)
        log.info(
            "%s: the live workers have %d slot(s) of the %d its gang needs; it waits", job_id, slots, gpus
        )
        return None
    taken = gangs.take_seat(db_sessions, settings, job_id, worker_name())
    if taken is None:
        return None
    seat, complete = taken
    log.info(
        "%s: took seat %d of the gang of attempt %d (%d process(es))%s",
        job_id,
        seat.seat,
        seat.round,
        seat.processes,
        "; the gang is complete" if complete else "; waiting for the other hosts",
    )
    if not complete and publish is not None:
        publish(job_id)  # wakes the next host; one that finds the gang full does nothing
    return gangs.wait_for_gang(db_sessions, settings, seat, shutdown.under_way)


def _give_back_after_outage(db_sessions: Any, settings: Settings, claim: Claim, reason: str) -> str:
    """The database was away as long as the lease: say why this attempt ended, once it is back
    (unless a newer attempt owns the job by then), without counting it against the job.

    Tried until the database answers, however long the outage: a job whose hand-back never lands
    looks like one whose worker died, which counts. Only this worker's shutdown ends the wait (the
    reconcilers then wait a lease after the database is back before judging the job; see
    relay_worker.app)."""
    log.warning("%s: attempt %d stopped: %s", claim.job_id, claim.attempt, reason)
    while not shutdown.under_way():
        try:
            lifecycle.hand_back(db_sessions, claim, reason)
            return "given back after a database outage"
        except SQLAlchemyError as error:
            if not is_outage(error):
                raise
            time.sleep(min(1.0, settings.heartbeat_seconds))
    return "stopped by a database outage; the worker shut down before the database was back"


def _train(settings: Settings, db_sessions: Any, claim: Claim, keeper: LeaseKeeper, gang: Gang | None) -> str:
    work_dir = settings.job_dir(claim.job_id)
    work_dir.mkdir(parents=True, exist_ok=True)
    # The claim's fencing token says no older attempt owns the job: what it left half-written is litter.
    # The store removes only this attempt's temporaries and older ones, never a newer attempt's: this
    # attempt may have been frozen past its lease and be tidying while its successor writes.
    # Of a gang, seat 0 tidies before its launch (no process runs before every host has joined), and
    # only rank 0's host after: another host's processes may end before rank 0 renamed its last write.
    checkpoints = CheckpointStore(work_dir / "checkpoints", attempt=claim.attempt)
    if gang is None or gang.seat.seat == 0:
        for leftover in checkpoints.remove_temporaries():
            log.info("%s: removed %s, left by an interrupted checkpoint write", claim.job_id, leftover.name)
    role = Role()
    try:
        return _run(settings, db_sessions, claim, keeper, work_dir, gang, role)
    finally:
        if gang is None or role.main:
            checkpoints.remove_temporaries()


class _JobEvents:
    """The engine's events on their way out: each goes to the journal first (should the database be
    away until this attempt stops), then to the lease keeper, which writes it as this attempt."""

    def __init__(self, claim: Claim, keeper: LeaseKeeper, work_dir: Path) -> None:
        self.claim = claim
        self.keeper = keeper
        self.work_dir = work_dir
        self.journal = EventJournal(work_dir)
        # The job's `loss` is the latest metrics event's: the mean over its window of steps, never
        # one step's loss, so the job and its events show one quantity.
        self.latest_metrics: MetricsEvent | None = None

    def on_event(self, event: Event) -> None:
        if isinstance(event, MetricsEvent):
            self.latest_metrics = event
        self.journal.append(event)
        self.keeper.add_event(event)

    def replay_unwritten(self) -> None:
        """What an earlier attempt noted but never wrote (a database outage stopped it), up to the
        checkpoint this attempt resumes from, and that checkpoint's event (its attempt may have
        stopped before noting it); the engine then reports that it resumed."""
        if self.claim.attempt <= 1:
            return
        resumes_from = _last_checkpoint_step(self.work_dir)
        if resumes_from is not None:
            for event in self.journal.to_replay(self.claim.step, resumes_from):
                self.keeper.add_event(event)

    def on_role(self, main: bool) -> None:
        """A gang's host learns whether it holds rank 0: it writes the job from then on, or only watches."""
        if not main:
            self.keeper.follow()
        else:
            self.replay_unwritten()


def _run(
    settings: Settings,
    db_sessions: Any,
    claim: Claim,
    keeper: LeaseKeeper,
    work_dir: Path,
    gang: Gang | None,
    role: Role,
) -> str:
    """Run the engine for this attempt and write how it ended."""
    events = _JobEvents(claim, keeper, work_dir)
    if gang is None:
        events.replay_unwritten()
    role.on_known = events.on_role
    try:
        result = _run_engine(settings, claim, keeper, work_dir, gang, role, events.on_event)
    except FencedOut:
        raise
    except Exception as error:
        return _end_after_failure(settings, db_sessions, claim, keeper, gang, role, error)
    if result is None:
        log.info("%s: this host's processes ended; rank 0's host writes the job's end", claim.job_id)
        return "this host's part of the gang ended"
    if result.status == "completed" and claim.config.get("hub") and not (keeper.lost or keeper.outage):
        # A recipe's hub block: pushed before the job is written completed; never fails it.
        push_after_run(db_sessions, claim, result, keeper.flush, events.on_event)
    return _end_after_run(db_sessions, claim, keeper, work_dir, result, events.latest_metrics)


def _run_engine(
    settings: Settings,
    claim: Claim,
    keeper: LeaseKeeper,
    work_dir: Path,
    gang: Gang | None,
    role: Role,
    on_event: Callable[[Event], None],
) -> RecipeResult | None:
    """The recipe, in this process or as a group of processes (several GPUs, or a gang's part of
    them); None on a gang's host that does not hold rank 0 (rank 0's host has the result)."""
    # A database URL becomes the job's snapshot of it (taken by the first attempt, read by all).
    config = with_snapshot(claim.config, keeper.db_sessions, claim.job_id, work_dir, on_event)
    recipe = Recipe.from_config(
        config,
        checkpoint_every=settings.checkpoint_every,
        attempt=claim.attempt,
        job_id=claim.job_id,
        checkpoint_output=parent_output(keeper.db_sessions, claim.job_id, config.get("from_checkpoint")),
    )
    processes = gang.seat.processes if gang is not None else int(claim.config.get("gpus") or 1)
    # The keys given with the job's integrations, held apart from it (relay_api.tracker_credentials).
    keys = tracker_secrets_of(keeper.db_sessions, claim.job_id)
    if gang is None and processes == 1:
        return run_recipe(
            recipe,
            work_dir,
            on_event=on_event,
            should_stop=keeper.should_stop,
            dataset_cache_dir=settings.dataset_cache_dir,
            tracker_secrets=keys,
        )
    return run_on_processes(
        recipe,
        processes,
        work_dir,
        settings.dataset_cache_dir,
        on_event,
        keeper.should_stop,
        rendezvous=_rendezvous(settings, gang) if gang is not None else None,
        role=role,
        environment=keys,
    )


def parent_output(db_sessions: Any, job_id: str, from_checkpoint: Any) -> str | None:
    """The output directory of the fine-tune a job's from_checkpoint names (None for a repo or a
    directory, which the engine reads itself): a completed job of the same owner, as the API checked
    at create. One that is no longer so (deleted since) fails the job once, in one sentence."""
    owner = select(fine_tunes.c.user_id).where(fine_tunes.c.id == job_id).scalar_subquery()
    return completed_output(db_sessions, owner, from_checkpoint, "this job's owner")


def completed_output(db_sessions: Any, owner: Any, from_checkpoint: Any, whose: str) -> str | None:
    """The output directory of the completed fine-tune `from_checkpoint` names, of the user `owner`
    (a value or a scalar subquery); None when it names no fine-tune; EngineError when it is none of
    that user's completed ones (a job or a session then ends once, in this sentence)."""
    if not isinstance(from_checkpoint, str) or not is_fine_tune_id(from_checkpoint):
        return None
    with db_sessions() as db:
        row = db.execute(
            select(fine_tunes.c.status, fine_tunes.c.output_dir).where(
                fine_tunes.c.id == from_checkpoint, fine_tunes.c.user_id == owner
            )
        ).first()
    if row is None or row.status != COMPLETED or not row.output_dir:
        raise EngineError(
            f"bad from_checkpoint: {from_checkpoint} is not a completed fine-tune of {whose} "
            "(training starts from a completed job's weights)"
        )
    return str(row.output_dir)


def _write_end(keeper: LeaseKeeper, operation: Callable[[], T]) -> T:
    """Write the job's end as this attempt: after every buffered event, riding out an outage while
    the lease holds."""
    keeper.flush()
    return keeper.until_lease_lapses(operation)


def _end_after_failure(
    settings: Settings,
    db_sessions: Any,
    claim: Claim,
    keeper: LeaseKeeper,
    gang: Gang | None,
    role: Role,
    error: Exception,
) -> str:
    """A user's mistake ends the job in `error`; any other failure gives it back for another attempt."""
    if isinstance(error, EngineError):
        log.info("%s: ends in error: %s", claim.job_id, error)
        message = public_message(str(error), settings)
        return _write_end(keeper, lambda: lifecycle.fail(db_sessions, claim, message))
    if gang is not None and role.main is False:
        log.warning("%s: the gang's processes failed; rank 0's host gives the job back", claim.job_id)
        return "the gang failed"
    log.exception("%s: attempt %d failed; giving the job back", claim.job_id, claim.attempt, exc_info=error)
    reason = public_message(f"{type(error).__name__}: {error}", settings)
    _write_end(keeper, lambda: lifecycle.release(db_sessions, claim, reason))
    return "given back"


def _end_after_run(
    db_sessions: Any,
    claim: Claim,
    keeper: LeaseKeeper,
    work_dir: Path,
    result: RecipeResult,
    latest_metrics: MetricsEvent | None,
) -> str:
    """The engine returned: completed, cancelled, or stopped for this worker's shutdown."""
    if keeper.lost or keeper.outage:
        raise FencedOut(claim.job_id)
    if result.status == "completed":
        assert result.output_dir is not None
        files = output_manifest(work_dir, Path(result.output_dir))
        loss = _finite(latest_metrics.loss if latest_metrics is not None else result.loss)
        output_dir = str(result.output_dir)
        return _write_end(
            keeper, lambda: lifecycle.complete(db_sessions, claim, result.step, loss, output_dir, files)
        )
    if keeper.cancel_requested:
        return _write_end(keeper, lambda: lifecycle.cancelled(db_sessions, claim, result.step))
    _write_end(keeper, lambda: lifecycle.hand_back(db_sessions, claim))
    log.info("%s: stopped at step %d for the worker's shutdown; given back", claim.job_id, result.step)
    return "given back"


def _rendezvous(settings: Settings, gang: Gang) -> Rendezvous:
    return Rendezvous(
        hosts=gang.hosts,
        endpoint=gang.seat.endpoint,
        run_id=f"{gang.claim.job_id}-{gang.claim.attempt}",
        serves=gang.seat.seat == 0,
        join_timeout_seconds=settings.gang_wait_seconds,
        local_addr=settings.worker_address,
        # Per attempt: a launcher of an older attempt that is still winding down (its peer died)
        # must not touch this attempt's stop file.
        name=f"attempt-{gang.claim.attempt}/host-{gang.seat.seat}",
    )


def public_message(message: str, settings: Settings) -> str:
    """An error message for the job's owner: the service's own paths (its data directory, the dataset
    cache) are named in words, not spelled out; the worker's log keeps them whole. What follows such
    a path inside it is kept, as `(at datasets/...)`, since that part names the user's own data."""
    places = [
        (settings.jobs_dir, "the service's jobs directory"),
        (settings.home, "the service's data directory"),
    ]
    if settings.dataset_cache_dir is not None:
        places.insert(0, (settings.dataset_cache_dir, "the service's dataset cache"))
    places.append((cache_dir_or_default(None), "the service's dataset cache"))
    for path, name in places:
        # The path (not a longer name it begins), and the rest of a path under it (up to a quote,
        # a space or a bracket).
        pattern = re.escape(str(path.expanduser().absolute())) + r"(?![\w-])(/[^\s'\"(),:;]*)?"
        message = re.sub(pattern, functools.partial(_named, name), message)
    return message


def _named(name: str, found: re.Match[str]) -> str:
    inside = (found.group(1) or "").strip("/")
    return f"{name} (at {inside})" if inside else name


def _last_checkpoint_step(work_dir: Path) -> int | None:
    """The step of the checkpoint the engine will resume from: the journal is replayed up to it."""
    try:
        store = CheckpointStore(work_dir / "checkpoints")
        latest = store.latest()
        return None if latest is None else int(str(store.manifest(latest)["step"]))
    except Exception:  # the engine decides about odd checkpoint dirs; this is only a report
        return None


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None
