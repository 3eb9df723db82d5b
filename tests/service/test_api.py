"""The API on real PostgreSQL and Redis: validation, auth and isolation, idempotency, pagination,
cancel of a queued job, request ids. Jobs here go to a queue no worker reads ("parked"), so they
stay queued for as long as a test needs."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import gc
import json
import re
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from relay_api.app import create_app
from relay_api.fine_tunes import iso
from relay_api.models import FineTune, FineTuneEvent
from tests.sdk.test_config import BAD_CONFIGS
from tests.service.stack import PARKED_QUEUE, Stack

GOOD = {"model": "pi05-tiny", "dataset_name": "lerobot/pusht_image", "steps": 20}


def _json_can_carry(fields: dict[str, Any]) -> bool:
    try:
        json.dumps(fields, allow_nan=False)
    except ValueError:  # NaN and infinity: the SDK's own check refuses those (tests/sdk/test_config.py)
        return False
    return True


API_BAD_CONFIGS = [case for case in BAD_CONFIGS if _json_can_carry(case[0])]


@pytest.fixture
def bob(stack: Stack) -> dict[str, str]:
    return {"authorization": f"Bearer {stack.new_user()[1]}"}


def count_jobs(stack: Stack) -> int:
    with stack.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(FineTune)) or 0)


def create(api: TestClient, headers: dict[str, str], **fields: Any) -> dict[str, Any]:
    response = api.post("/v1/fine-tunes", json={**GOOD, **fields}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def test_create_answers_at_once_with_the_queued_job(parked: TestClient, alice: dict[str, str]) -> None:
    job = create(parked, alice, name="first", batch_size=4)
    assert re.fullmatch(r"ft-[0-9a-f]{12}", job["id"])
    assert job["status"] == "queued" and job["step"] == 0 and job["loss"] is None and job["error"] is None
    assert job["output_dir"] is None
    assert (job["model"], job["batch_size"], job["steps"], job["name"]) == ("pi05-tiny", 4, 20, "first")
    # pi05-tiny's own defaults (catalog.MODEL_DEFAULTS), stored and echoed as the values it trains with.
    assert (job["learning_rate"], job["finetune"], job["lora_rank"], job["lora_alpha"]) == (
        1e-3,
        "full",
        32,
        32.0,
    )
    assert job["targets"] == ["all"] and job["cameras"] is None
    again = parked.get(f"/v1/fine-tunes/{job['id']}", headers=alice).json()
    assert again == job


@pytest.mark.parametrize(("fields", "param", "message"), API_BAD_CONFIGS)
def test_a_bad_config_is_400_in_the_peers_shape_and_creates_nothing(
    stack: Stack, parked: TestClient, alice: dict[str, str], fields: dict[str, Any], param: str, message: str
) -> None:
    before = count_jobs(stack)
    response = parked.post("/v1/fine-tunes", json={**GOOD, **fields}, headers=alice)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(message), error["message"]
    assert error["code"] in ("invalid_value", "unknown_field")
    assert count_jobs(stack) == before


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"dataset_name": "x"},
            "missing model (required; it must be one of pi05, pi05-tiny, smolvla, smolvla-tiny, "
            "rt-j, rt-j-tiny)",
        ),
        ({"model": "pi05"}, "missing dataset_name (required"),
        ([GOOD], "the config must be an object with the recipe's fields"),
        ("pi05", "the config must be an object with the recipe's fields"),
        (None, "the config must be an object with the recipe's fields"),
    ],
)
def test_a_body_that_is_not_a_config_is_400(
    stack: Stack, parked: TestClient, alice: dict[str, str], body: Any, message: str
) -> None:
    before = count_jobs(stack)
    response = parked.post("/v1/fine-tunes", json=body, headers=alice)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(message)
    broken = parked.post(
        "/v1/fine-tunes", content=b'{"model": ', headers={**alice, "content-type": "application/json"}
    )
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    assert count_jobs(stack) == before


def test_a_body_sent_as_a_form_is_told_to_be_json(
    stack: Stack, parked: TestClient, alice: dict[str, str]
) -> None:
    """`curl -d '{...}'` without a Content-Type sends the JSON as a form: the answer says how to send
    it (it once said the config was not an object with the recipe's fields)."""
    before = count_jobs(stack)
    form = {**alice, "content-type": "application/x-www-form-urlencoded"}
    answer = parked.post("/v1/fine-tunes", content=json.dumps(GOOD).encode(), headers=form)
    assert answer.status_code == 415
    assert answer.json()["error"]["code"] == "unsupported_media_type"
    assert "Content-Type: application/json" in answer.json()["error"]["message"]
    assert count_jobs(stack) == before


def test_keys_are_required_and_checked(parked: TestClient, alice: dict[str, str]) -> None:
    job = create(parked, alice)
    for path in (
        "/v1/fine-tunes",
        f"/v1/fine-tunes/{job['id']}",
        f"/v1/fine-tunes/{job['id']}/events",
        f"/v1/fine-tunes/{job['id']}/files",
    ):
        for headers in ({}, {"authorization": "Bearer relay-wrong"}, {"authorization": "Basic abc"}):
            response = parked.get(path, headers=headers)
            assert response.status_code == 401, (path, headers)
            assert response.json()["error"]["type"] == "authentication_error"
            assert response.headers["www-authenticate"] == "Bearer"
    assert parked.post("/v1/fine-tunes", json=GOOD).status_code == 401


def test_a_revoked_key_stops_working(stack: Stack, parked: TestClient) -> None:
    from relay_api.keys import revoke_keys

    _, key = stack.new_user()
    headers = {"authorization": f"Bearer {key}"}
    assert parked.get("/v1/fine-tunes", headers=headers).status_code == 200
    with stack.sessions() as session:
        assert revoke_keys(session, key) == 1
    assert parked.get("/v1/fine-tunes", headers=headers).status_code == 401


def test_keys_are_stored_hashed(stack: Stack) -> None:
    from relay_api.models import ApiKey

    _, key = stack.new_user()
    with stack.sessions() as session:
        stored = session.scalars(select(ApiKey.key_hash)).all()
    assert key not in stored and all(len(h) == 64 for h in stored)


def test_another_users_job_is_not_found(
    parked: TestClient, alice: dict[str, str], bob: dict[str, str]
) -> None:
    job = create(parked, alice)
    for method, path in [
        ("GET", f"/v1/fine-tunes/{job['id']}"),
        ("POST", f"/v1/fine-tunes/{job['id']}/cancel"),
        ("GET", f"/v1/fine-tunes/{job['id']}/events"),
        ("GET", f"/v1/fine-tunes/{job['id']}/files"),
        ("GET", f"/v1/fine-tunes/{job['id']}/files/output/model.safetensors"),
    ]:
        response = parked.request(method, path, headers=bob)
        assert response.status_code == 404, (method, path)
        assert response.json()["error"]["type"] == "not_found_error"
    assert job["id"] not in [j["id"] for j in parked.get("/v1/fine-tunes", headers=bob).json()["data"]]
    assert parked.get(f"/v1/fine-tunes/{job['id']}", headers=alice).json()["status"] == "queued"


def test_another_users_events_are_not_found_even_when_there_are_some(
    parked: TestClient, alice: dict[str, str], bob: dict[str, str]
) -> None:
    """The events page checks ownership in the same statement that reads the events."""
    job = create(parked, alice)
    assert parked.post(f"/v1/fine-tunes/{job['id']}/cancel", headers=alice).status_code == 200
    path = f"/v1/fine-tunes/{job['id']}/events"
    assert [e.get("event") for e in parked.get(path, headers=alice).json()["data"]] == ["cancelled"]
    hidden = parked.get(path, headers=bob)
    assert hidden.status_code == 404 and hidden.json()["error"]["message"] == f"no fine-tune {job['id']}"
    later = parked.get(path, params={"after": 2**40}, headers=alice).json()
    assert later == {"object": "list", "data": [], "has_more": False}
    assert parked.get(path, params={"after": 2**40}, headers=bob).status_code == 404


def test_the_same_idempotency_key_returns_the_same_job(
    stack: Stack, parked: TestClient, alice: dict[str, str], bob: dict[str, str]
) -> None:
    first = parked.post("/v1/fine-tunes", json=GOOD, headers={**alice, "idempotency-key": "order-1"})
    again = parked.post("/v1/fine-tunes", json=GOOD, headers={**alice, "idempotency-key": "order-1"})
    assert first.status_code == again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.headers["idempotent-replayed"] == "true"
    # Keys are per user: bob's "order-1" is another job.
    bobs = parked.post("/v1/fine-tunes", json=GOOD, headers={**bob, "idempotency-key": "order-1"})
    assert bobs.json()["id"] != first.json()["id"]
    # The same key with another config is a mistake, not a new job.
    before = count_jobs(stack)
    changed = parked.post(
        "/v1/fine-tunes", json={**GOOD, "steps": 21}, headers={**alice, "idempotency-key": "order-1"}
    )
    assert changed.status_code == 409 and changed.json()["error"]["param"] == "Idempotency-Key"
    assert count_jobs(stack) == before


def test_concurrent_creates_with_one_key_make_one_job(stack: Stack, alice: dict[str, str]) -> None:
    headers = {**alice, "idempotency-key": "burst"}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda _: httpx.post(f"{stack.api_url}/v1/fine-tunes", json=GOOD, headers=headers), range(8)
            )
        )
    assert {a.status_code for a in answers} == {200}
    assert len({a.json()["id"] for a in answers}) == 1


def test_list_is_newest_first_with_cursor_pages(parked: TestClient, alice: dict[str, str]) -> None:
    made = [create(parked, alice, name=f"job-{i}")["id"] for i in range(5)]
    newest_first = list(reversed(made))
    page = parked.get("/v1/fine-tunes", params={"limit": 2}, headers=alice).json()
    assert page["object"] == "list" and page["has_more"] is True
    seen = [j["id"] for j in page["data"]]
    while page["has_more"]:
        page = parked.get("/v1/fine-tunes", params={"limit": 2, "after": seen[-1]}, headers=alice).json()
        seen += [j["id"] for j in page["data"]]
    assert seen == newest_first
    everything = parked.get("/v1/fine-tunes", headers=alice).json()
    assert [j["id"] for j in everything["data"]] == newest_first and everything["has_more"] is False
    for params, param, status in (
        ({"limit": 0}, "limit", 400),
        ({"limit": 101}, "limit", 400),
        ({"after": "ft-000000000000"}, "after", 404),  # well formed, but none of alice's
    ):
        response = parked.get("/v1/fine-tunes", params=params, headers=alice)
        assert response.status_code == status and response.json()["error"]["param"] == param


def test_cancelling_a_queued_job_ends_it_at_once(
    stack: Stack, parked: TestClient, alice: dict[str, str]
) -> None:
    job = create(parked, alice)
    cancelled = parked.post(f"/v1/fine-tunes/{job['id']}/cancel", headers=alice)
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["finished_at"] is not None
    # Again: harmless, and nothing changes.
    again = parked.post(f"/v1/fine-tunes/{job['id']}/cancel", headers=alice)
    assert again.status_code == 200 and again.json() == cancelled.json()
    events = parked.get(f"/v1/fine-tunes/{job['id']}/events", headers=alice).json()["data"]
    assert [e.get("event") for e in events] == ["cancelled"]
    with stack.sessions() as session:
        assert (
            session.scalar(
                select(func.count()).select_from(FineTuneEvent).where(FineTuneEvent.job_id == job["id"])
            )
            == 1
        )


def test_a_finished_job_cannot_be_cancelled(stack: Stack, parked: TestClient, alice: dict[str, str]) -> None:
    from sqlalchemy import update

    for final in ("completed", "error"):
        job = create(parked, alice)
        with stack.sessions() as session:
            session.execute(update(FineTune).where(FineTune.id == job["id"]).values(status=final))
            session.commit()
        response = parked.post(f"/v1/fine-tunes/{job['id']}/cancel", headers=alice)
        assert response.status_code == 409
        assert response.json()["error"]["message"].startswith(f"fine-tune {job['id']} is already {final}")
        assert parked.get(f"/v1/fine-tunes/{job['id']}", headers=alice).json()["status"] == final


def test_every_response_has_a_request_id(stack: Stack, alice: dict[str, str]) -> None:
    with httpx.Client(base_url=stack.api_url) as http:
        answers = [
            http.get("/v1/fine-tunes", headers=alice),
            http.get("/v1/fine-tunes"),
            http.get("/v1/fine-tunes/ft-000000000000", headers=alice),
            http.post("/v1/fine-tunes", json={"model": "pi05"}, headers=alice),
            http.get("/no/such/path"),
            http.get("/healthz"),
            http.get("/openapi.json"),
        ]
        ids = [a.headers.get("x-request-id") for a in answers]
        assert all(ids) and len(set(ids)) == len(ids)
        echoed = http.get("/healthz", headers={"x-request-id": "trace-123"})
        assert echoed.headers["x-request-id"] == "trace-123"


def test_the_docs_describe_the_api(stack: Stack) -> None:
    with httpx.Client(base_url=stack.api_url) as http:
        assert http.get("/docs").status_code == 200
        paths = http.get("/openapi.json").json()["paths"]
    assert {
        "/v1/fine-tunes",
        "/v1/fine-tunes/{job_id}",
        "/v1/fine-tunes/{job_id}/cancel",
        "/v1/fine-tunes/{job_id}/summary",
        "/v1/fine-tunes/{job_id}/events",
        "/v1/fine-tunes/{job_id}/files",
        "/v1/fine-tunes/{job_id}/files/{path}",
    } <= set(paths)


def test_a_shared_server_can_refuse_local_dataset_directories(stack: Stack, alice: dict[str, str]) -> None:
    settings = stack.settings.model_copy(update={"fine_tune_queue": PARKED_QUEUE, "local_datasets": False})
    with TestClient(create_app(settings)) as shared:
        for local in ("/data/secret", "~/x", "./x", "../x", "file:///x", ".", "..", "file:/x"):
            response = shared.post("/v1/fine-tunes", json={**GOOD, "dataset_name": local}, headers=alice)
            assert response.status_code == 400 and response.json()["error"]["param"] == "dataset_name"
            assert "does not read local directories" in response.json()["error"]["message"]
        # `file:x` is no local directory (a file: URL names an absolute path) and no Hub name: it is
        # refused by the dataset-name rule itself, on any server.
        response = shared.post("/v1/fine-tunes", json={**GOOD, "dataset_name": "file:x"}, headers=alice)
        assert response.status_code == 400 and response.json()["error"]["param"] == "dataset_name"
        assert "must be a LeRobot dataset" in response.json()["error"]["message"]
        assert shared.post("/v1/fine-tunes", json=GOOD, headers=alice).status_code == 200


def test_times_are_written_as_isoformat_writes_them() -> None:
    """iso() writes with orjson for speed; it must write what `isoformat` (with Z for UTC) wrote."""
    moments = [
        dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),  # no microseconds: none written
        dt.datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=dt.UTC),
        dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        dt.datetime(2026, 6, 1, 12, 0, 0, 120000, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        dt.datetime(2026, 6, 1, 12, 0, 0),  # naive: no offset
    ]
    for moment in moments:
        assert iso(moment) == moment.isoformat().replace("+00:00", "Z")
    assert iso(None) is None


def test_the_api_freezes_its_startup_objects_out_of_the_garbage_collector_unless_told_not_to(
    stack: Stack,
) -> None:
    # Frozen objects stay frozen for the process's life; start from none, as a fresh process does.
    gc.unfreeze()
    with TestClient(create_app(stack.settings.model_copy(update={"gc_freeze": False}))) as api:
        assert api.get("/healthz").status_code == 200
    assert gc.get_freeze_count() == 0
    with TestClient(create_app(stack.settings)) as api:
        assert api.get("/healthz").status_code == 200
    # The app's own objects are among the frozen: a full collection no longer walks them.
    assert gc.get_freeze_count() > 10_000
