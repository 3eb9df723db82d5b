"""Recipe jobs on 2 processes through the service: real Celery workers, PostgreSQL and Redis.

A worker that declares 2 slots (RELAY_WORKER_SLOTS, the CPU's stand-in for GPUs) runs a job of
`gpus=2` as 2 processes started by torch.distributed.run (gloo). Killing one of them takes the
group down; the job goes back to the queue and its next attempt resumes from the last checkpoint.
A cancel stops every process at the same step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from relay.errors import APIError
from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.errors import APIProblem
from relay_api.fine_tunes import LiveWorker, check_gpus
from relay_api.models import WorkerHeartbeat
from relay_engine.core.checkpoint import CheckpointStore
from tests.service.stack import Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_slot_worker(stack: Stack) -> Iterator[WorkerProcess]:
    worker = stack.start_standby_worker(RELAY_WORKER_SLOTS="2")
    worker.wait_ready()

    def advertised() -> bool:
        with stack.sessions() as session:
            return bool(session.scalar(select(WorkerHeartbeat.name).where(WorkerHeartbeat.gpus == 2)))

    wait_for(advertised, 60, "the 2-slot worker's heartbeat")
    yield worker
    worker.stop()


def rank_pid(stack: Stack, job_id: str, rank: int) -> int:
    path = stack.settings.job_dir(job_id) / "launch" / f"rank-{rank}.pid"
    wait_for(path.exists, 180, f"rank {rank} of {job_id} to start", every=0.1)
    return int(path.read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def config(dataset: Path, **fields: object) -> SFTConfig:
    return SFTConfig(
        **{
            "model": "pi05-tiny",
            "dataset_name": str(dataset),
            "batch_size": 4,
            "gpus": 2,
            "finetune": "lora",
            **fields,
        }
    )


def test_more_gpus_than_all_live_workers_have_is_refused(
    two_slot_worker: WorkerProcess, client: Client, dataset: Path
) -> None:
    with pytest.raises(APIError) as refused:
        train(config(dataset, gpus=64, batch_size=64), client=client)
    assert refused.value.status == 400
    assert refused.value.param == "gpus"
    assert "(must be at most the" in str(refused.value)
    assert "GPUs of all live workers together, per their heartbeats; the largest worker has 2)" in str(
        refused.value
    )


def test_one_live_gpu_is_counted_in_the_singular() -> None:
    with pytest.raises(APIProblem) as refused:
        check_gpus(2, [LiveWorker(gpus=1, gpu_memory=None)])
    assert refused.value.status == 400 and refused.value.param == "gpus"
    assert refused.value.message == (
        "bad gpus: 2 (must be at most the 1 GPU of all live workers together, per their heartbeats; "
        "the largest worker has 1)"
    )
    check_gpus(2, [LiveWorker(gpus=1, gpu_memory=None)] * 2)  # two of them run it as a gang
    check_gpus(64, [])  # no worker alive: nothing is known, the job waits


def test_a_killed_rank_takes_the_group_down_and_the_job_resumes(
    stack: Stack, two_slot_worker: WorkerProcess, client: Client, dataset: Path
) -> None:
    steps = 80  # long enough that a loaded machine does not finish it between a checkpoint and the kill
    job = train(config(dataset, steps=steps), client=client)
    assert job.to_dict()["gpus"] == 2
    # The first checkpoint on disk, not its event (which a loaded machine has seen lag the disk).
    store = CheckpointStore(stack.settings.job_dir(job.id) / "checkpoints")
    wait_for(store.complete, 300, "the job's first checkpoint", every=0.05)
    victim = rank_pid(stack, job.id, 1)
    os.kill(victim, 9)
    last_checkpoint = int(CheckpointStore.manifest(store.complete()[-1])["step"])
    assert last_checkpoint < steps, "the job ended before the kill; make it longer"

    job.wait(poll=1, timeout=600)
    assert job.status == "completed" and job.step == steps
    assert job.to_dict()["attempts"] == 2
    events = job.events()
    resumed = next(e for e in events if e.get("event") == "resumed")
    assert resumed["attempt"] == 2 and resumed["step"] >= last_checkpoint
    assert [e["step"] for e in events if "grad_norm" in e] == list(range(10, steps + 1, 10))
    assert (stack.settings.job_dir(job.id) / "output" / "model.safetensors").is_file()


def test_a_cancel_reaches_every_rank(
    stack: Stack, two_slot_worker: WorkerProcess, client: Client, dataset: Path
) -> None:
    job = train(config(dataset, steps=2000), client=client)
    ranks = [rank_pid(stack, job.id, rank) for rank in (0, 1)]
    wait_for(lambda: job.refresh().step >= 10, 300, "the job's first metrics", every=0.1)
    job.cancel()
    job.wait(poll=0.5, timeout=120)
    assert job.status == "cancelled"
    started = time.monotonic()
    wait_for(lambda: not any(alive(pid) for pid in ranks), 60, "every rank to exit", every=0.1)
    assert time.monotonic() - started < 60
