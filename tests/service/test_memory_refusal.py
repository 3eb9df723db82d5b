"""The service refuses a job whose memory plan fits no live worker's GPUs (real PostgreSQL).

Workers report the GPUs they give a job and the memory of each in their heartbeats. One test
starts a real worker that declares 8 GPUs of 16 GB (RELAY_WORKER_SLOTS, RELAY_WORKER_GPU_MEMORY_GB:
there are no GPUs here); the others write such heartbeats next to the stack's own workers (CPU
slots, one each), then post pi05 recipes, or place them on the workers as the API does (without
queueing a job that no worker here could run).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete

from relay._http import Client
from relay.errors import APIError
from relay.memory_plan import plan_named
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.db import utcnow
from relay_api.errors import APIProblem
from relay_api.fine_tunes import LiveWorker, check_memory, place_on_workers
from relay_api.models import WorkerHeartbeat
from relay_worker.heartbeat import beat, gpu_memory
from tests.service.stack import Stack, wait_for

GB = 10**9
PREFIX = "memory-test-host:"


@pytest.fixture
def gpu_workers(stack: Stack) -> Iterator[list[str]]:
    """Names of heartbeat rows a test writes; removed afterwards so other tests never see them."""
    names: list[str] = []
    yield names
    with stack.sessions() as session:
        session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.name.startswith(PREFIX)))
        session.commit()


def gpu_worker(stack: Stack, names: list[str], gpus: int, gpu_memory: int | None) -> None:
    name = f"{PREFIX}{len(names)}"
    names.append(name)
    beat(stack.sessions, name, utcnow(), gpus, gpu_memory)


def full_pi05(**fields: object) -> SFTConfig:
    return SFTConfig(
        **{
            "model": "pi05",
            "dataset_name": "lerobot/pusht_image",
            "finetune": "full",
            "batch_size": 32,
            **fields,
        }
    )


def place(stack: Stack, config: SFTConfig) -> SFTConfig:
    with stack.sessions() as session:
        return place_on_workers(session, config, stack.settings.reconcile_seconds)


def test_small_gpus_refuse_a_full_pi05_job_naming_the_batch_size(
    stack: Stack, client: Client, gpu_workers: list[str]
) -> None:
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=16 * GB)
    needed = plan_named("pi05", finetune="full", batch_size=32, gpus=8)
    assert needed is not None and needed.total > 16 * GB
    with pytest.raises(APIError) as refused:
        train(full_pi05(gpus=8), client=client)
    assert refused.value.status == 400
    # 8 GPUs is all a worker has; a smaller batch would fit on them.
    assert refused.value.param == "batch_size"
    message = str(refused.value)
    assert f"needs about {needed.total / GB:.0f} GB per GPU; the largest worker GPU has 16 GB" in message
    assert client.request("GET", "/v1/fine-tunes")["data"] == []  # nothing was created


def test_a_job_that_more_of_a_workers_gpus_would_hold_is_refused_naming_gpus(
    stack: Stack, client: Client, gpu_workers: list[str]
) -> None:
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=24 * GB)
    with pytest.raises(APIError) as refused:
        train(full_pi05(gpus=4), client=client)  # about 29 GB on each of 4; about 18 GB on 8
    assert refused.value.status == 400 and refused.value.param == "gpus"
    assert "the largest worker GPU has 24 GB" in str(refused.value)


def test_big_enough_gpus_or_a_cpu_worker_accept_it(stack: Stack, gpu_workers: list[str]) -> None:
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=16 * GB)
    with pytest.raises(APIProblem, match="the largest worker GPU has 16 GB"):
        place(stack, full_pi05(gpus=8))
    # An H200 host next to it: the plan (about 18 GB a GPU) fits.
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=141 * GB)
    assert place(stack, full_pi05(gpus=8)).gpus == 8
    with stack.sessions() as session:
        session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.name == gpu_workers[-1]))
        session.commit()
    # A CPU host with 8 slots reports no GPU memory: nothing is refused on memory.
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=None)
    assert place(stack, full_pi05(gpus=8)).gpus == 8


@pytest.mark.slow
def test_a_worker_reports_its_gpu_memory_and_the_api_refuses_what_fits_none(
    stack: Stack, client: Client
) -> None:
    worker = stack.start_standby_worker(RELAY_WORKER_SLOTS="8", RELAY_WORKER_GPU_MEMORY_GB="16")
    reported = (WorkerHeartbeat.gpus == 8) & (WorkerHeartbeat.gpu_memory == 16 * GB)
    try:

        def advertised() -> bool:
            with stack.sessions() as session:
                return session.query(WorkerHeartbeat).filter(reported).count() == 1

        wait_for(advertised, 120, "the 8-GPU worker's heartbeat")
        with pytest.raises(APIError) as refused:
            train(full_pi05(), client=client)  # full: all 8 GPUs of the worker, by default
        assert refused.value.status == 400 and refused.value.param == "batch_size"
        assert "the largest worker GPU has 16 GB" in str(refused.value)
    finally:
        worker.stop()
        with stack.sessions() as session:  # other tests must not see an 8-GPU worker alive
            session.execute(delete(WorkerHeartbeat).where(reported))
            session.commit()


@pytest.mark.parametrize(
    ("gpu_memory", "field"),
    [(24 * GB, "finetune"), (8 * GB, "model")],
)
def test_the_error_names_the_setting_that_would_make_it_fit(gpu_memory: int, field: str) -> None:
    """One GPU: more GPUs cannot help; a full pi05 fits 24 GB with LoRA only, and nothing fits 8 GB."""
    with pytest.raises(APIProblem) as refused:
        check_memory(full_pi05(gpus=1), [LiveWorker(gpus=1, gpu_memory=gpu_memory)])
    assert refused.value.param == field and refused.value.status == 400


def test_a_worker_reads_its_gpus_memory_from_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat's gpu_memory: the smallest GPU the worker shows its jobs, by index or UUID;
    None on a host without nvidia-smi. (A stand-in nvidia-smi prints what the real one does.)"""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_memory(None) is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0, GPU-aaa, 81559\\n1, GPU-bbb, 40960\\n'\n")
    smi.chmod(0o755)
    assert gpu_memory(None) == 40960 * 2**20
    assert gpu_memory("0") == 81559 * 2**20
    assert gpu_memory("GPU-bbb") == 40960 * 2**20
