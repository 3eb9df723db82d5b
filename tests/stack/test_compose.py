"""The production stack run for real: docker-compose.yml's containers (PostgreSQL, Redis, the
migration, the API, a worker and a serving worker) built and started on this machine, which has no
GPU and cannot pull public images (docker/base-image.sh builds them from Debian's packages).

A job runs end to end through the API container and the worker container, and the API container
serves the files the worker container wrote; a model sized for GPUs is refused at create; a worker
stopped in the middle of a job hands it back and the job finishes after it starts again; and the
stack taken down and brought up again (migrations run against the volumes it left) still has its
jobs and their weights.

Needs a Docker engine and root (debootstrap). Where there is none the tests are skipped, saying why
(scripts/test.sh says so too), so that the rest of the suite runs on such a machine; with
RELAY_REQUIRE_DOCKER=1 that is a failure instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import relay.sft
from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.job import FineTuneJob
from relay.sft.train import train
from tests.isolation import free_port
from tests.service.stack import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DATASET = "/data/datasets/dots"  # on the volume every Relay container mounts


def docker_usable() -> str | None:
    """Why this machine cannot run the stack, or None."""
    if shutil.which("docker") is None or shutil.which("docker-compose") is None:
        return "docker and docker-compose are not installed"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "no Docker engine answers"
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        return "building the base images needs root and debootstrap"
    return None


@dataclass
class ComposeStack:
    project: str
    url: str
    environment: dict[str, str]

    def compose(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        command = ["docker-compose", "-p", self.project, "--env-file", "docker/local.env", *args]
        done = subprocess.run(
            command, cwd=ROOT, env=self.environment, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        return done

    def wait_until_up(self) -> None:
        def answers() -> bool:
            try:
                return httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, 300, "the API container to answer /healthz", every=1)

    def new_key(self, user: str) -> str:
        done = self.compose("run", "--rm", "-T", "api", "relay", "keys", "create", "--user", user)
        return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def stack() -> Iterator[ComposeStack]:
    why_not = docker_usable()
    if why_not is not None:
        if os.environ.get("RELAY_REQUIRE_DOCKER") == "1":
            pytest.fail(f"RELAY_REQUIRE_DOCKER=1 but {why_not}")
        pytest.skip(why_not)
    built = subprocess.run(["bash", "docker/base-image.sh"], cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-4000:]
    port = free_port()
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "POSTGRES_"))},
        "RELAY_PORT": str(port),
        "RELAY_LOCAL_DATASETS": "true",
        "RELAY_CHECKPOINT_EVERY": "20",
        "RELAY_LEASE_SECONDS": "15",
        "RELAY_RECONCILE_SECONDS": "3",
        "RELAY_API_WORKERS": "1",
    }
    running = ComposeStack(f"relaytest{uuid.uuid4().hex[:8]}", f"http://127.0.0.1:{port}", environment)
    try:
        running.compose("up", "-d", "--build", timeout=1800)
        running.wait_until_up()
        running.compose("exec", "-T", "worker", "relay", "datasets", "synth", DATASET, "--episodes", "8")
        yield running
    finally:
        logs = subprocess.run(
            [
                "docker-compose",
                "-p",
                running.project,
                "--env-file",
                "docker/local.env",
                "logs",
                "--tail",
                "40",
            ],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
        )
        print(logs.stdout[-6000:])
        subprocess.run(
            ["docker-compose", "-p", running.project, "--env-file", "docker/local.env", "down", "-v"],
            cwd=ROOT,
            env=environment,
            capture_output=True,
        )


def tiny(steps: int) -> SFTConfig:
    return SFTConfig(model="pi05-tiny", dataset_name=DATASET, batch_size=4, steps=steps)


def completed_job(stack: ComposeStack, user: str, steps: int) -> tuple[Client, FineTuneJob]:
    """A new user's pi05-tiny job of `steps` steps, run to its end in the containers."""
    client = Client(stack.url, stack.new_key(user))
    job = train(tiny(steps), client=client)
    job.wait(poll=1, timeout=600, progress=False)
    assert job.status == "completed", job.error
    return client, job


def test_a_job_runs_in_the_containers_and_its_weights_come_from_the_api(
    stack: ComposeStack, tmp_path: Path
) -> None:
    client, job = completed_job(stack, "alice", 20)
    assert job.output_dir == f"/data/jobs/{job.id}/output"  # the worker container's volume
    weights = job.download(tmp_path / "weights", progress=False)  # served by the API container
    assert (weights / "model.safetensors").stat().st_size > 1_000_000
    # No GPU in these containers: a model sized for GPUs is refused at create, naming the field.
    refused = httpx.post(
        f"{stack.url}/v1/fine-tunes",
        json={"model": "pi05", "dataset_name": DATASET, "batch_size": 2, "steps": 10},
        headers={"authorization": f"Bearer {client.api_key}"},
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model", refused.text


def test_a_stopped_worker_hands_its_job_back_and_it_finishes_after_a_restart(stack: ComposeStack) -> None:
    client = Client(stack.url, stack.new_key("bob"))
    job = train(tiny(400), client=client)

    def checkpointed() -> bool:
        return any(event.get("event") == "checkpoint" for event in job.events())

    wait_for(checkpointed, 600, "the job's first checkpoint", every=1)
    stack.compose("stop", "worker")  # SIGTERM: the worker's warm shutdown
    job.refresh()
    assert job.status in ("queued", "running"), job.status
    stack.compose("start", "worker")
    job.wait(poll=1, timeout=900, progress=False)
    assert job.status == "completed", job.error
    assert job.to_dict()["attempts"] == 2
    assert any(event.get("event") == "resumed" for event in job.events())


def test_the_stack_brought_down_and_up_again_keeps_its_jobs_and_weights(
    stack: ComposeStack, tmp_path: Path
) -> None:
    client, job = completed_job(stack, "carol", 10)
    stack.compose("down")  # the containers go; the volumes stay
    stack.compose("up", "-d")  # the migration runs again, against the database it left
    stack.wait_until_up()
    kept = relay.sft.retrieve(job.id, client=client)
    assert kept.status == "completed" and kept.step == 10
    assert (kept.download(tmp_path / "weights", progress=False) / "model.safetensors").is_file()
