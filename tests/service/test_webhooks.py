"""Webhooks on the real service: the routes (the secret shown once, refusals naming the field,
another user's webhook not found), and deliveries sent by the real worker's reconciler to a real
HTTP receiver started here, which checks every message with the independent `standardwebhooks`
package, goes down and comes back.

One recipe job trains here (pi05-tiny, 10 steps); the cancelled jobs are parked ones (a queue no
worker reads), cancelled while queued. The stack retries a failed delivery at the next reconciler
pass (RELAY_WEBHOOK_RETRY_SECONDS=0.5, a pass a second)."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from standardwebhooks import Webhook

from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.settings import Settings
from tests.isolation import free_port
from tests.service.stack import Stack, WorkerProcess, wait_for

PARKED_JOB = {"model": "pi05-tiny", "dataset_name": "lerobot/pusht_image", "steps": 20}


class Receiver:
    """A webhook receiver on a loopback port: it records every request (path, headers, body) and
    answers `status` (200, or 503 while it is "down"); while `held` (a slow one) it answers nothing
    until released."""

    def __init__(self) -> None:
        self.status = 200
        self.released = threading.Event()
        self.released.set()
        self.received: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                owner.released.wait(60)
                with owner._lock:
                    answer = owner.status
                    owner.received.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers.items()),
                            "body": body,
                            "answer": answer,
                        }
                    )
                self.send_response(answer)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.port = free_port()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def events(self, path: str = "/hook", answered: int | None = None) -> list[dict[str, Any]]:
        """The requests to `path` (those answered `answered`, if given), each with its event."""
        with self._lock:
            found = [r for r in self.received if r["path"] == path]
        return [
            {**r, "event": json.loads(r["body"])}
            for r in found
            if answered is None or r["answer"] == answered
        ]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    yield started
    started.close()


def verified(secret: str, request: dict[str, Any]) -> dict[str, Any]:
    """The event, once standardwebhooks has checked its signature (it raises otherwise)."""
    payload: dict[str, Any] = Webhook(secret).verify(request["body"], request["headers"])
    return payload


def for_job(requests: list[dict[str, Any]], job_id: str) -> list[dict[str, Any]]:
    return [r for r in requests if r["event"]["data"]["id"] == job_id]


def parked_cancelled_job(parked: TestClient, headers: dict[str, str]) -> dict[str, Any]:
    job = parked.post("/v1/fine-tunes", json=PARKED_JOB, headers=headers).json()
    cancelled = parked.post(f"/v1/fine-tunes/{job['id']}/cancel", headers=headers).json()
    assert cancelled["status"] == "cancelled", cancelled
    return cancelled


# The routes -------------------------------------------------------------------------------------


def test_the_secret_is_shown_once_and_the_routes_list_retrieve_and_delete(
    parked: TestClient, alice: dict[str, str]
) -> None:
    created = parked.post(
        "/v1/webhooks", json={"url": "https://example.com/relay", "description": "ci"}, headers=alice
    )
    assert created.status_code == 200, created.text
    webhook = created.json()
    assert webhook["id"].startswith("wh_") and webhook["object"] == "webhook"
    assert webhook["url"] == "https://example.com/relay" and webhook["description"] == "ci"
    # Every event type, when none is named.
    assert webhook["events"] == [
        "fine_tune.succeeded",
        "fine_tune.failed",
        "fine_tune.cancelled",
        "fine_tune.evaluated",
    ]
    assert webhook["secret"].startswith("whsec_") and len(webhook["secret"]) > 6 + 32
    shown = {**webhook, "secret": None}
    assert parked.get(f"/v1/webhooks/{webhook['id']}", headers=alice).json() == shown
    second = parked.post(
        "/v1/webhooks", json={"url": "http://10.0.0.1:8080/x", "events": ["fine_tune.failed"]}, headers=alice
    ).json()
    assert second["events"] == ["fine_tune.failed"] and second["secret"] != webhook["secret"]
    listed = parked.get("/v1/webhooks", headers=alice).json()
    assert listed["object"] == "list" and listed["has_more"] is False
    assert listed["data"] == [{**second, "secret": None}, shown]  # newest first, no secret
    page = parked.get("/v1/webhooks", params={"limit": 1}, headers=alice).json()
    assert [w["id"] for w in page["data"]] == [second["id"]] and page["has_more"] is True
    after = parked.get("/v1/webhooks", params={"after": second["id"]}, headers=alice).json()
    assert [w["id"] for w in after["data"]] == [webhook["id"]]
    assert parked.get(f"/v1/webhooks/{webhook['id']}/deliveries", headers=alice).json() == {
        "object": "list",
        "data": [],
        "has_more": False,
    }

    deleted = parked.delete(f"/v1/webhooks/{webhook['id']}", headers=alice)
    assert deleted.status_code == 200 and deleted.json() == shown
    for path in (f"/v1/webhooks/{webhook['id']}", f"/v1/webhooks/{webhook['id']}/deliveries"):
        gone = parked.get(path, headers=alice)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert parked.delete(f"/v1/webhooks/{webhook['id']}", headers=alice).status_code == 404
    assert [w["id"] for w in parked.get("/v1/webhooks", headers=alice).json()["data"]] == [second["id"]]


def test_another_users_webhook_is_not_found(parked: TestClient, alice: dict[str, str], stack: Stack) -> None:
    bob = {"authorization": f"Bearer {stack.new_user()[1]}"}
    webhook = parked.post("/v1/webhooks", json={"url": "https://example.com/a"}, headers=alice).json()
    for method, path in (
        ("GET", f"/v1/webhooks/{webhook['id']}"),
        ("GET", f"/v1/webhooks/{webhook['id']}/deliveries"),
        ("DELETE", f"/v1/webhooks/{webhook['id']}"),
    ):
        answer = parked.request(method, path, headers=bob)
        assert answer.status_code == 404, (method, path, answer.text)
        assert answer.json()["error"] == {
            "message": f"no webhook {webhook['id']}",
            "type": "not_found_error",
            "param": "id",
            "code": "not_found",
        }
    assert parked.get("/v1/webhooks", headers=bob).json()["data"] == []
    assert parked.get(f"/v1/webhooks/{webhook['id']}", headers=alice).status_code == 200
    assert parked.post("/v1/webhooks", json={"url": "https://example.com/a"}).status_code == 401


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"url": "ftp://example.com/x"}, "url", "must be an http:// or https:// URL"),
        ({"url": "example.com/x"}, "url", "must be an http:// or https:// URL"),
        ({"url": "http://"}, "url", "with a host"),
        ({"url": "http://example.com:99999/"}, "url", "http:// or https://"),
        ({"url": "http://exa mple.com/"}, "url", "http:// or https://"),
        ({"url": "https://example.com/" + "a" * 3000}, "url", "at most 2048 characters"),
        ({"url": "https://example.com/\x00"}, "url", "http:// or https://"),
        ({"url": 7}, "url", "bad url: 7"),
        ({}, "url", "missing url"),
        ({"url": "https://example.com", "events": ["fine_tune.started"]}, "events", "fine_tune.succeeded"),
        ({"url": "https://example.com", "events": []}, "events", "non-empty list"),
        ({"url": "https://example.com", "events": "fine_tune.failed"}, "events", "bad events"),
        ({"url": "https://example.com", "description": "d" * 501}, "description", "at most 500"),
        ({"url": "https://example.com", "description": "a\x07b"}, "description", "bad description"),
        ({"url": "https://example.com", "secret": "whsec_mine"}, "secret", "unknown field secret"),
        ([], None, "the body must be an object"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_the_rule(
    parked: TestClient, alice: dict[str, str], body: Any, param: str | None, words: str
) -> None:
    answer = parked.post("/v1/webhooks", json=body, headers=alice)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_odd_ids_and_bodies_are_4xx_never_500(parked: TestClient, alice: dict[str, str]) -> None:
    for path in (
        "/v1/webhooks/" + "x" * 100,
        "/v1/webhooks/wh_%00",
        "/v1/webhooks/wh_1/deliveries?after=%00",
    ):
        assert parked.get(path, headers=alice).status_code in (400, 404), path
    assert parked.get("/v1/webhooks?after=wh_nothing", headers=alice).status_code == 404
    broken = parked.post(
        "/v1/webhooks", content=b"{not json", headers={**alice, "content-type": "application/json"}
    )
    assert broken.status_code == 400


def test_a_user_has_at_most_the_limit_of_webhooks(stack: Stack, alice: dict[str, str]) -> None:
    settings: Settings = stack.settings.model_copy(update={"webhooks_per_user": 2})
    from relay_api.app import create_app

    with TestClient(create_app(settings)) as api:
        for _ in range(2):
            assert (
                api.post("/v1/webhooks", json={"url": "https://example.com"}, headers=alice).status_code
                == 200
            )
        refused = api.post("/v1/webhooks", json={"url": "https://example.com"}, headers=alice)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "webhook_limit_reached"
        assert "the most a user may have (2)" in refused.json()["error"]["message"]


# Deliveries -------------------------------------------------------------------------------------


def test_a_cancelled_job_is_delivered_to_the_webhooks_that_name_it_and_not_to_a_deleted_one(
    stack: Stack, worker: WorkerProcess, parked: TestClient, alice: dict[str, str], receiver: Receiver
) -> None:
    def create(path: str, events: list[str] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"url": receiver.url(path)}
        if events is not None:
            body["events"] = events
        return parked.post("/v1/webhooks", json=body, headers=alice).json()

    before = parked_cancelled_job(parked, alice)  # ended before any webhook existed: never sent
    everything = create("/all")
    cancels = create("/cancels", ["fine_tune.cancelled"])
    successes = create("/successes", ["fine_tune.succeeded"])
    deleted = create("/deleted")
    assert parked.delete(f"/v1/webhooks/{deleted['id']}", headers=alice).status_code == 200

    job = parked_cancelled_job(parked, alice)
    for path, webhook in (("/all", everything), ("/cancels", cancels)):
        request = wait_for(lambda p=path: receiver.events(p), 30, f"the cancelled event at {path}")[0]
        event = verified(webhook["secret"], request)
        assert event["type"] == "fine_tune.cancelled" and event["object"] == "event"
        assert event["data"] == {"id": job["id"], "status": "cancelled"}
        assert event["id"].startswith("evt_") and request["headers"]["webhook-id"] == event["id"]
        finished = dt.datetime.fromisoformat(job["finished_at"]).timestamp()
        assert event["created_at"] == int(finished)
        assert request["headers"]["content-type"] == "application/json"
        [delivery] = parked.get(f"/v1/webhooks/{webhook['id']}/deliveries", headers=alice).json()["data"]
        assert delivery["id"] == event["id"] and delivery["job_id"] == job["id"]
        assert delivery["type"] == "fine_tune.cancelled" and delivery["webhook_id"] == webhook["id"]
        wait_for(
            lambda w=webhook: (
                parked.get(f"/v1/webhooks/{w['id']}/deliveries", headers=alice).json()["data"][0]["status"]
                == "delivered"
            ),
            10,
            "the delivery to be recorded",
        )
    time.sleep(2.5)  # two more reconciler passes: nothing else comes
    assert len(receiver.events("/all")) == 1 and len(receiver.events("/cancels")) == 1
    assert receiver.events("/successes") == [] and receiver.events("/deleted") == []
    assert parked.get(f"/v1/webhooks/{successes['id']}/deliveries", headers=alice).json()["data"] == []
    assert not for_job(receiver.events("/all"), before["id"])
    [delivery] = parked.get(f"/v1/webhooks/{everything['id']}/deliveries", headers=alice).json()["data"]
    assert delivery["status"] == "delivered" and delivery["attempts"] == 1
    assert delivery["last_response_code"] == 200 and delivery["last_error"] is None
    assert delivery["next_attempt_at"] is None and delivery["delivered_at"] is not None


def test_a_completed_job_is_delivered_signed_after_its_receiver_comes_back(
    stack: Stack,
    worker: WorkerProcess,
    parked: TestClient,
    client: Client,
    dataset: Path,
    receiver: Receiver,
) -> None:
    """The receiver is down (503) when the job ends: the job is completed all the same, the delivery
    is retried (one event id, fresh timestamps), a queued job is cancelled meanwhile at once, and
    once the receiver is back both events arrive, signed; the deliveries show the attempts."""
    receiver.status = 503
    webhook = client.webhooks.create(url=receiver.url())
    assert webhook.secret is not None and client.webhooks.retrieve(webhook.id).secret is None
    headers = {"authorization": f"Bearer {client.api_key}"}

    config = SFTConfig(
        model="pi05-tiny", dataset_name=str(dataset), batch_size=2, finetune="lora", steps=10, name="hooked"
    )
    job = train(config, client=client).wait(poll=0.5)
    assert job.status == "completed", job.error
    failing = wait_for(
        lambda: len(for_job(receiver.events(), job.id)) >= 2 and receiver.events(), 30, "retries"
    )
    # Down: the job ended all the same, and its event was tried more than once, under one id.
    assert {r["answer"] for r in for_job(failing, job.id)} == {503}
    assert len({r["headers"]["webhook-id"] for r in for_job(failing, job.id)}) == 1
    while_down = parked_cancelled_job(parked, headers)  # the API answers at once meanwhile
    pending = {d.job_id: d for d in client.webhooks.deliveries(webhook.id)}[job.id]
    assert pending.status == "pending" and pending.attempts >= 2 and pending.last_response_code == 503
    assert pending.last_error == "HTTP 503" and pending.next_attempt_at is not None

    receiver.status = 200
    for job_id, kind in ((job.id, "fine_tune.succeeded"), (while_down["id"], "fine_tune.cancelled")):
        accepted = wait_for(
            lambda j=job_id: for_job(receiver.events(answered=200), j), 30, f"{kind} delivered"
        )
        assert len(accepted) == 1
        event = verified(webhook.secret, accepted[0])
        assert event["type"] == kind and event["data"]["id"] == job_id
    succeeded = for_job(receiver.events(), job.id)
    assert [r["answer"] for r in succeeded][-1] == 200 and len(succeeded) >= 3
    assert len({r["headers"]["webhook-id"] for r in succeeded}) == 1
    stamps = [int(r["headers"]["webhook-timestamp"]) for r in succeeded]
    assert stamps == sorted(stamps) and abs(stamps[-1] - time.time()) < 60
    assert {r["body"] for r in succeeded} == {succeeded[0]["body"]}  # the same bytes each time
    assert json.loads(succeeded[0]["body"])["data"] == {"id": job.id, "status": "completed"}

    deliveries = {d.job_id: d for d in client.webhooks.deliveries(webhook.id)}
    delivered = wait_for(lambda: (d := {x.job_id: x for x in client.webhooks.deliveries(webhook.id)}[job.id])
                         .status == "delivered" and d, 10, "the delivery recorded")  # fmt: skip
    assert delivered.attempts == len(succeeded) > 1 and delivered.last_response_code == 200
    assert delivered.last_error is None
    # The job's end came first; its webhook's delivery did not hold it.
    job.refresh()
    finished_at = dt.datetime.fromisoformat(job.to_dict()["finished_at"])
    assert delivered.delivered_at is not None and finished_at < dt.datetime.fromisoformat(
        delivered.delivered_at
    )
    assert deliveries[while_down["id"]].type == "fine_tune.cancelled"
    assert [w.id for w in client.webhooks.list()] == [webhook.id]
    assert client.webhooks.delete(webhook.id).id == webhook.id and list(client.webhooks.list()) == []


# The CLI ----------------------------------------------------------------------------------------


def test_the_cli_creates_lists_shows_deliveries_of_and_deletes_a_webhook(
    stack: Stack, user: tuple[str, str], tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from relay.cli import app

    runner = CliRunner()
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": user[1], "RELAY_HOME": str(tmp_path)}

    def run(*args: str) -> str:
        result = runner.invoke(app, list(args), env=env)
        assert result.exit_code == 0, (args, result.output)
        return result.output

    created = json.loads(
        run("webhooks", "create", "https://example.com/ci", "--event", "fine_tune.failed", "--json")
    )
    assert created["events"] == ["fine_tune.failed"] and created["secret"].startswith("whsec_")
    listed = [json.loads(line) for line in run("webhooks", "list", "--json").splitlines()]
    assert listed == [{**created, "secret": None}]
    assert created["id"] in run("webhooks", "list") and "fine_tune.failed" in run("webhooks", "list")
    assert run("webhooks", "deliveries", created["id"], "--json") == ""
    refused = runner.invoke(app, ["webhooks", "create", "ftp://example.com"], env=env)
    assert refused.exit_code == 2 and "bad url" in refused.output and "Traceback" not in refused.output
    run("webhooks", "delete", created["id"])
    missing = runner.invoke(app, ["webhooks", "deliveries", created["id"]], env=env)
    assert missing.exit_code == 1 and f"no webhook {created['id']}" in missing.output


# The dispatcher on SQLite (the embedded server's database), step by step --------------------------


def test_the_dispatcher_derives_once_claims_once_retries_and_gives_up_on_sqlite(
    tmp_path: Path, receiver: Receiver
) -> None:
    import httpx
    from sqlalchemy import select

    from relay.webhooks import WebhookConfig
    from relay_api import keys, migrate
    from relay_api import webhooks as api_webhooks
    from relay_api.db import session_factory, utcnow
    from relay_api.models import FineTune, users
    from relay_worker import webhook_dispatch as dispatch

    settings = Settings(
        home=tmp_path,
        webhook_retry_seconds="1,2",
        webhook_max_attempts=3,
        webhook_timeout_seconds=2,
        webhook_private_addresses=True,  # as `relay server` runs: the receiver is on loopback
    )
    migrate.upgrade(settings.database_url)
    sessions = session_factory(settings)
    with sessions() as db:
        name = keys.create_key(db, "sqlite-user").user
        user_id = db.execute(select(users.c.id).where(users.c.name == name)).scalar_one()
        good = api_webhooks.create(db, user_id, WebhookConfig(url=receiver.url("/good")), settings)
        bad = api_webhooks.create(db, user_id, WebhookConfig(url=receiver.url("/bad")), settings)
        now = utcnow()
        db.add(
            FineTune(id="ft-000000000001", user_id=user_id, config={}, status="completed", finished_at=now)
        )
        db.add(FineTune(id="ft-000000000002", user_id=user_id, config={}, status="running"))
        db.commit()

        assert dispatch.derive(db, settings, now) == 2  # one per webhook, the running job none
        assert dispatch.derive(db, settings, now) == 0  # written once
        claimed = dispatch.claim(db, settings, now, 10)
        assert sorted(d["url"] for d in claimed) == [receiver.url("/bad"), receiver.url("/good")]
        assert dispatch.claim(db, settings, now, 10) == []  # claimed: no one else sends them now

        def attempt(delivery: dict[str, Any], status: int, at: dt.datetime) -> None:
            receiver.status = status
            with httpx.Client(timeout=2) as http:
                code, error = dispatch.send(http, delivery, settings.webhook_private_addresses)
            dispatch.record(db, settings, delivery, code, error, at)

        first = {d["url"]: d for d in claimed}
        attempt(first[receiver.url("/good")], 200, now)
        attempt(first[receiver.url("/bad")], 500, now)
        event = verified(good["secret"], receiver.events("/good")[0])
        assert event["type"] == "fine_tune.succeeded" and event["data"]["id"] == "ft-000000000001"

        # The failed one is due again after the first delay (1 s), the next after the second (2 s),
        # and the third attempt is the last (webhook_max_attempts).
        assert dispatch.claim(db, settings, now + dt.timedelta(seconds=0.9), 10) == []
        later = now
        for wait, attempts in ((1, 1), (2, 2)):
            row = api_webhooks.deliveries_page(db, user_id, bad["id"], None, 10)[0][0]
            assert row["status"] == "pending" and row["attempts"] == attempts
            assert row["last_response_code"] == 500 and row["last_error"] == "HTTP 500"
            later += dt.timedelta(seconds=wait)
            [again] = dispatch.claim(db, settings, later, 10)
            attempt(again, 500, later)
        [gave_up] = api_webhooks.deliveries_page(db, user_id, bad["id"], None, 10)[0]
        assert (
            gave_up["status"] == "failed" and gave_up["attempts"] == 3 and gave_up["next_attempt_at"] is None
        )
        [done] = api_webhooks.deliveries_page(db, user_id, good["id"], None, 10)[0]
        assert done["status"] == "delivered" and done["attempts"] == 1 and done["delivered_at"] is not None
        assert dispatch.claim(db, settings, later + dt.timedelta(hours=1), 10) == []
        # Every attempt of the failed one carried the same event id and body.
        tries = receiver.events("/bad")
        assert len(tries) == 3 and len({r["headers"]["webhook-id"] for r in tries}) == 1
        assert len({r["body"] for r in tries}) == 1
    sessions.kw["bind"].dispose()


def test_a_slow_receiver_costs_a_sender_thread_its_time_limit_and_never_the_pass(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A receiver that takes the request and does not answer, with a 1 s limit: the pass that starts
    the attempt returns without waiting, the attempt ends at the limit while the receiver is still
    silent, and its timeout is recorded for a retry."""
    from sqlalchemy import select

    from relay.webhooks import WebhookConfig
    from relay_api import keys, migrate
    from relay_api import webhooks as api_webhooks
    from relay_api.db import session_factory, utcnow
    from relay_api.models import FineTune, users
    from relay_worker.webhook_dispatch import Dispatcher

    settings = Settings(
        home=tmp_path,
        webhook_timeout_seconds=1,
        webhook_retry_seconds="60",
        webhook_private_addresses=True,  # the receiver is on loopback
    )
    migrate.upgrade(settings.database_url)
    sessions = session_factory(settings)
    with sessions() as db:
        name = keys.create_key(db, "slow-user").user
        user_id = db.execute(select(users.c.id).where(users.c.name == name)).scalar_one()
        webhook = api_webhooks.create(db, user_id, WebhookConfig(url=receiver.url()), settings)
        db.add(
            FineTune(id="ft-000000000003", user_id=user_id, config={}, status="error", finished_at=utcnow())
        )
        db.commit()
    receiver.released.clear()  # it takes the request and answers nothing until released
    dispatcher = Dispatcher(sessions, settings)
    try:
        assert dispatcher.run_pass() == (1, 1)  # one derived, one claimed and handed to a sender
        assert receiver.events() == []  # the pass returned with the receiver's answer still to come

        def recorded() -> dict[str, Any] | None:
            with sessions() as db:
                [row] = api_webhooks.deliveries_page(db, user_id, webhook["id"], None, 10)[0]
            return row if row["attempts"] == 1 else None

        row = wait_for(recorded, 30, "the timeout to be recorded")
        assert receiver.events() == []  # the attempt ended at its limit, the receiver still silent
        assert row["status"] == "pending" and row["last_response_code"] is None
        assert row["last_error"].startswith("ReadTimeout") and row["type"] == "fine_tune.failed"
        assert dispatcher.run_pass() == (0, 0)  # due again in 60 s, not now
    finally:
        receiver.released.set()
        dispatcher.close()
        sessions.kw["bind"].dispose()


def test_each_evaluation_of_a_job_is_delivered_with_its_step(
    stack: Stack, worker: WorkerProcess, client: Client, dataset: Path, receiver: Receiver
) -> None:
    """A job whose eval block runs at each checkpoint: a webhook that names fine_tune.evaluated gets
    one signed event per evaluation, each with its step (10 and 20), and the job's end; one that
    names only the end gets no evaluation."""
    evaluated = client.webhooks.create(
        url=receiver.url("/evaluated"), events=["fine_tune.evaluated", "fine_tune.succeeded"]
    )
    ends_only = client.webhooks.create(url=receiver.url("/ends"), events=["fine_tune.succeeded"])
    assert evaluated.secret is not None
    block = {"env": "relay/Dot-v0", "episodes": 2, "max_steps": 10, "at_checkpoints": True}
    config = SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=20, eval=block)
    job = train(config, client=client).wait(poll=0.5)
    assert job.status == "completed", job.error
    steps = sorted(e["step"] for e in job.events() if e.kind == "eval")
    assert steps == [10, 20]

    def all_three() -> list[dict[str, Any]] | None:
        found = for_job(receiver.events("/evaluated", answered=200), job.id)
        return found if len(found) >= 3 else None

    got = wait_for(all_three, 30, "two evaluations and the end delivered")
    events = [verified(evaluated.secret, request) for request in got]
    assert sorted((e["type"], e["data"].get("step")) for e in events) == [
        ("fine_tune.evaluated", 10),
        ("fine_tune.evaluated", 20),
        ("fine_tune.succeeded", None),
    ]
    assert {e["data"]["id"] for e in events} == {job.id}
    ends = wait_for(lambda: for_job(receiver.events("/ends", answered=200), job.id), 30, "the end delivered")
    assert [json.loads(r["body"])["type"] for r in ends] == ["fine_tune.succeeded"]
    listed = sorted((d.type, d.step) for d in client.webhooks.deliveries(evaluated.id) if d.job_id == job.id)
    assert listed == [("fine_tune.evaluated", 10), ("fine_tune.evaluated", 20), ("fine_tune.succeeded", None)]
    for webhook in (evaluated, ends_only):
        client.webhooks.delete(webhook.id)
