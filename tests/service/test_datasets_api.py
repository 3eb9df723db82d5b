"""GET /v1/datasets/{name} on the real API (uvicorn, PostgreSQL): a dataset described by the engine's
describe_dataset in the API's helper processes, local (where the API sees the workers' disk) or on a
loopback Hub (tests/hub.py); every refusal in the error body, never a 500."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.testclient import TestClient

from relay_api.app import create_app
from relay_api.inspectors import InspectionFailed, Inspectors
from relay_engine.datasets import describe_dataset
from tests.hub import FakeHub, Repo
from tests.isolation import free_port
from tests.service.stack import PARKED_QUEUE, ApiServer, Stack

REPO = "relay-tests/video"


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.fixture(scope="module")
def video(video_dataset: Path) -> Path:
    return video_dataset


@pytest.fixture(scope="module")
def old(stack: Stack, dataset: Path) -> Path:
    """The meta files of a LeRobot v2.0 dataset, a format Relay refuses."""
    root = stack.root / "datasets" / "v20-meta"
    if not root.exists():
        shutil.copytree(dataset / "meta", root / "meta")
        info = json.loads((root / "meta/info.json").read_text())
        info["codebase_version"] = "v2.0"
        (root / "meta/info.json").write_text(json.dumps(info))
    return root


@pytest.fixture(scope="module")
def hub(video: Path, dataset: Path, old: Path) -> Iterator[FakeHub]:
    """A loopback Hub, in the environment the API's helper processes start with."""
    with FakeHub() as server, pytest.MonkeyPatch.context() as patch:
        repo = Repo()
        repo.add_commit(dataset, tag="v2.1")
        repo.add_commit(video, branch="main")
        server.repos[REPO] = repo
        server.repos["relay-tests/old"] = Repo.at(old)
        patch.setenv("HF_ENDPOINT", server.endpoint)
        patch.delenv("HF_TOKEN", raising=False)
        yield server


@pytest.fixture(scope="module")
def api(stack: Stack, hub: FakeHub) -> Iterator[str]:
    """The API where it sees the workers' disk (as `relay server`), its jobs parked."""
    settings = stack.settings.model_copy(
        update={
            "fine_tune_queue": PARKED_QUEUE,
            "api_shares_workers_disk": True,
            "dataset_cache_dir": stack.root / "cache",
        }
    )
    server = ApiServer(settings)
    yield server.url
    server.stop()


@pytest.fixture
def key(stack: Stack) -> dict[str, str]:
    return {"authorization": f"Bearer {stack.new_user()[1]}"}


def get(url: str, name: str, headers: dict[str, str], **params: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/datasets/{name}", params=params, headers=headers, timeout=150)


def test_a_local_v30_video_dataset_is_described(api: str, video: Path, key: dict[str, str]) -> None:
    answer = get(api, quote(str(video), safe=""), key)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    # The engine's one description, as `relay datasets inspect --json` prints it.
    assert body == describe_dataset(str(video)).model_dump(mode="json")
    assert body["object"] == "dataset" and body["format"] == "v3.0"
    assert (body["path"], body["repo"], body["sha"]) == (str(video), None, None)
    cameras = [(c["feature"], c["stored"], c["height"], c["width"], c["codec"], c["pix_fmt"], c["fps"])
               for c in body["cameras"]]  # fmt: skip
    assert cameras == [
        ("observation.images.top", "video", 32, 32, "h264", "yuv420p", 10.0),
        ("observation.images.wrist", "video", 24, 32, "h264", "yuv420p", 10.0),
    ]
    assert body["camera_map"] == {
        "base_0_rgb": "observation.images.top",
        "left_wrist_0_rgb": "observation.images.wrist",
    }
    info = json.loads((video / "meta/info.json").read_text())
    assert (body["episodes"], body["frames"], body["fps"]) == (5, info["total_frames"], 10.0)
    assert (body["state_dim"], body["action_dim"]) == (2, 2)
    assert [t["task"] for t in body["tasks"]] == ["move to the red dot", "move to the blue dot"]
    # The path unescaped reads the same.
    assert get(api, str(video), key).json() == body


def test_a_hub_dataset_is_described_from_its_meta_files(api: str, hub: FakeHub, key: dict[str, str]) -> None:
    hub.downloads.clear()
    main = get(api, REPO, key, revision="main")  # the repo id's slash unescaped
    assert main.status_code == 200, main.text
    body = main.json()
    assert (body["repo"], body["revision"], body["sha"], body["path"]) == (
        REPO, "main", hub.repos[REPO].branches["main"], None,
    )  # fmt: skip
    assert body["format"] == "v3.0" and body["cameras"][0]["codec"] == "h264"
    tagged = get(api, quote(REPO, safe=""), key).json()  # escaped too; v2.1, as a job reads it
    assert (tagged["revision"], tagged["format"]) == ("v2.1", "v2.1")
    assert [c["stored"] for c in tagged["cameras"]] == ["image", "image"]
    assert hub.downloads and all(path.startswith(f"{REPO}/meta/") for path in hub.downloads), hub.downloads


def test_what_cannot_be_described_is_a_4xx_naming_it(
    api: str, stack: Stack, hub: FakeHub, old: Path, key: dict[str, str]
) -> None:
    error = error_of(get(api, "relay-tests/nothing", key), 404)
    assert error["message"].startswith(f"dataset relay-tests/nothing: no such dataset repo on {hub.endpoint}")
    assert (error["type"], error["param"], error["code"]) == ("not_found_error", "name", "dataset_not_found")
    error = error_of(get(api, REPO, key, revision="v9.9"), 404)
    assert error["message"].startswith(f"dataset {REPO}: has no revision 'v9.9' (branch, tag or commit)")
    assert (error["param"], error["code"]) == ("revision", "revision_not_found")
    absent = stack.root / "datasets" / "absent"
    error = error_of(get(api, quote(str(absent), safe=""), key), 404)
    assert error["message"] == f"dataset {absent}: no such directory: {absent}"
    # `~someone` of no such user is not a crash (found by the schema fuzz): no such directory.
    error = error_of(get(api, quote("~no-such-user-here/x", safe=""), key), 404)
    assert error["message"].startswith("dataset ~no-such-user-here/x: no such directory: ")
    for malformed in ("a b", "a..b/c", "a--b", "x.git", "a/b/c", "x/", "a" * 97, "file://elsewhere/x"):
        error = error_of(get(api, quote(malformed, safe=""), key), 400)
        assert error["message"].startswith(
            f"bad name: {json.dumps(malformed)} (must be a Hub dataset repo id"
        )
        assert (error["param"], error["code"]) == ("name", "invalid_value")
    # A format Relay does not read: the refusal's own words, from the Hub and from a directory.
    error = error_of(get(api, "relay-tests/old", key, revision="main"), 400)
    sha = hub.repos["relay-tests/old"].branches["main"]
    assert error["message"] == (
        f"dataset relay-tests/old: revision 'main' (commit {sha[:8]}) on {hub.endpoint} holds LeRobot "
        "v2.0, a format Relay does not read (it reads LeRobot v2.1 and v3.0)"
    )
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "name",
        "dataset_refused",
    )
    error = error_of(get(api, quote(str(old), safe=""), key), 400)
    assert error["message"] == (
        f"dataset {old}: meta/info.json: codebase_version is 'v2.0'; "
        "Relay reads LeRobot v2.1 and v3.0 datasets"
    )
    assert error["code"] == "dataset_refused"
    error = error_of(get(api, quote(str(old), safe=""), key, revision="v2.1"), 400)
    assert (error["param"], error["message"]) == (
        "revision",
        'bad revision: "v2.1" (a local directory has no revisions; a revision names a branch, tag or '
        "commit of a Hub dataset repo)",
    )
    error = error_of(get(api, REPO, key, revison="main"), 400)
    assert error["code"] == "unknown_parameter"
    error = error_of(get(api, REPO, {}), 401)
    assert error["code"] == "missing_api_key"


def test_a_local_directory_only_where_the_api_sees_the_workers_disk(
    stack: Stack, video: Path, key: dict[str, str]
) -> None:
    # The shared stack's API does not share the workers' disk (RELAY_API_SHARES_WORKERS_DISK unset).
    error = error_of(get(stack.parked_api_url, quote(str(video), safe=""), key), 403)
    assert error["message"] == (
        f"dataset {video}: the API reads a local directory only where it sees the workers' disk "
        f"(RELAY_API_SHARES_WORKERS_DISK is false on this server); run `relay datasets inspect {video}` "
        "where the directory is"
    )
    assert (error["type"], error["param"]) == ("permission_error", "name")
    assert error["code"] == "workers_disk_not_shared"
    closed = stack.settings.model_copy(update={"local_datasets": False, "api_shares_workers_disk": True})
    with TestClient(create_app(closed)) as client:
        for name in (str(video), f"file://{video}", "./here", "~/there"):
            error = error_of(client.get(f"/v1/datasets/{quote(name, safe='')}", headers=key), 403)
            assert error["code"] == "local_datasets_off"
            assert error["message"].startswith(f"dataset {name}: this server does not read local directories")


def test_an_unreachable_hub_is_a_502_not_a_500(
    stack: Stack, key: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing answers there
    settings = stack.settings.model_copy(update={"dataset_cache_dir": stack.root / "empty-cache"})
    with TestClient(create_app(settings)) as client:
        error = error_of(client.get("/v1/datasets/relay-tests/never-fetched", headers=key), 502)
    assert (error["type"], error["code"]) == ("server_error", "dataset_unavailable")
    assert error["message"].startswith("dataset relay-tests/never-fetched: cannot reach http://127.0.0.1:")
    assert str(stack.root / "empty-cache") in error["message"]


def test_a_hung_or_dying_helper_is_a_504_or_502(stack: Stack, key: dict[str, str]) -> None:
    with TestClient(create_app(stack.settings)) as client:
        app: Any = client.app
        app.state.inspectors = Inspectors(
            timeout_seconds=1, command=[sys.executable, "-c", "import time; time.sleep(60)"]
        )
        error = error_of(client.get("/v1/datasets/relay-tests/slow", headers=key), 504)
        assert (error["code"], error["message"]) == (
            "inspection_timeout",
            "describing dataset relay-tests/slow took longer than 1 s",
        )
        app.state.inspectors = Inspectors(
            command=[sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"]
        )
        error = error_of(client.get("/v1/datasets/relay-tests/dies", headers=key), 502)
        assert (error["code"], error["message"]) == (
            "inspection_failed",
            "the engine process describing dataset relay-tests/dies ended (exit status 3; it said: boom)",
        )


# A stand-in for the engine's helper: answers with its pid and RELAY_PROBE; with RELAY_PROBE=once it
# ends after one answer, as a helper that went idle would.
ECHO = """
import json, os, sys
for line in sys.stdin:
    probe = os.environ.get("RELAY_PROBE")
    print(json.dumps({"error": {"reason": "not_found", "message": f"{os.getpid()} {probe}"}}), flush=True)
    if probe == "once":
        break
"""


def test_helpers_are_kept_and_replaced_when_the_environment_changes_or_they_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inspectors = Inspectors(command=[sys.executable, "-c", ECHO])

    def ask() -> list[str]:
        message: str = inspectors.describe("a", None, None)["error"]["message"]
        return message.split()

    try:
        monkeypatch.setenv("RELAY_PROBE", "kept")
        first = ask()
        assert first[1] == "kept" and ask() == first  # the same process, kept for the next request
        monkeypatch.setenv("RELAY_PROBE", "changed")
        second = ask()
        assert second[1] == "changed" and second[0] != first[0]
        monkeypatch.setenv("RELAY_PROBE", "once")
        third = ask()
        fourth = ask()  # its process ended after answering: the request goes to a new one
        assert third[1] == fourth[1] == "once" and third[0] != fourth[0]
    finally:
        inspectors.close()
    with pytest.raises(InspectionFailed, match=r"ended \(exit status 1\)"):
        Inspectors(command=[sys.executable, "-c", "import sys; sys.exit(1)"]).describe("a", None, None)
