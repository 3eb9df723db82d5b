"""What an adversarial probe found, each answered: bodies refused before they are read, odd input
that reached the database or Redis, empty Idempotency-Keys, ambiguous key prefixes."""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from select import select as wait_until_ready
from typing import Any
from urllib.parse import quote

import httpx
import psutil
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from relay_api.app import create_app
from relay_api.keys import AmbiguousKey, KeyCache, revoke_keys
from relay_api.models import ApiKey, FineTune
from relay_api.openapi import SECURITY_SCHEME
from tests.isolation import free_port
from tests.service.stack import PARKED_QUEUE, ApiServer, Stack, wait_for

GOOD = {"model": "pi05-tiny", "dataset_name": "lerobot/pusht_image", "steps": 20}


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_body_over_the_limit_is_413_naming_the_limit(parked: TestClient, alice: dict[str, str]) -> None:
    limit = parked.app.state.settings.max_json_body_bytes  # type: ignore[attr-defined]
    big = {**GOOD, "name": "x" * (limit + 1)}
    error = error_of(parked.post("/v1/fine-tunes", json=big, headers=alice), 413)
    assert str(limit) in error["message"] and error["code"] == "body_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"model": "pi05-tiny", "name": "'
        for _ in range(limit // 4096 + 2):
            yield b"x" * 4096
        yield b'"}'

    headers = {**alice, "content-type": "application/json"}
    error = error_of(parked.post("/v1/fine-tunes", content=chunks(), headers=headers), 413)
    assert str(limit) in error["message"] and error["code"] == "body_too_large"


def test_a_session_call_has_its_own_larger_limit(parked: TestClient, alice: dict[str, str]) -> None:
    limit = parked.app.state.settings.session_max_call_bytes  # type: ignore[attr-defined]
    headers = {**alice, "x-relay-seq": "1", "content-type": "application/octet-stream"}
    headers["content-length"] = str(limit + 1)  # refused on the header alone: nothing is sent
    response = parked.post("/v1/sessions/ses-none/calls", content=b"", headers=headers)
    error = error_of(response, 413)
    assert error["code"] == "call_too_large" and str(limit) in error["message"]


def test_the_key_is_checked_before_the_body_is_read(parked: TestClient) -> None:
    error = error_of(parked.post("/v1/fine-tunes", content=b"{not json", headers={}), 401)
    assert error["code"] == "missing_api_key"  # not "invalid JSON": the body was never parsed
    error = error_of(
        parked.post("/v1/fine-tunes", content=b"{", headers={"authorization": "Bearer nope"}), 401
    )
    assert error["code"] == "invalid_api_key"


def test_a_huge_body_without_a_key_costs_the_api_no_memory(stack: Stack) -> None:
    """Measured on a real uvicorn process: 200 MB sent without a key."""
    port = free_port()
    env = {**os.environ, **stack.env_settings, "RELAY_FINE_TUNE_QUEUE": PARKED_QUEUE}
    command = [sys.executable, "-m", "uvicorn", "--factory", "relay_api.app:create_app", "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url), 60, "the API to start", every=0.2)
        process = psutil.Process(server.pid)
        before = process.memory_info().rss
        size = 200 << 20

        def body() -> Iterator[bytes]:
            block = b"[" + b"1," * (1 << 19)
            sent = 0
            while sent < size:
                yield block
                sent += len(block)

        started = time.monotonic()
        headers = {"content-type": "application/json", "content-length": str(size)}
        try:
            response = httpx.post(f"{url}/v1/fine-tunes", content=body(), headers=headers, timeout=60)
            status = response.status_code
        except httpx.TransportError:  # the server answered and closed before the client finished sending
            status = 401
        elapsed = time.monotonic() - started
        after = process.memory_info().rss
        print(
            f"\n200 MB without a key: {status} in {elapsed:.2f} s; API RSS {before >> 20} -> {after >> 20} MB"
        )
        assert status == 401
        assert after - before < 20 << 20, (before, after)
        assert elapsed < 30  # generous; the old API took 13 s to read and parse 300 MB first
    finally:
        server.terminate()
        server.wait(timeout=20)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize("key", ["", " ", "  "])
def test_an_empty_or_blank_idempotency_key_is_400(
    parked: TestClient, alice: dict[str, str], key: str
) -> None:
    for path, body in (("/v1/fine-tunes", GOOD), ("/v1/sessions", {"base_model": "pi05-tiny"})):
        error = error_of(parked.post(path, json=body, headers={**alice, "idempotency-key": key}), 400)
        assert "idempotency" in (error["param"] or "").lower()


ODD_IDS = ["a\x00b", "x" * 65, "ft-\x01", "../etc"]


def test_odd_ids_and_numbers_are_400_or_404_never_500(parked: TestClient, alice: dict[str, str]) -> None:
    job = parked.post("/v1/fine-tunes", json=GOOD, headers=alice).json()
    paths = []
    for odd in map(functools.partial(quote, safe=""), ODD_IDS):
        paths += [f"/v1/fine-tunes/{odd}", f"/v1/fine-tunes/{odd}/events", f"/v1/fine-tunes/{odd}/files"]
        paths += [f"/v1/sessions/{odd}", f"/v1/fine-tunes?after={odd}", f"/v1/sessions?after={odd}"]
    big = 2**63
    paths += [
        f"/v1/fine-tunes/{job['id']}/events?after={big}",
        f"/v1/fine-tunes/{job['id']}/events?after={2**64}",
        f"/v1/fine-tunes/{job['id']}/events?after=",
        f"/v1/fine-tunes/{job['id']}/files/checkpoints/a%00b",
        f"/v1/sessions/ses-x/calls/{2**64}",
    ]
    for path in paths:
        response = parked.get(path, headers=alice)
        assert response.status_code in (400, 404), (path, response.status_code, response.text)
        error_of(response, response.status_code)
    parked.post(f"/v1/fine-tunes/{job['id']}/cancel", headers=alice)  # so that its stream ends
    streamed = parked.get(
        f"/v1/fine-tunes/{job['id']}/events",
        headers={**alice, "last-event-id": str(big)},
        params={"stream": 1},
    )
    assert streamed.status_code == 200  # a Last-Event-ID we never sent is ignored, not an error
    assert "[DONE]" in streamed.text
    response = parked.post(
        "/v1/sessions/ses-x/calls", content=b"", headers={**alice, "x-relay-seq": str(2**64)}
    )
    assert response.status_code in (400, 404), response.text


def test_control_characters_in_camera_names_are_refused(parked: TestClient, alice: dict[str, str]) -> None:
    cameras = {"base_0_rgb": "observation.images.\x00top"}
    error = error_of(parked.post("/v1/fine-tunes", json={**GOOD, "cameras": cameras}, headers=alice), 400)
    assert error["param"] == "cameras"
    assert parked.get("/v1/fine-tunes", headers=alice).status_code == 200  # and every query still works


def test_a_key_prefix_shared_by_two_keys_revokes_neither(stack: Stack) -> None:
    first, second = stack.new_user()[1], stack.new_user()[1]
    with stack.sessions() as db:
        rows = db.query(ApiKey).filter(ApiKey.revoked_at.is_(None)).all()
        mine = [row for row in rows if row.prefix in (first[:12], second[:12])]
        for row in mine:
            row.prefix = "relay-shared"
        db.commit()
        with pytest.raises(AmbiguousKey, match="matches 2 active keys"):
            revoke_keys(db, "relay-shared")
        assert revoke_keys(db, first) == 1  # the whole key is never ambiguous
        assert revoke_keys(db, "relay-shared") == 1  # and now the prefix names one key


def test_a_checkpoint_download_never_races_its_pruning(stack: Stack, alice: dict[str, str]) -> None:
    """Checkpoints saved and pruned as fast as the disk allows while they are downloaded: every
    download is whole (its bytes match its sha256) or a 404, never a 500 or a short body."""
    from relay_engine.core.checkpoint import CheckpointStore

    url = stack.parked_api_url
    job = httpx.post(f"{url}/v1/fine-tunes", json=GOOD, headers=alice).json()
    store = CheckpointStore(stack.settings.job_dir(job["id"]) / "checkpoints", keep_last=2)
    payload = os.urandom(1 << 20)

    def write(directory: Path) -> None:
        (directory / "weights.bin").write_bytes(payload)

    stop = threading.Event()
    saved = [0]

    def keep_saving() -> None:
        while not stop.is_set():
            saved[0] += 1
            store.save(saved[0], write, {})

    store.save(0, write, {})
    saver = threading.Thread(target=keep_saving, daemon=True)
    saver.start()
    outcomes: dict[int, int] = {}
    try:
        with httpx.Client(base_url=url, headers=alice, timeout=30) as http:
            for _ in range(150):
                listing = http.get(f"/v1/fine-tunes/{job['id']}/files")
                assert listing.status_code == 200, listing.text
                files = listing.json()["data"]
                listed = [f["path"] for f in files if f["path"].endswith("weights.bin")]
                if not listed:  # between a prune and the next save
                    continue
                path = listed[0]
                response = http.get(f"/v1/fine-tunes/{job['id']}/files/{path}")
                outcomes[response.status_code] = outcomes.get(response.status_code, 0) + 1
                if response.status_code == 200:
                    assert response.content == payload
                    assert response.headers["x-checksum-sha256"] == hashlib.sha256(payload).hexdigest()
                else:
                    error_of(response, 404)
    finally:
        stop.set()
        saver.join(timeout=10)
    assert outcomes.get(200, 0) > 0 and saved[0] > 10, (outcomes, saved)
    # Every pin is let go after its download (by a task that runs once the body has been sent).
    pins = store.root.parent / ".pins"
    wait_for(lambda: not list(pins.iterdir()), 10, "every download's pin to be let go")


def test_the_sdk_reads_every_field_of_the_job_the_api_documents(
    parked: TestClient, alice: dict[str, str]
) -> None:
    from relay.sft.job import FineTuneJob
    from relay_api.schemas import FineTuneOut

    documented = set(FineTuneOut.model_fields) - {"object"}
    assert documented <= set(typing.get_type_hints(FineTuneJob)), documented - set(
        typing.get_type_hints(FineTuneJob)
    )
    answer = parked.post("/v1/fine-tunes", json=GOOD, headers=alice).json()
    assert set(answer) == documented | {"object"}  # the route answers with exactly the documented shape
    job = FineTuneJob(answer, client=object())  # type: ignore[arg-type]
    assert all(getattr(job, name) == answer[name] for name in documented)
    assert job.lease_lapsed_seconds is None  # queued: no lease to lapse


def test_a_running_job_without_a_live_worker_shows_how_long_ago_its_lease_lapsed(
    stack: Stack, parked: TestClient, alice: dict[str, str]
) -> None:
    import datetime as dt

    from relay_api import fine_tunes

    job = parked.post("/v1/fine-tunes", json=GOOD, headers=alice).json()
    with stack.sessions() as db:
        row = dict(
            db.execute(select(FineTune).where(FineTune.id == job["id"])).mappings().one()["FineTune"].__dict__
        )
    # As the row reads once its worker died 90 s ago and no reconciler is left to resume it (set in
    # memory: a live reconciler in the shared stack would resume a row changed in the database).
    row.update(status="running", lease_until=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=90))
    shown = fine_tunes.job_object(row)
    assert shown["status"] == "running" and 89 <= shown["lease_lapsed_seconds"] < 120
    row.update(lease_until=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30))
    assert fine_tunes.job_object(row)["lease_lapsed_seconds"] is None  # a live lease


@pytest.mark.slow
def test_a_job_handed_on_that_no_worker_takes_still_shows_how_long_ago_its_lease_lapsed(
    stack: Stack, parked: TestClient, alice: dict[str, str]
) -> None:
    """A reconciler hands a lapsed job on (clearing its lease) and publishes it. A worker that serves
    deployments only runs that reconciler too, but takes no job: the job then shows `running` with
    nobody to run it, and `lease_lapsed_seconds` must say so (it was null)."""
    import datetime as dt

    from sqlalchemy import update

    from relay_api.db import utcnow

    stack.stop_worker()  # the only worker below reads no jobs' queue
    serving = stack.start_standby_worker(queues=(stack.settings.serving_queue,))
    job = parked.post("/v1/fine-tunes", json=GOOD, headers=alice).json()
    try:
        serving.wait_ready()
        with stack.sessions() as db:  # its worker died 90 s ago
            db.execute(
                update(FineTune)
                .where(FineTune.id == job["id"])
                .values(status="running", attempt=1, lease_until=utcnow() - dt.timedelta(seconds=90))
            )
            db.commit()

        def handed_on() -> dict[str, Any] | None:
            with stack.sessions() as db:
                lease = db.scalar(select(FineTune.lease_until).where(FineTune.id == job["id"]))
            return parked.get(f"/v1/fine-tunes/{job['id']}", headers=alice).json() if lease is None else None

        shown = wait_for(handed_on, 60, "the serving worker's reconciler to hand the job on", every=0.2)
        assert shown["status"] == "running" and shown["attempts"] == 1
        assert shown["lease_lapsed_seconds"] is not None, "a job no worker runs shows no lapsed lease"
        assert 89 <= shown["lease_lapsed_seconds"] < 600
    finally:
        with stack.sessions() as db:  # its message waits on the jobs' queue: no later worker may run it
            db.execute(update(FineTune).where(FineTune.id == job["id"]).values(status="cancelled"))
            db.commit()
        serving.stop()


def test_a_405_lists_every_method_the_path_takes(parked: TestClient, alice: dict[str, str]) -> None:
    for method, path, allowed in [
        ("DELETE", "/v1/fine-tunes", "GET, POST"),
        ("GET", "/v1/fine-tunes/ft-1/cancel", "POST"),
        ("POST", "/v1/fine-tunes/ft-1/files/checkpoints/a/b", "GET, HEAD"),
        ("DELETE", "/v1/datasets/lerobot/pusht", "GET"),
    ]:
        response = parked.request(method, path, headers=alice)
        assert response.status_code == 405 and response.headers.get_list("allow") == [allowed], (
            response.headers
        )
        assert allowed in error_of(response, 405)["message"]


def test_the_document_refuses_what_the_api_refuses(parked: TestClient) -> None:
    """Bodies the API refuses were valid by the old document (see also tests/service/test_schema_fuzz.py)."""
    document = parked.get("/openapi.json").json()
    recipe = document["components"]["schemas"]["SFTConfig"]["properties"]
    assert recipe["model"]["enum"] and recipe["dataset_name"]["minLength"] == 1
    assert recipe["targets"]["anyOf"][0]["minItems"] == 1 and recipe["cameras"]["minProperties"] == 1
    session_body = document["paths"]["/v1/sessions"]["post"]["requestBody"]
    assert (
        session_body["required"]
        and "base_model" in session_body["content"]["application/json"]["schema"]["required"]
    )
    after = next(p for p in document["paths"]["/v1/fine-tunes"]["get"]["parameters"] if p["name"] == "after")
    assert after["schema"]["anyOf"][0]["pattern"]  # so after="" is invalid by the document too


def test_a_second_retry_at_the_same_step_is_its_own_event(
    stack: Stack, parked: TestClient, alice: dict[str, str]
) -> None:
    from relay_api.db import utcnow
    from relay_api.event_rows import insert_event_row as _insert_event

    job = parked.post("/v1/fine-tunes", json=GOOD, headers=alice).json()
    with stack.sessions() as db:  # as the reconciler writes them: two lapsed attempts, one step
        for attempt in (1, 2):
            _insert_event(
                db, job["id"], 0, "retry", attempt, {"attempt": attempt + 1, "reason": "x"}, utcnow()
            )
        _insert_event(db, job["id"], 0, "retry", 2, {"attempt": 3, "reason": "x"}, utcnow())  # a repeat
        db.commit()
    events = parked.get(f"/v1/fine-tunes/{job['id']}/events", headers=alice).json()["data"]
    retries = [(e["event"], e["attempt"]) for e in events if e.get("event") == "retry"]
    assert retries == [("retry", 2), ("retry", 3)]  # both reported, the repeat once
    parked.post(f"/v1/fine-tunes/{job['id']}/cancel", headers=alice)


def test_more_gpus_than_samples_is_400_naming_gpus(parked: TestClient, alice: dict[str, str]) -> None:
    body = {**GOOD, "batch_size": 4, "gpus": 8}
    error = error_of(parked.post("/v1/fine-tunes", json=body, headers=alice), 400)
    assert error["param"] == "gpus" and error["code"] == "invalid_value"
    rule = "must be at most batch_size, 4: each GPU needs at least one sample"
    assert error["message"] == f"bad gpus: 8 ({rule})"


def test_a_query_parameter_the_route_does_not_take_is_400_naming_it(
    parked: TestClient, alice: dict[str, str]
) -> None:
    """A misspelt parameter is refused, not silently ignored for a default."""
    error = error_of(parked.get("/v1/fine-tunes", params={"limt": 5}, headers=alice), 400)
    assert error["param"] == "limt" and error["code"] == "unknown_parameter"
    assert error["message"] == "unknown query parameter 'limt' (this route takes: after, limit)"
    # An empty name too (schemathesis sent `?=`), and on a route with no parameters at all.
    assert error_of(parked.get("/v1/fine-tunes?=", headers=alice), 400)["param"] == ""
    assert parked.get("/v1/fine-tunes", params={"limit": 2}, headers=alice).status_code == 200


def test_head_on_a_file_gives_its_size_and_sha256_without_the_body(
    stack: Stack, alice: dict[str, str]
) -> None:
    from relay_engine.core.checkpoint import CheckpointStore

    url = stack.parked_api_url
    job = httpx.post(f"{url}/v1/fine-tunes", json=GOOD, headers=alice).json()
    store = CheckpointStore(stack.settings.job_dir(job["id"]) / "checkpoints", keep_last=2)
    payload = os.urandom(300_000)
    store.save(0, lambda directory: (directory / "weights.bin").write_bytes(payload), {})
    listed = httpx.get(f"{url}/v1/fine-tunes/{job['id']}/files", headers=alice).json()["data"]
    path = next(f["path"] for f in listed if f["path"].endswith("weights.bin"))
    digest = hashlib.sha256(payload)
    head = httpx.head(f"{url}/v1/fine-tunes/{job['id']}/files/{path}", headers=alice)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(payload))
    assert head.headers["x-checksum-sha256"] == digest.hexdigest()
    assert head.headers["repr-digest"] == f"sha-256=:{base64.b64encode(digest.digest()).decode()}:"
    get = httpx.get(f"{url}/v1/fine-tunes/{job['id']}/files/{path}", headers=alice)
    assert get.content == payload and get.headers["x-checksum-sha256"] == head.headers["x-checksum-sha256"]
    missing = httpx.head(f"{url}/v1/fine-tunes/{job['id']}/files/checkpoints/none/x.bin", headers=alice)
    assert (
        missing.status_code == 404
        and httpx.head(f"{url}/v1/fine-tunes/{job['id']}/files/{path}").status_code == 401
    )


def test_a_local_dataset_that_is_not_there_is_refused_where_the_api_sees_the_workers_disk(
    stack: Stack, alice: dict[str, str]
) -> None:
    missing = stack.root / "datasets" / "never-written"
    recipe = {**GOOD, "dataset_name": str(missing)}
    settings = stack.settings.model_copy(
        update={"api_shares_workers_disk": True, "fine_tune_queue": PARKED_QUEUE}
    )
    with TestClient(create_app(settings)) as api:
        for name in (str(missing), missing.as_uri()):  # one rule of what is local: relay.dataset_names
            error = error_of(
                api.post("/v1/fine-tunes", json={**recipe, "dataset_name": name}, headers=alice), 400
            )
            assert error["param"] == "dataset_name" and error["code"] == "invalid_value"
            assert f"{missing} does not exist on the workers' disk" in error["message"]
        there = api.post(
            "/v1/fine-tunes", json={**recipe, "dataset_name": str(stack.dataset())}, headers=alice
        )
        assert there.status_code == 200, there.text
        hub = api.post("/v1/fine-tunes", json=GOOD, headers=alice)  # a Hub name: not the API's to look for
        assert hub.status_code == 200, hub.text
    # Where the API does not see the workers' disk (the setting's default), it leaves that to the worker.
    parked = httpx.post(f"{stack.parked_api_url}/v1/fine-tunes", json=recipe, headers=alice)
    assert parked.status_code == 200, parked.text


def bytes_taken_after_the_answer(url: str, path: str, key: str, size: int) -> tuple[str, int]:
    """POST `size` bytes (declared) to `path` over a raw socket, sending while reading: the answer's
    status line, and how many bytes the server still took after it had answered (it stops taking
    them once it closes the connection). Gives up at 64 MB after the answer: the server reads on."""
    address = url.removeprefix("http://").split(":")
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {address[0]}\r\nauthorization: Bearer {key}\r\n"
        f"x-relay-seq: 1\r\ncontent-type: application/x-relay-frames\r\ncontent-length: {size}\r\n\r\n"
    )
    block = b"\0" * (1 << 16)
    answer, sent, after = b"", 0, 0
    with socket.create_connection((address[0], int(address[1])), timeout=30) as connection:
        connection.sendall(head.encode())
        while sent < size and after < 64 << 20:
            readable, writable, _ = wait_until_ready([connection], [connection], [], 30)
            if readable:
                try:
                    received = connection.recv(1 << 16)
                except ConnectionResetError:
                    break
                if not received:
                    break
                answer += received
            if writable:
                try:
                    count = connection.send(block[: size - sent])
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += count
                after += count if answer else 0
    return answer.split(b"\r\n", 1)[0].decode(), after


def test_a_call_to_a_session_that_is_not_taking_calls_is_answered_without_reading_its_body(
    stack: Stack, alice: dict[str, str]
) -> None:
    url, key = stack.parked_api_url, alice["authorization"].removeprefix("Bearer ")
    size = 300 << 20  # under RELAY_SESSION_MAX_CALL_BYTES: only the session's state refuses it
    status, after = bytes_taken_after_the_answer(url, "/v1/sessions/ses-000000000000/calls", key, size)
    assert status == "HTTP/1.1 404 Not Found" and after < 32 << 20, (status, after)
    session = httpx.post(f"{url}/v1/sessions", json={"base_model": "pi05-tiny"}, headers=alice).json()
    status, after = bytes_taken_after_the_answer(url, f"/v1/sessions/{session['id']}/calls", key, size)
    assert status == "HTTP/1.1 409 Conflict" and after < 32 << 20, (status, after)  # still starting
    httpx.post(f"{url}/v1/sessions/{session['id']}/close", headers=alice).raise_for_status()
    status, after = bytes_taken_after_the_answer(url, f"/v1/sessions/{session['id']}/calls", key, size)
    assert status == "HTTP/1.1 410 Gone" and after < 32 << 20, (status, after)
    # Over the limit by its Content-Length: refused before a byte of it is read.
    limit = stack.settings.session_max_call_bytes
    status, after = bytes_taken_after_the_answer(url, f"/v1/sessions/{session['id']}/calls", key, limit + 1)
    assert status == "HTTP/1.1 413 Request Entity Too Large" and after < 32 << 20, (status, after)


def test_a_revoked_key_is_refused_by_every_api_process_within_a_second(stack: Stack) -> None:
    """Two API processes' worth of apps on one database, each trusting keys it checked for 30 s;
    the key is revoked by `relay keys revoke`, in a third process."""
    settings = stack.settings.model_copy(update={"auth_cache_seconds": 30.0})
    servers = [ApiServer(settings), ApiServer(settings)]
    try:
        _, key = stack.new_user()
        headers = {"authorization": f"Bearer {key}"}
        for server in servers:  # each checks the key once, and remembers it
            for _ in range(2):
                assert httpx.get(f"{server.url}/v1/fine-tunes", headers=headers).status_code == 200
        revoke = [sys.executable, "-m", "relay.cli", "keys", "revoke", key]
        subprocess.run(revoke, env={**os.environ, **stack.env_settings}, check=True, capture_output=True)
        revoked = time.monotonic()
        # The promise: a request that starts a second after the revocation is refused everywhere.
        time.sleep(max(0.0, revoked + 1.0 - time.monotonic()))
        for server in servers:
            error = error_of(httpx.get(f"{server.url}/v1/fine-tunes", headers=headers), 401)
            assert error["code"] == "invalid_api_key"
    finally:
        for server in servers:
            server.stop()


def test_a_remembered_key_is_trusted_until_the_revocation_count_moves(stack: Stack) -> None:
    """The cache still spares the database (a hit needs no lookup) until any lookup reads a new
    revocation count; then a key remembered before it is looked up again."""
    cache = KeyCache(30.0, check_seconds=3600.0)  # no lapse of the check here: only the count decides
    (_, key), (_, other) = stack.new_user(), stack.new_user()
    with stack.sessions() as db:
        user_id = cache.look_up(db, key)
        assert user_id is not None and cache.known(key) == user_id
        assert revoke_keys(db, key) == 1
        assert cache.known(key) == user_id  # nothing read since: still remembered
        assert cache.look_up(db, other) is not None  # reads the count, one more than before
        assert cache.known(key) is None and cache.look_up(db, key) is None


def test_the_document_has_a_bearer_scheme_on_every_v1_operation_and_no_422(
    parked: TestClient, alice: dict[str, str]
) -> None:
    """So /docs has an Authorize button, and lists only the errors the API sends (a broken rule is
    a 400 in the error body, never FastAPI's 422)."""
    document = parked.get("/openapi.json").json()
    assert document["components"]["securitySchemes"] == {"bearer": SECURITY_SCHEME}
    assert SECURITY_SCHEME["type"] == "http" and SECURITY_SCHEME["scheme"] == "bearer"
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (method, path)
            names = [p["name"].lower() for p in operation.get("parameters", [])]
            assert "authorization" not in names, (method, path)  # the scheme says it, not a parameter
            assert operation.get("security") == ([{"bearer": []}] if path.startswith("/v1/") else None)
    calls = document["paths"]["/v1/sessions/{session_id}/calls"]["post"]["responses"]
    assert {"404", "409", "410", "413", "429"} <= set(calls)
    # The API takes the key as the scheme says (the scheme's name in any case), and no other way.
    key = alice["authorization"].removeprefix("Bearer ")
    assert parked.get("/v1/fine-tunes", headers={"authorization": f"bearer {key}"}).status_code == 200
    for other in (f"Token {key}", key, f"Basic {key}"):
        assert error_of(parked.get("/v1/fine-tunes", headers={"authorization": other}), 401)
    assert error_of(parked.get("/v1/fine-tunes", headers={"x-api-key": key}), 401)


def _integer_schemas(
    node: Any, document: dict[str, Any], where: str, seen: frozenset[str] = frozenset()
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every integer schema under `node`, its $refs followed: (where it is, the schema)."""
    if isinstance(node, dict):
        reference = node.get("$ref")
        if isinstance(reference, str) and reference not in seen:
            target: Any = document
            for part in reference.removeprefix("#/").split("/"):
                target = target[part]
            yield from _integer_schemas(
                target, document, f"{where}->{reference.rsplit('/', 1)[-1]}", seen | {reference}
            )
        if node.get("type") == "integer":
            yield where, node
        for key, value in node.items():
            yield from _integer_schemas(value, document, f"{where}/{key}", seen)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _integer_schemas(value, document, f"{where}[{index}]", seen)


def test_every_integer_a_request_carries_is_bounded_in_the_document(parked: TestClient) -> None:
    """An unbounded integer reaches the database, orjson and torch with whatever size it has (an
    eval.seed of 2**64 once made a user's own job list answer 500)."""
    document = parked.get("/openapi.json").json()
    found, unbounded = 0, []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for part in ("parameters", "requestBody"):
                for where, schema in _integer_schemas(
                    operation.get(part), document, f"{method} {path} {part}"
                ):
                    found += 1
                    if "maximum" not in schema or "minimum" not in schema:
                        unbounded.append(where)
    assert found > 10 and not unbounded, unbounded


def test_an_eval_seed_past_its_bound_is_refused_and_nothing_is_created(
    parked: TestClient, alice: dict[str, str]
) -> None:
    for seed in (2**31, 2**63, 2**64, 10**30):
        body = {**GOOD, "eval": {"env": "relay/Dot-v0", "seed": seed}}
        error = error_of(parked.post("/v1/fine-tunes", json=body, headers=alice), 400)
        assert error["param"] == "eval.seed" and "2,147,483,647" in error["message"], error
    assert parked.get("/v1/fine-tunes", headers=alice).json()["data"] == []  # nothing half-created
    body = {**GOOD, "eval": {"env": "relay/Dot-v0", "seed": 2**31 - 1}}
    assert parked.post("/v1/fine-tunes", json=body, headers=alice).status_code == 200


def test_a_stored_job_todays_rules_refuse_never_breaks_its_owners_list(
    stack: Stack, parked: TestClient, alice: dict[str, str]
) -> None:
    """A job an older server accepted (an eval.seed of 2**64) is listed and shown, its refused
    field as null, rather than making the list answer 500 for good."""
    job = parked.post("/v1/fine-tunes", json={**GOOD, "eval": {"env": "relay/Dot-v0"}}, headers=alice).json()
    with stack.sessions() as db:
        row = db.get(FineTune, job["id"])
        assert row is not None
        row.config = {**row.config, "eval": {**row.config["eval"], "seed": 2**64}}
        db.commit()
    listed = parked.get("/v1/fine-tunes", headers=alice)
    assert listed.status_code == 200, listed.text
    assert [j["eval"] for j in listed.json()["data"]] == [None]
    shown = parked.get(f"/v1/fine-tunes/{job['id']}", headers=alice)
    assert shown.status_code == 200 and shown.json()["eval"] is None and shown.json()["model"] == "pi05-tiny"
    assert parked.post(f"/v1/fine-tunes/{job['id']}/cancel", headers=alice).status_code == 200


def test_an_answer_that_cannot_be_rendered_is_never_committed(stack: Stack, parked: TestClient) -> None:
    """Defence behind the rules: a row whose answer cannot be written is not inserted at all."""
    from relay.env_evaluation import JobEval
    from relay.sft.config import SFTConfig
    from relay_api import fine_tunes
    from relay_api.keys import get_or_create_user

    name, key = stack.new_user()
    valid = SFTConfig(**GOOD)
    unbounded = JobEval.model_construct(
        env="relay/Dot-v0", episodes=1, seed=2**64, max_steps=None, at_checkpoints=False, videos=0
    )
    config = valid.model_copy(update={"eval": unbounded})
    with stack.sessions() as db:
        user_id = get_or_create_user(db, name).id
        with pytest.raises((TypeError, ValueError)):  # orjson's, or the answer's own validation
            fine_tunes.create(db, user_id, config, "render-first")
    answer = parked.get("/v1/fine-tunes", headers={"authorization": f"Bearer {key}"})
    assert answer.status_code == 200 and answer.json()["data"] == []


def test_the_document_lists_the_410s_of_ended_sessions_and_deployments(
    stack: Stack, alice: dict[str, str]
) -> None:
    """Every operation on a closed session and on a stopped deployment answers a status its entry in
    /openapi.json lists."""
    settings = stack.settings.model_copy(
        update={
            "fine_tune_queue": PARKED_QUEUE,
            "session_queue": PARKED_QUEUE + "-sessions",
            "serving_queue": PARKED_QUEUE + "-serving",
        }
    )
    with TestClient(create_app(settings)) as api:
        document = api.get("/openapi.json").json()
        session = api.post("/v1/sessions", json={"base_model": "pi05-tiny"}, headers=alice).json()
        api.post(f"/v1/sessions/{session['id']}/close", headers=alice).raise_for_status()
        deployment = api.post("/v1/deployments", json={"model": "pi05-tiny"}, headers=alice).json()
        api.delete(f"/v1/deployments/{deployment['id']}", headers=alice).raise_for_status()
        frame = {**alice, "x-relay-seq": "1", "content-type": "application/x-relay-frames"}
        calls = {
            ("post", "/v1/sessions/{session_id}/calls"): dict(content=b"", headers=frame),
            ("get", "/v1/sessions/{session_id}/calls/{seq}"): dict(params={"wait": 0}),
            ("post", "/v1/sessions/{session_id}/heartbeat"): {},
            ("post", "/v1/sessions/{session_id}/close"): {},
            ("get", "/v1/sessions/{session_id}"): {},
            ("post", "/v1/deployments/{deployment_id}/actions"): dict(json={"observation": {}}),
            ("post", "/v1/deployments/{deployment_id}/predictions"): dict(json={"rows": []}),
            ("get", "/v1/deployments/{deployment_id}"): {},
            ("delete", "/v1/deployments/{deployment_id}"): {},
            ("get", "/v1/deployments/{deployment_id}/events"): {},
            ("get", "/v1/deployments/{deployment_id}/ws"): {},  # its websocket's address, over HTTP
        }
        seen = set()
        for (method, template), options in calls.items():
            path = template.format(session_id=session["id"], seq=1, deployment_id=deployment["id"])
            headers = options.pop("headers", alice)
            response = api.request(method.upper(), path, headers=headers, **options)
            documented = document["paths"][template][method]["responses"]
            assert str(response.status_code) in documented, (
                method,
                path,
                response.status_code,
                sorted(documented),
            )
            seen.add(response.status_code)
        assert 410 in seen
        # The websocket's handshake answers as its document entry says: 410, naming why.
        handshake = api.websocket_connect(f"/v1/deployments/{deployment['id']}/ws", headers=alice)
        with pytest.raises(WebSocketDenialResponse) as denied, handshake:
            pass
        assert denied.value.status_code == 410
        assert denied.value.json()["error"]["code"] == "deployment_stopped"
        assert "410" in document["paths"]["/v1/deployments/{deployment_id}/ws"]["get"]["responses"]


def test_an_odd_deployment_id_at_the_websocket_handshake_is_a_404_never_a_500(
    parked: TestClient, alice: dict[str, str]
) -> None:
    for odd in ODD_IDS:
        handshake = parked.websocket_connect(f"/v1/deployments/{quote(odd, safe='')}/ws", headers=alice)
        if "/" in odd:  # no route's path: the handshake is closed, as for any unknown path
            with pytest.raises(WebSocketDisconnect), handshake:
                pass
            continue
        with pytest.raises(WebSocketDenialResponse) as denied, handshake:
            pass
        assert denied.value.status_code == 404, (odd, denied.value.text)
        assert denied.value.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("local_datasets", [False, True])
def test_names_that_are_neither_a_hub_repo_nor_a_local_directory_are_refused(
    stack: Stack, alice: dict[str, str], local_datasets: bool
) -> None:
    """Not taken for Hub names (nor read from a worker's disk): one rule, relay.dataset_names'."""
    from relay.sft.config import RULES

    settings = stack.settings.model_copy(
        update={"local_datasets": local_datasets, "fine_tune_queue": PARKED_QUEUE}
    )
    with TestClient(create_app(settings)) as api:
        for name in ("lerobot/../../etc", "lerobot/..", "a/./b", "..\\..\\etc", ".\\", " /etc"):
            response = api.post("/v1/fine-tunes", json={**GOOD, "dataset_name": name}, headers=alice)
            error = error_of(response, 400)
            assert error["param"] == "dataset_name" and RULES["dataset_name"] in error["message"], error
        assert api.get("/v1/fine-tunes", headers=alice).json()["data"] == []
