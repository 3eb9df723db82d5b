"""A video dataset whose camera codec no live worker decodes is refused when the job is created,
naming the camera and the codec, before any GPU time is spent (real PostgreSQL, the stack's real
worker processes, which say in their heartbeats what they decode)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fastapi.testclient import TestClient

from relay_api.app import create_app
from relay_api.workers import LiveWorker, live_workers
from tests.service.stack import PARKED_QUEUE, Stack, wait_for
from tests.service.test_hardening import GOOD, error_of

CAMERA = "observation.images.top"


def beating_workers(stack: Stack) -> list[LiveWorker]:
    """The live workers, once the shared one (started on first use) has written its heartbeat."""
    stack.worker()

    def beating() -> list[LiveWorker]:
        with stack.sessions() as session:
            return live_workers(session, stack.settings.reconcile_seconds)

    found: list[LiveWorker] = wait_for(beating, 30, "the workers' heartbeats")
    return found


def test_the_workers_say_which_video_codecs_they_decode(stack: Stack) -> None:
    workers = beating_workers(stack)
    for worker in workers:
        assert worker.video_decoders is not None
        assert {"h264", "hevc", "av1"} <= worker.video_decoders


def test_a_camera_in_a_codec_no_worker_decodes_is_refused_at_create_naming_it(
    stack: Stack, alice: dict[str, str], video_dataset: Path
) -> None:
    assert beating_workers(stack)  # with no live worker nothing is known, and nothing refused
    readable = video_dataset
    unreadable = stack.root / "datasets" / "v30-unknown-codec"
    shutil.copytree(readable, unreadable, dirs_exist_ok=True)
    info_path = unreadable / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["features"][CAMERA]["info"]["video.codec"] = "relay-test-codec"
    info_path.write_text(json.dumps(info))
    settings = stack.settings.model_copy(
        update={"api_shares_workers_disk": True, "fine_tune_queue": PARKED_QUEUE}
    )
    with TestClient(create_app(settings)) as api:
        before = api.get("/v1/fine-tunes", headers=alice).json()["data"]
        error = error_of(
            api.post("/v1/fine-tunes", json={**GOOD, "dataset_name": str(unreadable)}, headers=alice), 400
        )
        assert error["param"] == "dataset_name" and error["code"] == "invalid_value"
        assert (
            f"camera {CAMERA} is stored as relay-test-codec video, which no live worker can decode"
            in error["message"]
        )
        assert api.get("/v1/fine-tunes", headers=alice).json()["data"] == before  # nothing created
        accepted = api.post("/v1/fine-tunes", json={**GOOD, "dataset_name": str(readable)}, headers=alice)
        assert accepted.status_code == 200, accepted.text
