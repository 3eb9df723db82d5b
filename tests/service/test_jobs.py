"""Jobs end to end through the API, Redis and a real Celery worker running pi05-tiny on CPU:
the lifecycle with events and files, a dataset that fails validation, cancel while running,
a duplicate delivery, the dataset revision a job read from the (loopback) Hub."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path

import httpx
import pytest

from relay.http_client import Client
from relay.progress import recent_rate
from relay.sft.config import SFTConfig
from relay.sft.job import FineTuneJob
from relay.sft.train import train
from relay_api.queue import Publisher
from relay_api.schemas import EventOut
from tests.hub import FakeHub, Repo
from tests.service.stack import ApiServer, Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow


def tiny(dataset: Path, **fields: object) -> SFTConfig:
    return SFTConfig(
        **{"model": "pi05-tiny", "dataset_name": str(dataset), "batch_size": 2, "finetune": "lora", **fields}
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_events_unique(job: FineTuneJob) -> None:
    events = job.events()
    keys = [(e["step"], e.get("event", "metrics")) for e in events]
    assert len(keys) == len(set(keys)), keys
    ids = [e.id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_a_job_runs_to_completion_with_its_events_and_files(
    stack: Stack,
    worker: WorkerProcess,
    client: Client,
    dataset: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = train(tiny(dataset, steps=20, name="lifecycle"), client=client)
    assert job.status == "queued" and job.id.startswith("ft-")

    streamed = list(job.follow())  # live, from the start, until the job ends
    job.wait(poll=1)
    assert job.status == "completed", job.error
    # stderr is no terminal here, so the wait printed plain progress lines, the last one the end.
    progress = capsys.readouterr().err.splitlines()
    assert progress and progress[-1].startswith(f"{job.id} completed  step 20/20  loss ")
    assert job.step == 20 and job.loss is not None and job.error is None
    # The job's loss is the latest metrics event's (a window mean), not one step's.
    assert job.loss == pytest.approx([e for e in job.events() if "loss" in e][-1]["loss"], rel=1e-6)
    assert job.output_dir is not None and job.output_dir.endswith(f"{job.id}/output")
    assert job.to_dict()["attempts"] == 1 and job.to_dict()["finished_at"]

    events = job.events()
    assert events == streamed and [e.id for e in events] == [e.id for e in streamed]
    metrics = [e for e in events if "event" not in e]
    assert [e["step"] for e in metrics] == [10, 20]
    speed = {"steps_per_second", "samples_per_second", "data_wait"}
    assert all(set(e) == {"step", "loss", "grad_norm", "lr", "skipped", *speed} for e in metrics)
    assert [e["step"] for e in events if e.get("event") == "checkpoint"] == [10, 20]
    assert events[-2:] == [
        {"step": 20, "event": "finished"},
        {"step": 20, "event": "stage", "stage": "writing"},
    ]
    assert job.events(after=events[1].id) == events[2:]
    assert job.events(after=events[-1].id) == []
    assert_events_unique(job)

    # The raw stream says what /openapi.json says of it: `id:` and `data:` an EventOut, then [DONE].
    raw = httpx.get(
        f"{client.base_url}/v1/fine-tunes/{job.id}/events",
        params={"stream": "true"},
        headers={"authorization": f"Bearer {client.api_key}"},
    )
    messages = [m for m in raw.text.replace("\r\n", "\n").split("\n\n") if m.strip()]
    fields = [
        dict(line.split(": ", 1) for line in m.splitlines() if not line.startswith(":")) for m in messages
    ]
    assert fields[-1] == {"data": "[DONE]"}
    for message in fields[:-1]:
        event = EventOut.model_validate_json(message["data"])
        assert str(event.id) == message["id"]
    assert [int(m["id"]) for m in fields[:-1]] == [e.id for e in events]

    files = {f["path"]: f for f in job.files(checkpoints=True)}
    outputs = {p for p in files if p.startswith("output/")}
    assert outputs == {
        f"output/{name}"
        for name in (
            "model.safetensors",
            "config.json",
            "relay_config.json",
            "norm_stats.json",
            "policy_preprocessor.json",
            "policy_preprocessor_step_3_normalizer_processor.safetensors",
            "policy_postprocessor.json",
            "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
        )
    }
    assert any(p.startswith("checkpoints/step-00000020/") for p in files)

    target = job.download(tmp_path / "weights")
    for name in ("model.safetensors", "config.json", "relay_config.json", "norm_stats.json"):
        local = target / name
        assert sha256(local) == files[f"output/{name}"]["sha256"]
        assert local.stat().st_size == files[f"output/{name}"]["bytes"]
    json.loads((target / "config.json").read_text())

    # Range requests: a slice, and a download that resumes a partial copy.
    weights = (target / "model.safetensors").read_bytes()
    path = f"/v1/fine-tunes/{job.id}/files/output/model.safetensors"
    headers = {"authorization": f"Bearer {client.api_key}"}
    part = httpx.get(client.base_url + path, headers={**headers, "range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == weights[100:200]
    assert part.headers["x-checksum-sha256"] == files["output/model.safetensors"]["sha256"]
    resumed = tmp_path / "resumed.safetensors"
    resumed.with_name(resumed.name + ".part").write_bytes(weights[:1000])
    assert client.download(path, resumed) == files["output/model.safetensors"]["sha256"]
    assert resumed.read_bytes() == weights

    # Every listed file has its sha256, checkpoint files too, and the download carries the same one.
    assert all(isinstance(f["sha256"], str) and len(f["sha256"]) == 64 for f in files.values())
    # A shard of the trainable weights and moments (torch.distributed.checkpoint's file).
    checkpoint = next(p for p in files if p.startswith("checkpoints/") and p.endswith(".distcp"))
    answer = httpx.get(f"{client.base_url}/v1/fine-tunes/{job.id}/files/{checkpoint}", headers=headers)
    assert answer.status_code == 200
    assert answer.headers["x-checksum-sha256"] == hashlib.sha256(answer.content).hexdigest()
    assert answer.headers["x-checksum-sha256"] == files[checkpoint]["sha256"]

    assert_the_card_agrees_with_the_events(stack, client, job, files)

    # A finished job stays finished.
    with pytest.raises(RuntimeError, match=r"409 fine-tune ft-[0-9a-f]{12} is already completed"):
        job.cancel()


def assert_the_card_agrees_with_the_events(
    stack: Stack, client: Client, job: FineTuneJob, files: dict[str, dict[str, object]]
) -> None:
    """GET /v1/fine-tunes/{id}/summary of a completed job: its figures are its events' and its row's."""
    card = job.summary()
    events = job.events()
    metrics = [e for e in events if e.kind == "metrics"]
    losses = [(e["step"], e["loss"]) for e in metrics]
    assert (card.status, card.step, card.steps, card.progress) == ("completed", 20, 20, 1.0)
    assert card.loss.first is not None and card.loss.last is not None and card.loss.best is not None
    assert (card.loss.first.step, card.loss.first.loss) == losses[0]
    assert (card.loss.last.step, card.loss.last.loss) == losses[-1]
    assert card.loss.best.loss == min(loss for _, loss in losses)
    # The run's pace lies between its windows' paces; samples are steps times the batch of 2.
    rates = [e["steps_per_second"] for e in metrics]
    assert card.steps_per_second is not None and min(rates) <= card.steps_per_second <= max(rates)
    assert card.samples_per_second == pytest.approx(2 * card.steps_per_second)
    # The recent pace: wall-clock time between the events of the last minute (relay.progress).
    reported = [(e["step"], dt.datetime.fromisoformat(e.created_at).timestamp()) for e in metrics]
    assert card.latest_steps_per_second == pytest.approx(recent_rate(reported))
    started = dt.datetime.fromisoformat(job.to_dict()["started_at"])
    finished = dt.datetime.fromisoformat(job.to_dict()["finished_at"])
    assert card.duration_seconds == card.elapsed_seconds == round((finished - started).total_seconds(), 1)
    assert card.eta_seconds is None and card.metrics_note is None
    # Each checkpoint beside its files, with the loss of the window that ends at its step.
    written = {e["step"]: e.get("seconds") for e in events if e.kind == "checkpoint"}
    assert [(c.step, c.metrics_step, c.loss, c.seconds) for c in card.checkpoints] == [
        (step, step, dict(losses)[step], seconds) for step, seconds in written.items()
    ]
    for checkpoint in card.checkpoints:
        assert checkpoint.kept and any(path.startswith(checkpoint.path + "/") for path in files)
    assert card.validation is None and card.eval is None  # the job reported neither
    assert card.use.ready and card.use.download == f"relay fine-tunes download {job.id} --dir {job.id}"
    assert f'load_policy("{job.id}")' in card.use.python
    # The answer is the shape /openapi.json gives it; another user's job is not found.
    document = httpx.get(f"{client.base_url}/openapi.json").json()
    answer = document["paths"]["/v1/fine-tunes/{job_id}/summary"]["get"]["responses"]["200"]
    assert answer["content"]["application/json"]["schema"]["$ref"].endswith("/FineTuneSummary")
    _, other_key = stack.new_user()
    theirs = httpx.get(
        f"{client.base_url}/v1/fine-tunes/{job.id}/summary", headers={"authorization": f"Bearer {other_key}"}
    )
    assert theirs.status_code == 404 and f"no fine-tune {job.id}" in theirs.json()["error"]["message"]


def test_a_dataset_that_fails_validation_ends_the_job_in_error_and_the_worker_goes_on(
    stack: Stack, worker: WorkerProcess, client: Client, dataset: Path
) -> None:
    from relay_engine.datasets import open_dataset
    from relay_engine.errors import DatasetError

    broken = stack.root / "datasets" / "video"
    if not broken.exists():
        shutil.copytree(dataset, broken)
        info_path = broken / "meta" / "info.json"
        info = json.loads(info_path.read_text())
        for feature in info["features"].values():
            if feature.get("dtype") == "image":
                feature["dtype"] = "video"
        info_path.write_text(json.dumps(info))
    with pytest.raises(DatasetError) as expected:
        open_dataset(str(broken), action_horizon=10, cache_dir=stack.root / "check-cache")

    job = train(tiny(broken, steps=10), client=client)
    with pytest.raises(RuntimeError, match=f"fine-tune {job.id} failed: "):
        job.wait(poll=1)
    assert job.status == "error" and job.error == str(expected.value)
    assert job.events()[-1] == {"step": 0, "event": "error", "message": str(expected.value)}

    after = train(tiny(dataset, steps=10), client=client).wait(poll=1)
    assert after.status == "completed"


def test_cancelling_a_running_job_stops_it_within_a_step(
    worker: WorkerProcess, client: Client, dataset: Path
) -> None:
    job = train(tiny(dataset, steps=100_000, batch_size=1), client=client)
    wait_for(lambda: job.refresh().step >= 10, 120, "the job to report progress", every=0.2)
    assert job.status == "running"
    # While it runs, the card has an ETA at the latest window's pace, and no duration yet.
    card = job.summary()
    assert card.status == "running" and card.latest_steps_per_second is not None
    assert card.eta_seconds == pytest.approx((card.steps - card.step) / card.latest_steps_per_second, abs=0.1)
    assert card.elapsed_seconds is not None and card.duration_seconds is None
    assert not card.use.ready and card.use.note == "the output is written when the job completes"

    job.cancel()
    assert job.status in ("cancel_requested", "cancelled")
    asked = time.monotonic()
    again = job.cancel()  # asking twice is harmless
    assert again.status in ("cancel_requested", "cancelled")
    job.wait(poll=1)  # returns: cancelled is not a failure
    assert job.status == "cancelled" and job.to_dict()["finished_at"]
    assert time.monotonic() - asked < 30
    assert job.step < 100_000
    assert job.events()[-1]["event"] == "cancelled"
    assert job.cancel().status == "cancelled"  # and a cancelled job stays cancelled
    assert_events_unique(job)


def test_a_duplicate_delivery_does_not_train_twice(
    stack: Stack, worker: WorkerProcess, client: Client, dataset: Path
) -> None:
    job = train(tiny(dataset, steps=10), client=client)
    Publisher(stack.settings).fine_tune(job.id)  # the same wake-up, delivered again
    job.wait(poll=1)
    assert job.status == "completed"
    assert job.to_dict()["attempts"] == 1
    assert_events_unique(job)


def test_a_jobs_object_shows_the_hub_revision_and_commit_it_read(stack: Stack, dataset: Path) -> None:
    # A worker of its own, on a queue of its own, that reaches a loopback Hub serving the dataset.
    queue = f"fine-tunes-hub-{uuid.uuid4().hex[:6]}"
    with FakeHub() as hub:
        repo = Repo()
        tagged = repo.add_commit(dataset, tag="v2.1")
        repo.add_commit(dataset, branch="main")
        hub.repos["relay-tests/tiny"] = repo
        api = ApiServer(
            stack.settings.model_copy(update={"fine_tune_queue": queue, "session_queue": queue + "-s"})
        )
        env = {
            **os.environ,
            **stack.env_settings,
            "RELAY_FINE_TUNE_QUEUE": queue,
            "RELAY_SESSION_QUEUE": queue + "-s",
            "HF_ENDPOINT": hub.endpoint,
        }
        worker = WorkerProcess(env, stack.root / f"worker-{queue}.log")
        worker.start()
        client = Client(api.url, stack.new_user()[1], max_retries=0)
        try:
            worker.wait_ready()
            config = SFTConfig(
                model="pi05-tiny",
                dataset_name="relay-tests/tiny",
                dataset_revision="v2.1",
                batch_size=2,
                finetune="lora",
                steps=2,
            )
            job = train(config, client=client)
            assert job.dataset is None  # nothing is read before a worker opens it
            job.wait(poll=1)
            assert job.status == "completed", job.error
            summary = json.loads((dataset / "meta/info.json").read_text())
            read = {
                "repo": "relay-tests/tiny",
                "path": None,
                "revision": "v2.1",
                "sha": tagged,
                "format": "v2.1",
                "frames": summary["total_frames"],
                "episodes": summary["total_episodes"],
            }
            assert job.dataset_revision == "v2.1"
            events = job.events()
            # What was read is the job's, not an event: the events are its training's, metrics first.
            assert [e.kind for e in events][:1] == ["metrics"], events
            assert not [e for e in events if e.kind == "dataset"], events
            assert job.dataset == read
            assert job.refresh().to_dict()["dataset"] == read  # GET /v1/fine-tunes/{id}
            EventOut.model_validate(
                {
                    "id": 1,
                    "object": "fine_tune.event",
                    "created_at": "2026-01-01T00:00:00Z",
                    "kind": "dataset",
                    "step": 0,
                    "event": "dataset",
                    **read,
                }
            )
        finally:
            client.close()
            worker.stop()
            api.stop()
