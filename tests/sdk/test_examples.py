"""The recipe-job examples of docs/recipe-jobs.md, as written, against the served API and a real worker.

Only what this machine needs is changed: model="pi05-tiny", a local synthetic dataset, and a few
steps instead of 6,000. The SDK finds the API and the key in RELAY_BASE_URL / RELAY_API_KEY.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.service.stack import Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def sdk_env(monkeypatch: pytest.MonkeyPatch, stack: Stack, user: tuple[str, str], tmp_path: Path) -> str:
    monkeypatch.setenv("RELAY_BASE_URL", stack.api_url)
    monkeypatch.setenv("RELAY_API_KEY", user[1])
    monkeypatch.setenv("RELAY_HOME", str(tmp_path / "no-client-file-here"))
    return user[1]


def test_start_from_a_recipe(
    sdk_env: str, worker: WorkerProcess, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from relay.sft.config import SFTConfig
    from relay.sft.train import train

    config = SFTConfig(
        model="pi05-tiny",
        dataset_name=str(dataset),
        batch_size=32,
        learning_rate=2.5e-5,
        steps=10,
    )

    job = train(config)
    job.wait()
    print(job.status, job.step, job.loss)  # completed 6000 0.012

    assert re.fullmatch(r"completed 10 \d+\.\d+(e-?\d+)?\n", capsys.readouterr().out)


def test_the_config_examples_are_accepted(
    sdk_env: str, stack: Stack, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relay.sft.config import SFTConfig
    from relay.sft.train import train

    monkeypatch.setenv("RELAY_BASE_URL", stack.parked_api_url)  # accepted and left queued: no GPU here
    dataset_name = str(dataset)
    examples = [
        SFTConfig(model="pi05", dataset_name=dataset_name, finetune="full"),  # every weight
        SFTConfig(model="pi05", dataset_name=dataset_name, targets=["all"]),  # LoRA everywhere
        SFTConfig(model="pi05", dataset_name=dataset_name, targets=["language.mlp", "action_expert.attn"]),
    ]
    for config in examples:
        job = train(config)
        assert job.status == "queued"
        assert (job.model, job.finetune, job.targets) == ("pi05", config.finetune, config.targets)
        assert job.cancel().status == "cancelled"


def test_the_job_its_methods_and_finding_it_again(sdk_env: str, worker: WorkerProcess, dataset: Path) -> None:
    from relay.sft import list_jobs, retrieve
    from relay.sft.config import SFTConfig
    from relay.sft.train import train

    job = train(SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=10, name="spec"))
    for attribute in (
        "id",
        "status",
        "step",
        "loss",
        "error",
        "output_dir",
        "model",
        "dataset_name",
        "batch_size",
        "learning_rate",
        "steps",
        "finetune",
        "lora_rank",
        "lora_alpha",
        "targets",
        "cameras",
        "name",
    ):
        assert hasattr(job, attribute), attribute
    assert job.id.startswith("ft-") and job.status == "queued"

    job.refresh()  # bring it up to date
    job.wait(poll=30)  # until completed or cancelled; RuntimeError if it failed
    assert job.status == "completed" and job.output_dir

    events = job.events()
    # The spec's fields, plus the throughput figures the console and /metrics read.
    assert set(events[0]) - {"steps_per_second", "samples_per_second", "data_wait"} == {
        "step",
        "loss",
        "grad_norm",
        "lr",
        "skipped",
    }
    assert events[0]["step"] == 10
    assert events[-2:] == [
        {"step": 10, "event": "finished"},
        {"step": 10, "event": "stage", "stage": "writing"},
    ]

    assert retrieve(job.id).to_dict() == job.to_dict()
    newest_first = list_jobs()
    assert newest_first[0].id == job.id
    assert [j.id for j in newest_first] == [
        j.id for j in sorted(newest_first, key=lambda j: j.to_dict()["created_at"], reverse=True)
    ]

    running = train(SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=1, steps=100_000))
    wait_for(lambda: running.refresh().status == "running", 120, "the job to start", every=0.2)
    running.cancel()
    running.wait(poll=30)
    assert running.status == "cancelled"


def test_a_failed_request_raises_runtime_error_with_the_apis_message(sdk_env: str, dataset: Path) -> None:
    from relay.sft import retrieve
    from relay.sft.train import train

    # SFTConfig checks locally first; a plain mapping goes to the API as it is.
    with pytest.raises(RuntimeError) as refused:
        train({"model": "pi05-tiny", "dataset_name": str(dataset), "batch_size": 0})
    assert str(refused.value).startswith("POST /v1/fine-tunes: 400 bad batch_size: 0")
    with pytest.raises(
        RuntimeError, match=r"^GET /v1/fine-tunes/ft-000000000000: 404 no fine-tune ft-000000000000$"
    ):
        retrieve("ft-000000000000")


def test_wait_shows_a_progress_bar_on_a_terminal(
    sdk_env: str, worker: WorkerProcess, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from relay.sft.config import SFTConfig
    from relay.sft.train import train

    job = train(SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=10))
    job.wait(poll=1, progress=True)
    shown = capsys.readouterr().err
    assert job.id in shown and "10/10" in shown and "completed" in shown
