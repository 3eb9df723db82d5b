"""SmolVLA jobs through the served API, Redis and a real Celery worker: the same statuses, events,
checkpoints and downloads as pi05's, lerobot's files as the output, and its refusals a 400."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_engine.families.smolvla.policy import SmolVLAPolicy
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow


def test_a_smolvla_job_runs_to_completion_with_lerobot_s_files(
    worker: WorkerProcess, client: Client, dataset: Path, tmp_path: Path
) -> None:
    job = train(
        SFTConfig(model="smolvla-tiny", dataset_name=str(dataset), batch_size=4, steps=8), client=client
    )
    job.wait(poll=1)
    assert job.status == "completed", job.error
    assert job.step == 8 and job.loss is not None
    described = job.to_dict()
    assert described["finetune"] == "full" and described["learning_rate"] == 1e-3

    events = job.events()
    assert [e["step"] for e in events if e.get("event") == "checkpoint"] == [8]
    assert job.dataset is not None and job.dataset["path"] == str(dataset)

    files = {f["path"] for f in job.files()}
    assert {
        "output/model.safetensors",
        "output/config.json",
        "output/policy_preprocessor.json",
        "output/policy_postprocessor.json",
        "output/vlm/config.json",
        "output/vlm/tokenizer.json",
    } <= files
    target = job.download(tmp_path / "weights")
    assert json.loads((target / "config.json").read_text())["type"] == "smolvla"
    tuned = SmolVLAPolicy.from_lerobot(target, target / "vlm")
    assert tuned.action_dim > 0 and tuned.cameras


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": "smolvla-tiny", "cameras": {"base_0_rgb": "observation.images.top"}}, "cameras"),
        ({"model": "smolvla-tiny", "finetune": "lora"}, "finetune"),
        ({"model": "smolvla-tiny", "task": "user-churn"}, "task"),
        ({"model": "smolvla-tiny", "validation_episodes": 0.2}, "validation_episodes"),
    ],
)
def test_what_smolvla_does_not_take_is_a_400_naming_the_field(
    stack: Stack, user: tuple[str, str], dataset: Path, fields: dict[str, object], param: str
) -> None:
    response = httpx.post(
        f"{stack.api_url}/v1/fine-tunes",
        json={"dataset_name": str(dataset), **fields},
        headers={"Authorization": f"Bearer {user[1]}"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
