"""Admission on both sides: a worker handed a job it cannot hold refuses it itself (the API admits
against heartbeats, and a job can still reach such a worker: one created before any worker beat,
a worker restarted with smaller GPUs); `relay server` knows its workers train on the CPU before
their first heartbeat. Real PostgreSQL, Redis and worker processes."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete

from relay.memory_plan import plan_named
from relay_api.app import create_app
from relay_api.db import utcnow
from relay_api.models import WorkerHeartbeat
from relay_api.settings import Settings
from relay_api.workers import LiveWorker
from relay_worker.admission import another_can_hold, refusal
from relay_worker.heartbeat import beat
from tests.service.stack import PARKED_QUEUE, Stack, WorkerProcess, wait_for

GB = 10**9
# A queue of this module's own: only its CPU worker (which may not train pi05) reads it.
CPU_ONLY_QUEUE = "relay.fine-tunes.cpu-only-admission"
FAKE_GPU_HOST = "admission-test-gpu-host"
PI05 = {"model": "pi05", "dataset_name": "lerobot/pusht_image", "batch_size": 8}


def test_a_worker_holds_a_job_against_its_own_memory() -> None:
    """The same memory plan the API admits against, asked by the worker of itself."""
    settings = Settings(allow_cpu_full_size=False)
    full = {**PI05, "finetune": "full", "batch_size": 32, "gpus": 1}
    planned = plan_named("pi05", finetune="full", batch_size=32, gpus=1)
    assert planned is not None
    small = refusal(full, settings, 16 * GB)
    assert small is not None and "this worker's GPUs have 16 GB" in small
    assert f"needs about {planned.total / GB:.0f} GB on each GPU" in small
    assert refusal(full, settings, int(planned.total) + GB) is None
    on_cpu = refusal(PI05, settings, None)
    assert (
        on_cpu is not None
        and "pi05 has 3.35 B weights" in on_cpu
        and "this worker trains on its CPU" in on_cpu
    )
    assert refusal(PI05, settings.model_copy(update={"allow_cpu_full_size": True}), None) is None
    assert refusal({**PI05, "model": "pi05-tiny"}, settings, None) is None
    # Another live worker with a GPU large enough: leave the job to it.
    assert another_can_hold(PI05, settings, [LiveWorker(1, None), LiveWorker(1, 80 * GB)])
    assert not another_can_hold(PI05, settings, [LiveWorker(1, None), LiveWorker(1, None)])


def test_a_server_that_knows_its_workers_train_on_cpus_refuses_before_any_heartbeat(
    stack: Stack, user: tuple[str, str]
) -> None:
    """RELAY_CPU_WORKERS_ONLY (what `relay server` sets without a GPU): no live worker need have
    beaten yet; a pi05 job, session or deployment is refused, pi05-tiny is not."""
    headers = {"authorization": f"Bearer {user[1]}"}
    settings = stack.settings.model_copy(
        update={
            "allow_cpu_full_size": False,
            "cpu_workers_only": True,
            "fine_tune_queue": PARKED_QUEUE,
            "session_queue": PARKED_QUEUE + "-sessions",
            # No heartbeat counts: as in a server's first second.
            "reconcile_seconds": 1e-9,
        }
    )
    with TestClient(create_app(settings)) as api:
        refused = api.post("/v1/fine-tunes", json=PI05, headers=headers)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "model" and error["code"] == "no_worker_fits"
        assert "this service's workers train on their CPUs" in error["message"]
        session = api.post("/v1/sessions", json={"base_model": "pi05"}, headers=headers)
        assert session.status_code == 400 and session.json()["error"]["param"] == "base_model"
        assert (
            api.post("/v1/fine-tunes", json={**PI05, "model": "pi05-tiny"}, headers=headers).status_code
            == 200
        )


@pytest.fixture
def cpu_worker(stack: Stack) -> Iterator[WorkerProcess]:
    """A CPU worker that may not train models sized for GPUs, alone on its own queue."""
    worker = stack.start_standby_worker(
        (CPU_ONLY_QUEUE,), RELAY_FINE_TUNE_QUEUE=CPU_ONLY_QUEUE, RELAY_ALLOW_CPU_FULL_SIZE="false"
    )
    worker.wait_ready()
    yield worker
    worker.stop()
    with stack.sessions() as session:
        session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.name == FAKE_GPU_HOST))
        session.commit()


@pytest.mark.slow
def test_a_worker_refuses_a_job_it_cannot_hold_and_leaves_it_to_one_that_can(
    stack: Stack, user: tuple[str, str], cpu_worker: WorkerProcess
) -> None:
    """An API that lets a pi05 job through (RELAY_ALLOW_CPU_FULL_SIZE on the API only: as a job
    created before any heartbeat) reaches a CPU worker. While a worker with a large GPU is alive,
    the CPU worker leaves the job queued for it; once none is, it ends the job at once with the
    reason, after one claim and no retry (it used to download the 3 B base and fail after retries)."""
    headers = {"authorization": f"Bearer {user[1]}"}
    gpu_host_gone = threading.Event()

    def gpu_host() -> None:  # a host with an 80 GB GPU, beating as a worker does until it is gone
        started = utcnow()
        while not gpu_host_gone.wait(0.3):
            beat(stack.sessions, FAKE_GPU_HOST, started, 1, 80 * GB)

    beating = threading.Thread(target=gpu_host, daemon=True)
    beat(stack.sessions, FAKE_GPU_HOST, utcnow(), 1, 80 * GB)
    beating.start()
    settings = stack.settings.model_copy(
        update={"fine_tune_queue": CPU_ONLY_QUEUE, "allow_cpu_full_size": True}
    )
    with TestClient(create_app(settings)) as api:
        created = api.post("/v1/fine-tunes", json=PI05, headers=headers)
        assert created.status_code == 200, created.text
        job_id = created.json()["id"]

        def job() -> dict[str, object]:
            return dict(api.get(f"/v1/fine-tunes/{job_id}", headers=headers).json())

        wait_for(
            lambda: "left to a live worker that can" in cpu_worker.log_since_start(),
            60,
            "the CPU worker to leave the job to the GPU host",
        )
        assert job()["status"] == "queued" and job()["attempts"] == 0
        # The GPU host is gone (its heartbeat row removed): no live worker holds the job.
        gpu_host_gone.set()
        beating.join()
        with stack.sessions() as session:
            session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.name == FAKE_GPU_HOST))
            session.commit()
        ended = wait_for(lambda: (j := job())["status"] == "error" and j, 60, "the worker to refuse the job")
        assert ended["attempts"] == 1
        assert "this job cannot run here: pi05 has 3.35 B weights" in str(ended["error"])
        assert "this worker trains on its CPU" in str(ended["error"])
        events = api.get(f"/v1/fine-tunes/{job_id}/events", headers=headers).json()["data"]
        assert [e.get("event") for e in events] == ["error"]
