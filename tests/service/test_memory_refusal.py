"""The service refuses a job whose memory plan the live workers' GPUs cannot hold, on one host or
as a gang of several (real PostgreSQL).

Workers report the GPUs they give a job and the memory of each in their heartbeats. One test
starts a real worker that declares 8 GPUs of 16 GB (RELAY_WORKER_SLOTS, RELAY_WORKER_GPU_MEMORY_GB:
there are no GPUs here); the others write such heartbeats next to the stack's own workers (CPU
slots, one each), then post pi05 (and SmolVLA) recipes, or place them on the workers as the API does (without
queueing a job that no worker here could run).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete

from relay.errors import APIError
from relay.http_client import Client
from relay.memory_plan import plan_named
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.app import create_app
from relay_api.db import utcnow
from relay_api.errors import APIProblem
from relay_api.fine_tunes import LiveWorker, check_memory, place_on_workers
from relay_api.models import WorkerHeartbeat
from relay_worker.heartbeat import beat, gpu_memory
from tests.service.stack import PARKED_QUEUE, Stack, wait_for

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


def place(stack: Stack, config: SFTConfig, *, cpu_full_size: bool = False) -> SFTConfig:
    with stack.sessions() as session:
        return place_on_workers(session, config, stack.settings, cpu_full_size=cpu_full_size)


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


def test_small_gpus_refuse_a_smolvla_job_as_they_refuse_pi05_s_never_naming_gpus(
    stack: Stack, user: tuple[str, str], gpu_workers: list[str]
) -> None:
    """SmolVLA's plan (relay.smolvla_layout: fp32, one process) is admitted as pi05's is. A pi05
    job here would be told to spread over more GPUs; SmolVLA runs on one, so the batch is named.
    The API is one that keeps GPU-sized models off CPU workers (RELAY_ALLOW_CPU_FULL_SIZE=false, as
    a real deployment): the stack's own CPU workers would otherwise take the job."""
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=24 * GB)
    needed = plan_named("smolvla", finetune="full", batch_size=64, gpus=1)
    assert needed is not None and needed.total > 24 * GB
    config = SFTConfig(model="smolvla", dataset_name="lerobot/pusht_image")  # its own batch, 64
    assert (config.batch_size, config.gpus) == (64, 1)
    headers = {"authorization": f"Bearer {user[1]}"}
    settings = stack.settings.model_copy(
        update={
            "allow_cpu_full_size": False,
            "fine_tune_queue": PARKED_QUEUE,
            "session_queue": PARKED_QUEUE + "-sessions",
        }
    )
    with TestClient(create_app(settings)) as api:
        refused = api.post("/v1/fine-tunes", json=config.model_dump(), headers=headers)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "no_worker_fits" and error["param"] == "batch_size"
        assert (
            f"needs about {needed.total / GB:.0f} GB per GPU; the largest worker GPU has 24 GB"
            in (error["message"])
        )
        assert "a smaller batch would fit" in error["message"]
        assert api.get("/v1/fine-tunes", headers=headers).json()["data"] == []  # nothing was created
    # An 80 GB GPU holds it.
    gpu_worker(stack, gpu_workers, gpus=1, gpu_memory=80 * GB)
    assert place(stack, config).gpus == 1


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
    # A CPU host with 8 slots reports no GPU memory: nothing is refused on memory, where CPU
    # workers may take pi05 (RELAY_ALLOW_CPU_FULL_SIZE).
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=None)
    assert place(stack, full_pi05(gpus=8), cpu_full_size=True).gpus == 8


def test_a_gang_must_fit_the_gpus_of_the_hosts_that_would_form_it(
    stack: Stack, client: Client, gpu_workers: list[str]
) -> None:
    """16 GPUs is more than any worker here has: the job runs on two hosts, and each of its 16
    processes needs the plan at 16 (about 12 GB), on the GPUs of every host of the gang."""
    needed = plan_named("pi05", finetune="full", batch_size=32, gpus=16)
    assert needed is not None and 8 * GB < needed.total <= 16 * GB
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=80 * GB)
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=8 * GB)
    with pytest.raises(APIError) as refused:
        train(full_pi05(gpus=16), client=client)
    assert refused.value.status == 400 and refused.value.param == "gpus"
    message = str(refused.value)
    assert f"needs about {needed.total / GB:.0f} GB on each of its 16 GPUs; the live workers have" in message
    assert client.request("GET", "/v1/fine-tunes")["data"] == []  # nothing was created
    # A third host of 16 GB GPUs: it and the 80 GB one form the gang.
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=16 * GB)
    assert place(stack, full_pi05(gpus=16)).gpus == 16


def test_cpu_hosts_hold_anything_they_have_the_slots_for_where_allowed(
    stack: Stack, gpu_workers: list[str]
) -> None:
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=None)
    gpu_worker(stack, gpu_workers, gpus=8, gpu_memory=None)
    assert place(stack, full_pi05(gpus=16), cpu_full_size=True).gpus == 16
    tiny = SFTConfig(model="pi05-tiny", dataset_name="lerobot/pusht_image", finetune="full", gpus=16)
    assert place(stack, tiny).gpus == 16  # sized for CPUs: taken whatever the setting


def test_cpu_only_workers_refuse_a_model_sized_for_gpus_naming_model(
    stack: Stack, user: tuple[str, str], gpu_workers: list[str]
) -> None:
    """As `relay server` on a laptop: every live worker trains on its CPU, and pi05 (3.35 B weights)
    would take hours a step there; refused at create unless RELAY_ALLOW_CPU_FULL_SIZE=true."""
    gpu_worker(stack, gpu_workers, gpus=1, gpu_memory=None)
    headers = {"authorization": f"Bearer {user[1]}"}
    recipe = {"model": "pi05", "dataset_name": "lerobot/pusht_image", "batch_size": 8}
    settings = stack.settings.model_copy(
        update={
            "allow_cpu_full_size": False,
            "fine_tune_queue": PARKED_QUEUE,
            "session_queue": PARKED_QUEUE + "-sessions",
        }
    )
    with TestClient(create_app(settings)) as api:
        refused = api.post("/v1/fine-tunes", json=recipe, headers=headers)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        planned = plan_named("pi05", finetune="lora", batch_size=8, gpus=1, device="cpu")
        assert planned is not None and error["param"] == "model" and error["code"] == "no_worker_fits"
        assert (
            f"pi05 has 3.35 B weights; this job's memory plan needs about {planned.total / GB:.0f} GB"
            in (error["message"])
        )
        assert "RELAY_ALLOW_CPU_FULL_SIZE=true" in error["message"]
        assert api.get("/v1/fine-tunes", headers=headers).json()["data"] == []  # nothing was created
        tiny = api.post("/v1/fine-tunes", json={**recipe, "model": "pi05-tiny"}, headers=headers)
        assert tiny.status_code == 200, tiny.text
        # A training session of it, too: the same rule, naming the session's field.
        session = api.post("/v1/sessions", json={"base_model": "pi05"}, headers=headers)
        assert session.status_code == 400 and session.json()["error"]["param"] == "base_model", session.text
        assert "pi05 has 3.35 B weights" in session.json()["error"]["message"]
        assert api.get("/v1/sessions", headers=headers).json()["data"] == []
        tiny_session = api.post("/v1/sessions", json={"base_model": "pi05-tiny"}, headers=headers)
        assert tiny_session.status_code == 200, tiny_session.text
    allowed = httpx.post(f"{stack.parked_api_url}/v1/fine-tunes", json=recipe, headers=headers)
    assert allowed.status_code == 200 and allowed.json()["status"] == "queued", allowed.text


def test_cpu_slots_are_not_added_to_gpus() -> None:
    # 8 GPUs that hold the plan beside 8 CPU slots: neither kind has the job's 16 alone.
    with pytest.raises(APIProblem) as refused:
        check_memory(
            full_pi05(gpus=16), [LiveWorker(gpus=8, gpu_memory=80 * GB), LiveWorker(gpus=8, gpu_memory=None)]
        )
    assert refused.value.param == "gpus"


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


@pytest.mark.parametrize(
    ("gpus", "workers", "field", "words"),
    [
        # 18 GB a GPU on 8 of them; 16 processes need 12 GB each, which two hosts of 16 GB hold.
        (8, [(8, 16), (8, 16)], "gpus", "the largest worker GPU has 16 GB; more GPUs would share it"),
        # 12 GB each on 16: only the 80 GB host's 8 GPUs hold that, and 8 processes fit it.
        (16, [(8, 80), (8, 8)], "gpus", "the live workers have 8 GPUs that large; 8 GPUs would fit"),
        (16, [(8, 80), (7, 8), (1, 8)], "gpus", "the live workers have 8 GPUs that large; 8 GPUs would fit"),
        # 12 GB each on 16 GPUs of 11 GB: one sample a GPU (batch 16) needs about 10.8 GB.
        (16, [(8, 11), (8, 11)], "batch_size", "the largest worker GPU has 11 GB; a smaller batch would fit"),
    ],
)
def test_a_gangs_refusal_names_the_setting_that_would_make_it_fit(
    gpus: int, workers: list[tuple[int, int]], field: str, words: str
) -> None:
    live = [LiveWorker(gpus=slots, gpu_memory=memory * GB) for slots, memory in workers]
    with pytest.raises(APIProblem) as refused:
        check_memory(full_pi05(gpus=gpus), live)
    assert refused.value.param == field and refused.value.status == 400
    assert words in refused.value.message


def test_a_gang_that_its_hosts_gpus_hold_is_accepted() -> None:
    check_memory(full_pi05(gpus=16), [LiveWorker(gpus=8, gpu_memory=16 * GB)] * 2)
    # A gang of 16 from hosts of 8, 4 and 4 GPUs, one host too small to take part.
    hosts = [LiveWorker(gpus=8, gpu_memory=24 * GB), LiveWorker(gpus=4, gpu_memory=24 * GB)]
    check_memory(full_pi05(gpus=16), [*hosts, hosts[1], LiveWorker(gpus=8, gpu_memory=8 * GB)])


def test_a_deployment_no_live_serving_worker_could_hold_is_refused(stack: Stack) -> None:
    """The jobs' rule, asked of the workers that would hold a deployment: with only a CPU worker that
    takes deployments alive (in a database of its own, so that no other worker of the stack is),
    pi05 is refused naming `model`, pi05-tiny is taken; a job is not placed on that worker (none
    that trains is alive, so the job waits)."""
    from relay_api import keys, migrate
    from relay_api.db import session_factory
    from relay_api.workers import live_workers, serving_workers
    from tests.isolation import run_database_name
    from tests.service.stack import drop_database, recreate_database

    name = run_database_name("serving-roles")
    url = recreate_database(name)
    migrate.upgrade(url)
    queue = "relay.serving-roles"
    worker = stack.start_standby_worker(queues=(queue,), RELAY_DATABASE_URL=url, RELAY_SERVING_QUEUE=queue)
    try:
        worker.wait_ready()
        settings = stack.settings.model_copy(
            update={
                "database_url": url,
                "allow_cpu_full_size": False,
                "fine_tune_queue": PARKED_QUEUE,
                "serving_queue": PARKED_QUEUE + "-serving",  # not that worker's: nothing is loaded
            }
        )
        sessions = session_factory(settings)
        with sessions() as session:
            key = keys.create_key(session, "roles").key

        def beating() -> bool:
            with sessions() as session:
                return bool(serving_workers(session, settings.reconcile_seconds))

        wait_for(beating, 60, "the serving worker's heartbeat", every=0.2)
        with sessions() as session:
            assert live_workers(session, settings.reconcile_seconds) == []  # no place to train
        headers = {"authorization": f"Bearer {key}"}
        with TestClient(create_app(settings)) as api:
            refused = api.post("/v1/deployments", json={"model": "pi05"}, headers=headers)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["param"] == "model" and error["code"] == "no_worker_fits", error
            assert "on its CPU" in error["message"]
            taken = api.post("/v1/deployments", json={"model": "pi05-tiny"}, headers=headers)
            assert taken.status_code == 200, taken.text
            api.delete(f"/v1/deployments/{taken.json()['id']}", headers=headers)
            job = api.post("/v1/fine-tunes", json=full_pi05().model_dump(mode="json"), headers=headers)
            assert job.status_code == 200, job.text  # waits for a worker that trains
    finally:
        worker.stop()
        drop_database(name)
