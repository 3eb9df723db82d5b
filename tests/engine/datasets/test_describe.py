"""`describe_dataset` and `relay datasets inspect`: a dataset described from its meta files alone,
local or on a loopback Hub (tests/hub.py); and the process the API asks (describe_server)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay.dataset_description import DatasetCamera, DatasetDescription
from relay_engine.datasets import describe_dataset
from relay_engine.datasets.synth import write_synthetic_dataset
from relay_engine.errors import DatasetError
from tests.hub import FakeHub, Repo
from tests.isolation import free_port

CAMERAS = {"observation.images.top": (32, 32), "observation.images.wrist": (24, 32)}
REPO = "relay-tests/video"

runner = CliRunner()


@pytest.fixture(scope="module")
def v30_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("describe") / "v30-video",
        episodes=5,
        episode_length=(6, 14),
        cameras=CAMERAS,
        num_tasks=2,
        seed=3,
        format="v3.0",
        video=True,
        episodes_per_file=2,
    )


@pytest.fixture
def hub(v30_video: Path, synthetic: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as server:
        repo = Repo()
        server.repos[REPO] = repo
        repo.add_commit(synthetic, tag="v2.1")
        repo.add_commit(v30_video, branch="main")
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server


def frames_of(root: Path) -> int:
    return int(json.loads((root / "meta/info.json").read_text())["total_frames"])


def test_a_v30_video_dataset_is_described_from_its_meta_files_alone(v30_video: Path, tmp_path: Path) -> None:
    # Only meta/ is left: nothing else is read.
    root = tmp_path / "meta-only"
    shutil.copytree(v30_video / "meta", root / "meta")
    described = describe_dataset(str(root))
    assert described.format == "v3.0"
    assert (described.path, described.repo, described.revision, described.sha) == (
        str(root),
        None,
        None,
        None,
    )
    assert described.cameras == [
        DatasetCamera(
            feature="observation.images.top", stored="video", height=32, width=32, codec="h264",
            pix_fmt="yuv420p", fps=10.0,
        ),
        DatasetCamera(
            feature="observation.images.wrist", stored="video", height=24, width=32, codec="h264",
            pix_fmt="yuv420p", fps=10.0,
        ),
    ]  # fmt: skip
    assert described.camera_map == {
        "base_0_rgb": "observation.images.top",
        "left_wrist_0_rgb": "observation.images.wrist",
    }
    assert (described.episodes, described.frames, described.fps) == (5, frames_of(v30_video), 10.0)
    assert (described.state_dim, described.action_dim) == (2, 2)
    assert [task.task for task in described.tasks] == ["move to the red dot", "move to the blue dot"]
    assert described.line() == f"LeRobot v3.0, 5 episodes, {described.frames} frames, 10 fps, video h264"


def test_an_image_dataset_has_image_cameras(synthetic: Path) -> None:
    described = describe_dataset(str(synthetic))
    assert described.format == "v2.1"
    assert [(c.feature, c.stored, c.height, c.width, c.codec) for c in described.cameras] == [
        ("observation.images.top", "image", 32, 32, None),
        ("observation.images.wrist", "image", 24, 32, None),
    ]
    assert described.line().endswith(", images")


def test_a_hub_repo_is_described_from_meta_alone(hub: FakeHub, v30_video: Path, tmp_path: Path) -> None:
    main = describe_dataset(REPO, revision="main", cache_dir=tmp_path / "cache")
    assert (main.repo, main.revision, main.path, main.format) == (REPO, "main", None, "v3.0")
    assert main.sha == hub.repos[REPO].branches["main"]
    assert main.frames == frames_of(v30_video)
    assert hub.downloads, "nothing was fetched"
    assert all(path.removeprefix(REPO + "/").startswith("meta/") for path in hub.downloads), hub.downloads
    # Without a revision, v2.1 as a job would read it.
    tagged = describe_dataset(REPO, cache_dir=tmp_path / "cache")
    assert (tagged.revision, tagged.format, tagged.sha) == ("v2.1", "v2.1", hub.repos[REPO].tags["v2.1"])
    assert all(path.removeprefix(REPO + "/").startswith("meta/") for path in hub.downloads), hub.downloads


def test_what_cannot_be_described_says_why(
    hub: FakeHub, synthetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"

    def reason_of(name: str, **options: object) -> tuple[str, str]:
        with pytest.raises(DatasetError) as caught:
            describe_dataset(name, cache_dir=cache, **options)  # type: ignore[arg-type]
        return caught.value.reason, str(caught.value)

    reason, message = reason_of("relay-tests/nothing")
    assert reason == "not_found" and "relay-tests/nothing: no such dataset repo" in message
    reason, message = reason_of(REPO, revision="v9.9")
    assert reason == "no_such_revision" and "has no revision 'v9.9'" in message
    assert reason_of(str(tmp_path / "absent"))[0] == "not_found"
    assert reason_of("not a repo")[0] == "bad_name"
    for malformed in ("a..b/c", "a--b", "x.git", "-a/b", "a/b/c", "a" * 97):
        assert reason_of(malformed)[0] == "bad_name", malformed
    old = Path(shutil.copytree(synthetic / "meta", tmp_path / "old" / "meta")).parent
    info = json.loads((old / "meta/info.json").read_text())
    info["codebase_version"] = "v2.0"
    (old / "meta/info.json").write_text(json.dumps(info))
    reason, message = reason_of(str(old))
    assert reason == "refused"
    assert message == (
        f"dataset {old}: meta/info.json: codebase_version is 'v2.0'; "
        "Relay reads LeRobot v2.1 and v3.0 datasets"
    )
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing answers there
    reason, message = reason_of("relay-tests/never-fetched")
    assert reason == "unavailable" and "cannot reach http://127.0.0.1" in message


def test_the_inspect_command(v30_video: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["datasets", "inspect", str(v30_video)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for expected in (
        "LeRobot v3.0",
        "│ observation.images.top   │ video  │ 32 x 32        │ h264, yuv420p, 10 fps │ base_0_rgb",
        "│ observation.images.wrist │ video  │ 24 x 32        │ h264, yuv420p, 10 fps │ left_wrist_0_rgb",
        "move to the blue dot",
    ):
        assert expected in result.output, result.output
    result = runner.invoke(app, ["datasets", "inspect", str(v30_video), "--json"])
    assert result.exit_code == 0, result.output
    assert DatasetDescription.model_validate_json(result.output) == describe_dataset(str(v30_video))
    result = runner.invoke(app, ["datasets", "inspect", str(tmp_path / "absent")])
    assert result.exit_code == 1
    assert f"error: dataset {tmp_path / 'absent'}: no such directory" in result.output.replace("\n", "")


def test_the_server_process_answers_a_line_per_request(v30_video: Path, tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "relay_engine.datasets.describe_server", "--serve", "--idle-seconds", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        for name in (str(v30_video), str(tmp_path / "absent")):
            server.stdin.write(
                json.dumps({"name": name, "cache_dir": str(tmp_path / "cache")}).encode() + b"\n"
            )
        server.stdin.flush()
        described = json.loads(server.stdout.readline())
        assert DatasetDescription.model_validate(described["dataset"]) == describe_dataset(str(v30_video))
        assert json.loads(server.stdout.readline()) == {
            "error": {"reason": "not_found", "message": f"dataset {tmp_path / 'absent'}: no such directory: "
                      f"{tmp_path / 'absent'}"}
        }  # fmt: skip
        # Idle for --idle-seconds: it exits by itself, with its stdin still open.
        started = time.monotonic()
        assert server.wait(timeout=30) == 0
        assert time.monotonic() - started < 30
    finally:
        server.kill()
        server.wait()
