"""Deployments end to end: the API, Redis, PostgreSQL, a worker that trains a pi05-tiny job and two
serving workers (Celery processes on the serving queue only) that serve it.

A completed job is deployed through the SDK and answers over HTTP and, through the API's websocket,
to the real openpi-client with the user's key: the same chunk for the same seed as the job's
downloaded weights sampled in this process. Another user's deployment is not found; bad settings
are refused naming the field; a serving worker killed with SIGKILL costs clients a retryable 503
until the other worker has loaded the deployment again; a stop ends it, and so does its idle timeout.
The CLI creates, lists, shows and stops; bodies and websocket messages over the limit are refused.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
import websockets.exceptions
from fastapi.testclient import TestClient
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from sqlalchemy import select
from typer.testing import CliRunner
from websockets.sync.client import connect

from relay.cli import app
from relay.errors import APIError
from relay.http_client import Client
from relay.serving import Deployment, deploy, list_deployments, retrieve
from relay.serving.images import observation_json
from relay.sft.config import SFTConfig
from relay.sft.job import FineTuneJob
from relay.sft.train import train
from relay.training import ServiceClient
from relay_api.app import create_app
from relay_api.models import deployments as deployments_table
from relay_engine.serving import ServedPolicy
from tests.service.stack import PARKED_QUEUE, Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow

# The chunk of one observation and seed, served in a batch of one or computed here, differs by
# float32 rounding at most (the same weights, the same noise).
ATOL = 1e-4
READY_SECONDS = 120.0


@pytest.fixture(scope="module")
def serving_workers(stack: Stack) -> Iterator[list[WorkerProcess]]:
    """Two workers that take deployments only (and so never a job or a session)."""
    workers = [stack.start_standby_worker(queues=(stack.settings.serving_queue,)) for _ in range(2)]
    for worker in workers:
        worker.wait_ready()
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def owner(stack: Stack) -> Iterator[Client]:
    client = Client(stack.api_url, stack.new_user()[1], max_retries=0)
    yield client
    client.close()


@pytest.fixture
def stopped_after() -> Iterator[list[Deployment]]:
    """Deployments a test starts, stopped after it even when it fails: one left running holds its
    serving worker, and every later test's deployment would wait for a worker."""
    started: list[Deployment] = []
    yield started
    for deployment in started:
        with contextlib.suppress(Exception):
            if deployment.refresh().status in ("starting", "ready"):
                deployment.stop()


@pytest.fixture(scope="module")
def completed_job(stack: Stack, owner: Client) -> FineTuneJob:
    stack.worker()
    config = SFTConfig(
        model="pi05-tiny", dataset_name=str(stack.dataset()), batch_size=2, finetune="lora", steps=4
    )
    job = train(config, client=owner).wait(poll=0.5)
    assert job.status == "completed", job.error
    return job


@pytest.fixture(scope="module")
def downloaded(completed_job: FineTuneJob, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("downloaded")
    completed_job.download(directory)
    return directory


def observation(info: dict[str, Any], seed: int) -> dict[str, Any]:
    """An observation for the served model, from what its metadata says it reads."""
    rng = np.random.default_rng(seed)
    return {
        "images": {camera: rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for camera in info["cameras"]},
        # A model without saved features (a base model, a session's weights) takes any width up to 32.
        "state": rng.uniform(-1, 1, info["state_dim"] or 8).astype(np.float32),
        "prompt": "move to the orange dot",
    }


def in_process(directory: Path, obs: dict[str, Any], seed: int) -> np.ndarray:
    """The chunk the downloaded weights give for (obs, seed), sampled here (as `relay local` would)."""
    policy = ServedPolicy.load(directory, device="cpu")
    decoded = policy.decode({**obs, "state": [float(x) for x in obs["state"]]})
    return policy.act([decoded], [seed])[0].actions


def ready(deployment: Deployment) -> Deployment:
    return deployment.wait_ready(timeout=READY_SECONDS, poll=0.2)


def stop_and_wait(deployment: Deployment) -> None:
    deployment.stop()
    wait_for(lambda: deployment.refresh().status == "stopped", 30, "the deployment to stop", every=0.2)


def test_a_completed_job_is_served_over_http_and_to_openpi_client(
    stack: Stack,
    serving_workers: list[WorkerProcess],
    owner: Client,
    completed_job: FineTuneJob,
    downloaded: Path,
    stopped_after: list[Deployment],
) -> None:
    deployment = deploy(completed_job.id, max_batch=4, client=owner)
    stopped_after.append(deployment)
    assert deployment.status == "starting" and deployment.id.startswith("dep-")
    assert deployment.websocket_url == stack.api_url.replace("http://", "ws://") + (
        f"/v1/deployments/{deployment.id}/ws"
    )
    ready(deployment)
    assert deployment.info is not None and deployment.info["raw_units"] is True
    assert "internal_token" not in deployment.to_dict() and "internal_url" not in deployment.to_dict()

    obs = observation(deployment.info, 0)
    expected = in_process(downloaded, obs, seed=7)
    over_http = deployment.actions(obs, seed=7)
    np.testing.assert_allclose(over_http, expected, atol=ATOL)
    batch = deployment.actions_batch([obs, observation(deployment.info, 1)], seeds=[7, 8])
    np.testing.assert_allclose(batch[0], expected, atol=ATOL)

    # openpi's own client, pointed at the API with the user's key (sent as `Api-Key KEY`).
    robot = WebsocketClientPolicy(
        host=deployment.websocket_url.removeprefix("ws://"), port=None, api_key=owner.api_key
    )
    assert robot.get_server_metadata()["cameras"] == deployment.info["cameras"]
    answer = robot.infer({**obs, "seed": 7})
    np.testing.assert_allclose(answer["actions"], expected, atol=ATOL)
    assert set(answer["server_timing"]) >= {"infer_ms"}

    # The figures reach the deployment with the worker's next lease renewal, the robot among them.
    # Four observations answered (what `requests` counts): one, a batch of two in one request, one
    # over the websocket. (A renewal between the robot's connection and its answer reports the robot
    # with three requests: the next one has all four.)
    def robot_counted() -> bool:
        stats = deployment.refresh().stats or {}
        return stats.get("clients") == 1 and stats.get("requests") == 4

    assert wait_for(robot_counted, 40, "the robot and its request in stats") and deployment.stats is not None
    assert deployment.stats["latency_ms"]["p50"] is not None
    robot._ws.close()

    # Another user sees none of it: the deployment, its actions and its websocket are not found.
    stranger = {"authorization": f"Bearer {stack.new_user()[1]}"}
    for method, path in (("GET", ""), ("GET", "/events"), ("DELETE", ""), ("POST", "/actions")):
        response = httpx.request(
            method,
            f"{stack.api_url}/v1/deployments/{deployment.id}{path}",
            headers=stranger,
            json={"observation": observation_json(obs)} if method == "POST" else None,
        )
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["code"] == "not_found"
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        WebsocketClientPolicy(
            host=deployment.websocket_url, api_key=stranger["authorization"].removeprefix("Bearer ")
        )
    assert refused.value.response.status_code == 404
    with pytest.raises(websockets.exceptions.InvalidStatus) as no_key:
        WebsocketClientPolicy(host=deployment.websocket_url, api_key="relay-not-a-key")
    assert no_key.value.response.status_code == 401

    # A bad observation is refused by the server with the field named, through the API.
    bad = httpx.post(
        deployment.actions_url,
        headers={"authorization": f"Bearer {owner.api_key}"},
        json={"observation": {**observation_json(obs), "state": [1.0] * 40}, "seed": 1},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "observation.state", bad.text

    listed, _ = list_deployments(client=owner)
    assert [d.id for d in listed] == [deployment.id]
    stop_and_wait(deployment)
    assert deployment.error == "stopped by its owner" and deployment.ended_at is not None
    gone = httpx.post(
        deployment.actions_url,
        headers={"authorization": f"Bearer {owner.api_key}"},
        json={"observation": observation_json(obs)},
    )
    assert gone.status_code == 410 and gone.json()["error"]["code"] == "deployment_stopped"
    assert [e["event"] for e in deployment.events()] == ["starting", "ready", "stopped"]


def test_a_killed_serving_worker_costs_clients_a_retryable_503_until_another_serves_it(
    stack: Stack,
    serving_workers: list[WorkerProcess],
    owner: Client,
    completed_job: FineTuneJob,
) -> None:
    deployment = ready(deploy(completed_job.id, client=owner))
    obs = observation(deployment.info or {}, 3)
    before = deployment.actions(obs, seed=11)

    holder = _holding_worker(stack, serving_workers, deployment.id)
    holder.kill()
    headers = {"authorization": f"Bearer {owner.api_key}"}
    body = {"observation": observation_json(obs), "seed": 11}
    refused = httpx.post(deployment.actions_url, headers=headers, json=body, timeout=10)
    assert refused.status_code == 503, refused.text
    assert int(refused.headers["retry-after"]) > 0
    assert refused.json()["error"]["code"] in ("deployment_unreachable", "deployment_not_ready")

    # The reconciler sees the lease lapse, puts it back to starting, and the other worker loads it.
    wait_for(lambda: deployment.refresh().attempt == 2, 60, "the restart", every=0.2)
    ready(deployment)
    after = deployment.actions(obs, seed=11)
    np.testing.assert_allclose(after, before, atol=ATOL)
    kinds = [e["event"] for e in deployment.events()]
    assert kinds == ["starting", "ready", "starting", "ready"], kinds
    assert "restarting on another worker" in deployment.events()[2]["reason"]
    stop_and_wait(deployment)
    holder.start()  # the module's second serving worker again, for the tests after this one
    holder.wait_ready()


def _holding_worker(stack: Stack, workers: list[WorkerProcess], deployment_id: str) -> WorkerProcess:
    """The serving worker whose pool process holds the deployment."""
    with stack.sessions() as db:
        name = db.execute(
            select(deployments_table.c.worker).where(deployments_table.c.id == deployment_id)
        ).scalar()
    pid = int(str(name).rsplit(":", 1)[1])
    for worker in workers:
        assert worker.process is not None
        family = {
            worker.process.pid,
            *(c.pid for c in psutil.Process(worker.process.pid).children(recursive=True)),
        }
        if pid in family:
            return worker
    raise AssertionError(f"no serving worker holds {deployment_id} ({name})")


def test_settings_no_worker_could_run_are_refused_naming_the_field(
    stack: Stack, owner: Client, completed_job: FineTuneJob
) -> None:
    headers = {"authorization": f"Bearer {owner.api_key}"}
    stranger = {"authorization": f"Bearer {stack.new_user()[1]}"}
    cases: list[tuple[dict[str, str], dict[str, Any], int, str]] = [
        (headers, {"model": "pi05-huge"}, 400, "model"),
        (headers, {"model": "pi05-tiny", "max_batch": 0}, 400, "max_batch"),
        (headers, {"model": "pi05-tiny", "max_batch": 65}, 400, "max_batch"),
        (headers, {"model": "pi05-tiny", "gpus": 2}, 400, "gpus"),
        (headers, {"model": "pi05-tiny", "idle_timeout_seconds": 0}, 400, "idle_timeout_seconds"),
        (headers, {"model": "pi05-tiny", "colour": "red"}, 400, "colour"),
        (headers, {"model": "ft-000000000000"}, 404, "model"),
        (headers, {"model": "ses-000000000000/weights"}, 404, "model"),
        (stranger, {"model": completed_job.id}, 404, "model"),  # another user's job
    ]
    for who, body, status, param in cases:
        response = httpx.post(f"{stack.api_url}/v1/deployments", headers=who, json=body)
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert error["param"] == param and param in error["message"], (body, error)
    # A job that has not completed is refused too: its weights do not exist yet.
    queued = httpx.post(
        f"{stack.parked_api_url}/v1/fine-tunes",
        headers=headers,
        json={"model": "pi05-tiny", "dataset_name": str(stack.dataset()), "steps": 1},
    ).json()
    response = httpx.post(f"{stack.api_url}/v1/deployments", headers=headers, json={"model": queued["id"]})
    assert response.status_code == 400 and response.json()["error"]["code"] == "model_not_ready", (
        response.text
    )


def test_an_idle_deployment_stops_itself_and_a_key_replays_the_create(
    stack: Stack, serving_workers: list[WorkerProcess], owner: Client
) -> None:
    key = uuid.uuid4().hex
    deployment = deploy("pi05-tiny", idle_timeout_seconds=2, idempotency_key=key, client=owner)
    again = deploy("pi05-tiny", idle_timeout_seconds=2, idempotency_key=key, client=owner)
    assert again.id == deployment.id
    ready(deployment)
    assert deployment.info is not None and deployment.info["raw_units"] is False  # a base model
    wait_for(lambda: deployment.refresh().status == "stopped", 30, "the idle timeout", every=0.2)
    assert deployment.error is not None and "idle_timeout_seconds" in deployment.error
    assert retrieve(deployment.id, client=owner).status == "stopped"


def test_the_cli_deploys_lists_shows_and_stops_and_oversized_messages_are_refused(
    stack: Stack, serving_workers: list[WorkerProcess], tmp_path: Path
) -> None:
    key = stack.new_user()[1]
    runner = CliRunner()
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": key, "RELAY_HOME": str(tmp_path / "home")}

    def run(*args: str) -> str:
        result = runner.invoke(app, ["deployments", *args], env=env)
        assert result.exit_code == 0, (args, result.output)
        return result.output

    refused = runner.invoke(app, ["deployments", "create", "pi05-tiny", "--max-batch", "0"], env=env)
    assert refused.exit_code == 2 and "bad max_batch: 0 (must be an integer from 1 to 64)" in refused.output
    created = json.loads(run("create", "pi05-tiny", "--max-batch", "2", "--wait", "--json"))
    assert created["status"] == "ready" and created["max_batch"] == 2
    listed = [json.loads(line) for line in run("list", "--json").splitlines()]
    assert [d["id"] for d in listed] == [created["id"]]
    assert json.loads(run("show", created["id"], "--json"))["websocket_url"] == created["websocket_url"]

    # Over RELAY_SERVING_MAX_BODY_BYTES: a 413 before the body is read; the websocket closes (1009).
    limit = stack.settings.serving_max_body_bytes
    too_big = httpx.post(
        created["actions_url"],
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        content=b" " * (limit + 1),
    )
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "body_too_large"
    with connect(created["websocket_url"], additional_headers={"authorization": f"Api-Key {key}"}) as robot:
        robot.recv()  # the metadata
        robot.send(b"\0" * (limit + 1))
        with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
            robot.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009

    # The stop waits for the worker to let go: it never prints the deployment still "ready".
    stopped = json.loads(run("stop", created["id"], "--json"))
    assert stopped["id"] == created["id"] and stopped["status"] == "stopped"
    assert json.loads(run("show", created["id"], "--json"))["status"] == "stopped"


def test_a_sessions_saved_weights_are_served_in_normalized_units(
    stack: Stack, serving_workers: list[WorkerProcess], tmp_path: Path
) -> None:
    stack.worker()  # the sessions' worker
    key = stack.new_user()[1]
    service = ServiceClient(stack.api_url, key, progress=False)
    client = Client(stack.api_url, key, max_retries=0)
    try:
        with service.create_lora_training_client("pi05-tiny", rank=8) as training_client:
            sampler = training_client.save_weights_and_get_sampling_client("served")
            model = f"{training_client.id}/served"
        deployment = ready(deploy(model, client=client))
        assert deployment.info is not None and deployment.info["raw_units"] is False
        obs = observation(deployment.info, 5)
        one_camera = {**obs, "images": {"base_0_rgb": obs["images"]["base_0_rgb"]}}
        served = deployment.actions(one_camera, seed=3)
        expected = in_process(Path(sampler.path), one_camera, 3)
        np.testing.assert_allclose(served, expected, atol=ATOL)
        stop_and_wait(deployment)
        # Saved weights of a session that is not yours, or a name it never saved, are not found.
        stranger = Client(stack.api_url, stack.new_user()[1], max_retries=0)
        for who, name in ((stranger, model), (client, f"{training_client.id}/never-saved")):
            with pytest.raises(APIError) as refused:
                deploy(name, client=who)
            assert refused.value.status == 404 and refused.value.param == "model"
        stranger.close()
    finally:
        service.close()
        client.close()


def test_behind_a_proxy_the_urls_are_the_public_ones_and_a_waiting_deployment_stops_at_once(
    stack: Stack,
) -> None:
    settings = stack.settings.model_copy(
        update={"public_url": "https://relay.example.com", "serving_queue": PARKED_QUEUE + "-serving"}
    )
    headers = {"authorization": f"Bearer {stack.new_user()[1]}"}
    with TestClient(create_app(settings)) as api:
        created = api.post("/v1/deployments", headers=headers, json={"model": "pi05-tiny"}).json()
        assert created["websocket_url"] == f"wss://relay.example.com/v1/deployments/{created['id']}/ws"
        assert created["actions_url"] == f"https://relay.example.com/v1/deployments/{created['id']}/actions"
        waiting = api.post(f"/v1/deployments/{created['id']}/actions", headers=headers, json={})
        assert waiting.status_code == 503 and waiting.headers["retry-after"] == "2"
        assert waiting.json()["error"]["code"] == "deployment_not_ready"
        # No worker holds it: it stops now, not at a lease renewal.
        stopped = api.delete(f"/v1/deployments/{created['id']}", headers=headers).json()
        assert (
            stopped["status"] == "stopped" and stopped["error"] == "stopped by its owner before it was ready"
        )
        events = api.get(f"/v1/deployments/{created['id']}/events", headers=headers).json()["data"]
        assert [e["event"] for e in events] == ["starting", "stopped"]


def test_a_model_that_cannot_be_loaded_says_so_without_a_server_path(
    stack: Stack, serving_workers: list[WorkerProcess], owner: Client, stopped_after: list[Deployment]
) -> None:
    """A completed job whose weights are gone from the service's disk: the deployment ends in
    error saying why, the service's directories named in words (the worker's log keeps the path)."""
    stack.worker()  # the job's
    config = SFTConfig(model="pi05-tiny", dataset_name=str(stack.dataset()), batch_size=2, steps=2)
    job = train(config, client=owner).wait(poll=0.5)
    assert job.status == "completed", job.error
    assert job.output_dir is not None
    (Path(job.output_dir) / "model.safetensors").unlink()
    deployment = deploy(job.id, client=owner)
    stopped_after.append(deployment)
    wait_for(lambda: deployment.refresh().status == "error", READY_SECONDS, "the load to fail", every=0.5)
    assert deployment.error is not None and deployment.error.startswith("could not load the model: ")
    assert "the service's jobs directory" in deployment.error, deployment.error
    headers = {"authorization": f"Bearer {owner.api_key}"}
    answers = [
        httpx.get(f"{stack.api_url}/v1/deployments/{deployment.id}", headers=headers).text,
        httpx.get(f"{stack.api_url}/v1/deployments/{deployment.id}/events", headers=headers).text,
        httpx.post(f"{stack.api_url}/v1/deployments/{deployment.id}/actions", headers=headers, json={}).text,
    ]
    for answer in answers:
        assert str(stack.settings.jobs_dir) not in answer and str(stack.root) not in answer, answer
