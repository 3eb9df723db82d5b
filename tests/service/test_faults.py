"""Faults (what docs/reliability.md promises): a worker killed mid-job, a job the broker never
got, a job out of attempts, and writes from an attempt that no longer owns its job."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy import select, update

from relay._http import Client
from relay.sft.config import SFTConfig
from relay.sft.job import FineTuneJob
from relay.sft.train import train
from relay_api import fine_tunes
from relay_api.db import utcnow
from relay_api.models import FineTune, FineTuneEvent
from relay_worker import lifecycle
from tests.service.stack import Stack, wait_for

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


def test_a_job_whose_worker_is_killed_resumes_from_its_last_checkpoint(
    stack: Stack, client: Client, dataset: Path
) -> None:
    worker = stack.worker()
    job = train(tiny(dataset, steps=40), client=client)
    wait_for(lambda: job.refresh().status == "running", 120, "the worker to claim the job", every=0.02)
    # The worker that will take over warms up meanwhile; its reconciler will find the lapsed lease.
    standby = stack.start_standby_worker()
    wait_for(lambda: checkpoint_steps(stack, job.id), 180, "the job's first checkpoint", every=0.02)
    worker.kill()  # SIGKILL, the worker and its pool process at once
    killed_at = dt.datetime.now(dt.UTC)
    last_checkpoint = max(checkpoint_steps(stack, job.id))
    assert job.refresh().status == "running", "the job ended before the kill; make it longer"
    assert last_checkpoint < 40

    standby.wait_ready()
    stack.adopt(standby)
    job.wait(poll=1, timeout=300)
    assert job.status == "completed" and job.step == 40
    assert job.to_dict()["attempts"] == 2

    events = job.events()
    keys = [(e["step"], e.get("event", "metrics")) for e in events]
    assert len(keys) == len(set(keys)), "an event was written twice"
    assert [e["step"] for e in events if "event" not in e] == [10, 20, 30, 40]
    retry = next(e for e in events if e.get("event") == "retry")
    assert retry["attempt"] == 2
    resumed = next(e for e in events if e.get("event") == "resumed")
    # From the checkpoint last reported before the kill (or one written in the instant before it).
    assert resumed["attempt"] == 2 and resumed["step"] in (last_checkpoint, last_checkpoint + 10)
    resumed_after = dt.datetime.fromisoformat(resumed.created_at or "") - killed_at
    print(
        f"\nSIGKILL at step {last_checkpoint}+: resumed from step {resumed['step']} "
        f"{resumed_after.total_seconds():.1f} s later (lease {stack.settings.lease_seconds:.0f} s, "
        f"reconciler every {stack.settings.reconcile_seconds:.0f} s)"
    )
    assert events[-1] == {"step": 40, "event": "finished"}


def test_a_worker_that_shuts_down_hands_its_job_to_another(
    stack: Stack, client: Client, dataset: Path
) -> None:
    worker = stack.worker()
    job = train(tiny(dataset, steps=40), client=client)
    wait_for(lambda: job.refresh().status == "running", 120, "the worker to claim the job", every=0.02)
    standby = stack.start_standby_worker()
    wait_for(lambda: checkpoint_steps(stack, job.id), 180, "the job's first checkpoint", every=0.02)

    assert worker.shut_down() == 0  # a warm shutdown that does not wait for the whole job
    # On a fast machine the standby may resume (even finish) the job while the first worker exits,
    # so the check that the first attempt did not finish it is made on the events.
    standby.wait_ready()
    stack.adopt(standby)
    job.wait(poll=1, timeout=300)
    assert job.status == "completed" and job.step == 40

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
        steps = session.scalars(select(FineTuneEvent.step).where(FineTuneEvent.job_id == row["id"])).all()
    assert steps == [10]
