"""Webhooks go to public addresses only, unless the operator allows others
(RELAY_WEBHOOK_PRIVATE_ADDRESSES): the rule on addresses, the API's refusal at create (naming the
field, nothing created), and a delivery's refusal and its pinning to the address it checked, sent
by the worker's own `send` to a real receiver on loopback. Name lookups are the one double: the
tests answer getaddrinfo for made-up names (no DNS server is reachable here)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from relay_api import webhook_addresses
from relay_api.app import create_app
from relay_api.webhook_addresses import is_public, refusal_at_create
from relay_worker.webhook_dispatch import send
from tests.service.stack import Stack
from tests.service.test_webhooks import Receiver


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("127.0.1.1", False),
        ("::1", False),
        ("10.1.2.3", False),
        ("172.17.0.2", False),  # Docker's default bridge: the compose stack's own services
        ("192.168.1.10", False),
        ("169.254.169.254", False),  # a cloud's metadata service
        ("100.64.0.1", False),  # carrier-grade NAT
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:8.8.8.8", True),
        ("fe80::1%eth0", False),
        ("fd00::1", False),
    ],
)
def test_which_addresses_are_public(address: str, public: bool) -> None:
    assert is_public(address) is public


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        ("localhost", True),
        ("LOCALHOST.", True),
        ("api.localhost", True),
        ("127.0.0.1", True),
        ("[::1]", True),
        ("169.254.169.254", True),
        ("receiver.example.com", False),  # a name is looked up at each delivery, not here
        ("8.8.8.8", False),
    ],
)
def test_what_is_refused_before_any_lookup(host: str, refused: bool) -> None:
    assert (refusal_at_create(host) is not None) is refused


@pytest.fixture(scope="module")
def public_only(stack: Stack) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """The API as a deployment runs it: webhooks to public addresses only."""
    settings = stack.settings.model_copy(update={"webhook_private_addresses": False})
    with TestClient(create_app(settings)) as client:
        yield client, {"authorization": f"Bearer {stack.new_user()[1]}"}


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "https://[::1]/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.5:5432/",
        "http://[::ffff:127.0.0.1]:6379/",
    ],
)
def test_the_api_refuses_a_private_receiver_and_creates_nothing(
    public_only: tuple[TestClient, dict[str, str]], url: str
) -> None:
    client, headers = public_only
    answer = client.post("/v1/webhooks", json={"url": url}, headers=headers)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "url"
    assert error["code"] == "invalid_value"
    assert "must be a public address" in error["message"]
    assert "RELAY_WEBHOOK_PRIVATE_ADDRESSES" in error["message"]
    assert client.get("/v1/webhooks", headers=headers).json()["data"] == []


def test_the_api_takes_a_public_name_and_an_operator_may_allow_private_ones(
    stack: Stack, public_only: tuple[TestClient, dict[str, str]]
) -> None:
    client, headers = public_only
    created = client.post("/v1/webhooks", json={"url": "https://receiver.example.com/relay"}, headers=headers)
    assert created.status_code == 200, created.text
    client.delete(f"/v1/webhooks/{created.json()['id']}", headers=headers)
    assert stack.settings.webhook_private_addresses  # the stack's receivers are on loopback
    with TestClient(create_app(stack.settings)) as allowing:
        mine = {"authorization": f"Bearer {stack.new_user()[1]}"}
        answer = allowing.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"}, headers=mine)
        assert answer.status_code == 200, answer.text


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    yield started
    started.close()


def delivery(url: str) -> dict[str, Any]:
    return {"id": "msg_test", "secret": "whsec_" + "A" * 32, "payload": '{"type": "ping"}', "url": url}


REAL_GETADDRINFO = socket.getaddrinfo


def answering(names: dict[str, str]) -> Any:
    """getaddrinfo that answers `names` (name -> address), passes a literal address through (as
    the connection's own lookup of it), and finds no other name."""

    def lookup(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        if refusal_at_create(host) is not None or host.replace(".", "").isdigit():
            return list(REAL_GETADDRINFO(host, port, *args, **kwargs))
        if host not in names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (names[host], port))]

    return lookup


def test_a_delivery_to_a_name_that_resolves_privately_is_refused_unsent(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhook_addresses.socket, "getaddrinfo", answering({"inside.example": "127.0.0.1"}))
    url = receiver.url("/hook").replace("127.0.0.1", "inside.example")
    with httpx.Client(timeout=2, follow_redirects=False) as http:
        code, error = send(http, delivery(url), False)
        assert code is None
        assert error == "refused: inside.example resolves to 127.0.0.1, not a public address"
        code, error = send(http, delivery(receiver.url("/hook")), False)  # a literal loopback address
        assert code is None and error is not None and error.startswith("refused: 127.0.0.1")
        code, error = send(http, delivery(url.replace("inside.example", "nowhere.example")), False)
        assert code is None and error is not None and error.startswith("nowhere.example does not resolve")
    assert receiver.received == []


def test_a_delivery_goes_to_the_address_it_checked_with_the_url_host_named(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request connects to the address the check resolved (httpx looks nothing up again, so a
    name that resolves elsewhere a moment later changes nothing), and the receiver still sees the
    URL's host. For the test, loopback stands for a public address."""
    monkeypatch.setattr(webhook_addresses.socket, "getaddrinfo", answering({"receiver.example": "127.0.0.1"}))
    monkeypatch.setattr(webhook_addresses, "is_public", lambda address: address == "127.0.0.1")
    url = receiver.url("/hook").replace("127.0.0.1", "receiver.example")
    with httpx.Client(timeout=2, follow_redirects=False) as http:
        assert send(http, delivery(url), False) == (200, None)
    [received] = receiver.received
    assert received["path"] == "/hook"
    assert {k.lower(): v for k, v in received["headers"].items()}[
        "host"
    ] == f"receiver.example:{receiver.port}"
