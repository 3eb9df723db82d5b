"""RT-J jobs through the served API, Redis and a real Celery worker: the same statuses, events,
checkpoints and downloads as pi05 jobs, and fields of the other family refused with a 400."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from relay.http_client import Client
from relay.serving import deploy
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_engine.families.rtj.synth import write_fake_shop
from relay_engine.relational import RelationalTransformer
from relay_worker.serving.server import ServingOptions, start_policy_server
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shop(stack: Stack) -> Path:
    path = stack.root / "databases" / "shop"
    if not path.exists():
        write_fake_shop(path, customers=20, reviews=120)
    return path


def test_an_rt_j_job_runs_to_completion_with_its_events_and_files(
    worker: WorkerProcess, client: Client, shop: Path, tmp_path: Path
) -> None:
    config = SFTConfig(
        model="rt-j-tiny",
        dataset_name=str(shop),
        task="user-churn",
        batch_size=4,
        steps=10,
        learning_rate=1e-3,
    )
    job = train(config, client=client)
    assert job.status == "queued"
    job.wait(poll=1)
    assert job.status == "completed", job.error
    assert job.step == 10 and job.loss is not None
    described = job.to_dict()
    assert described["task"] == "user-churn" and described["finetune"] == "full"

    events = job.events()
    assert [e["step"] for e in events if "loss" in e] == [10]
    assert [e["step"] for e in events if e.get("event") == "checkpoint"] == [10]
    assert events[-2:] == [
        {"step": 10, "event": "finished"},
        {"step": 10, "event": "stage", "stage": "writing"},
    ]

    files = {f["path"] for f in job.files(checkpoints=True)}
    assert {"output/model.safetensors", "output/config.json"} <= files
    assert any(p.startswith("checkpoints/step-00000010/") for p in files)
    target = job.download(tmp_path / "weights")
    tuned = RelationalTransformer(str(target), device="cpu")
    assert tuned.config["relay"]["task"] == "user-churn" and tuned.problem_type == "binary"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": "rt-j-tiny", "task": "user-churn", "cameras": {"base_0_rgb": "x"}}, "cameras"),
        ({"model": "rt-j-tiny"}, "task"),
        ({"model": "pi05-tiny", "task": "user-churn"}, "task"),
    ],
)
def test_fields_of_the_other_family_are_a_400(
    stack: Stack, user: tuple[str, str], shop: Path, fields: dict[str, object], param: str
) -> None:
    response = httpx.post(
        f"{stack.api_url}/v1/fine-tunes",
        json={"dataset_name": str(shop), **fields},
        headers={"authorization": f"Bearer {user[1]}"},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"]
    listed = httpx.get(f"{stack.api_url}/v1/fine-tunes", headers={"authorization": f"Bearer {user[1]}"})
    assert listed.json()["data"] == [], "a refused job was created"


def test_a_tuned_rt_j_is_deployed_and_predicts_rows_of_its_database(
    stack: Stack, worker: WorkerProcess, client: Client, shop: Path, tmp_path: Path
) -> None:
    """Deployed from its job, the RT-J answers POST /v1/deployments/{id}/predictions through the API
    with the scores its downloaded output gives in this process (the policy server, loaded here)."""
    config = SFTConfig(model="rt-j-tiny", dataset_name=str(shop), task="user-churn", batch_size=4, steps=4)
    job = train(config, client=client).wait(poll=0.5)
    assert job.status == "completed", job.error
    serving = stack.start_standby_worker(queues=(stack.settings.serving_queue,))
    serving.wait_ready()
    deployment = deploy(job.id, client=client)
    try:
        deployment.wait_ready(timeout=120, poll=0.2)
        rows = [{"primary_key": "customer_1"}, {"primary_key": "customer_2", "time": "2021-01-01T00:00:00Z"}]
        served = deployment.predictions(rows)
        local = start_policy_server(job.download(tmp_path / "weights"), options=ServingOptions(device="cpu"))
        try:
            expected = httpx.post(f"{local.url}/predictions", json={"rows": rows}, timeout=60).json()
        finally:
            local.stop()
        assert [p["primary_key"] for p in served] == ["customer_1", "customer_2"]
        np.testing.assert_allclose(
            [p["score"] for p in served], [p["score"] for p in expected["predictions"]], atol=1e-5
        )
        # A policy's endpoints are not an RT-J's: the API relays the server's 400 naming the right one.
        refused = httpx.post(
            f"{stack.api_url}/v1/deployments/{deployment.id}/actions",
            json={"observation": {"images": {}, "state": [], "prompt": "x"}},
            headers={"authorization": f"Bearer {client.api_key}"},
        )
        assert refused.status_code == 400 and "/predictions" in refused.json()["error"]["message"]
        unknown = httpx.post(
            f"{stack.api_url}/v1/deployments/{deployment.id}/predictions",
            json={"rows": [{"primary_key": "nobody"}]},
            headers={"authorization": f"Bearer {client.api_key}"},
        )
        assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "rows[0].primary_key"
    finally:
        deployment.stop()
        serving.stop()
