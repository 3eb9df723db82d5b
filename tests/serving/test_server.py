"""The policy server over HTTP and openpi's websocket protocol, driven by httpx and by the real
openpi-client package: the same actions both ways for a seed, keys checked, sizes limited before
parsing, errors as OpenAI-style bodies naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest
import websockets.sync.client
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed, InvalidStatus

from relay_worker.serving.server import RunningPolicyServer

from .conftest import KEY, MAX_BODY_BYTES, as_json, observation

AUTH = {"Authorization": f"Bearer {KEY}"}
# Chunks of one observation and seed: equal over both protocols, within float32 rounding should
# two requests have shared a batch with others.
ATOL = 1e-4


def _post(server: RunningPolicyServer, body: Any, headers: dict[str, str] = AUTH) -> httpx.Response:
    return httpx.post(f"{server.url}/actions", json=body, headers=headers, timeout=60)


def _client(server: RunningPolicyServer, key: str | None = KEY) -> WebsocketClientPolicy:
    return WebsocketClientPolicy(host=server.url.removeprefix("http://"), port=None, api_key=key)


def test_openpi_client_and_http_get_the_same_actions_for_a_seed(server: RunningPolicyServer) -> None:
    obs = observation(4)
    answer = _post(server, {"observation": as_json(obs), "seed": 21})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["seed"] == 21 and set(body["timing"]) == {
        "decode_ms",
        "preprocess_ms",
        "model_ms",
        "postprocess_ms",
        "total_ms",
    }
    http_actions = np.asarray(body["actions"])
    assert http_actions.shape == (10, 2)

    client = _client(server)
    metadata = client.get_server_metadata()
    assert metadata["cameras"] == ["observation.images.top", "observation.images.wrist"]
    assert metadata["state_dim"] == 2 and metadata["action_dim"] == 2 and metadata["raw_units"] is True
    assert metadata["kind"] == "pi05" and metadata["answers"] == "actions"
    result = client.infer({**obs, "state": np.asarray(obs["state"]), "seed": 21})
    assert isinstance(result["actions"], np.ndarray) and result["actions"].dtype == np.float32
    np.testing.assert_allclose(result["actions"], http_actions, rtol=0, atol=ATOL)
    assert result["server_timing"]["model_ms"] > 0 and "infer_ms" in result["server_timing"]
    assert server.stats()["clients"] == 1

    several = _post(server, {"observations": [as_json(obs), as_json(observation(5))], "seeds": [21, None]})
    assert several.status_code == 200, several.text
    chunks = several.json()["actions"]
    assert len(chunks) == 2 and several.json()["seeds"][0] == 21
    np.testing.assert_allclose(np.asarray(chunks[0]), http_actions, rtol=0, atol=ATOL)
    client._ws.close()  # openpi-client has no close of its own


def test_a_bad_observation_names_the_field_on_both_protocols(server: RunningPolicyServer) -> None:
    obs = as_json(observation(0))
    # JSON has no NaN; Python's encoder writes it anyway, and the server reads it as one.
    nan = json.dumps({"observation": {**obs, "state": [0.0, float("nan")]}})
    answer = httpx.post(f"{server.url}/actions", content=nan, headers=AUTH)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "observation.state"
    answer = _post(server, {"observations": [obs, {**obs, "images": {"top": obs["images"]["top"]}}]})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == "observations[1].images.wrist"
    assert error["type"] == "invalid_request_error" and "missing camera" in error["message"]
    for body, param in [
        ({"observation": obs, "temperature": 1}, "temperature"),
        ({"observation": obs, "seed": -1}, "seed"),
        ({"observations": [obs], "seeds": [1, 2]}, "seeds"),
        ({}, "observation"),
    ]:
        answer = _post(server, body)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text
    answer = httpx.post(f"{server.url}/actions", content=b"{not json", headers=AUTH)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_body"

    client = _client(server)
    with pytest.raises(RuntimeError) as caught:
        client.infer({**observation(0), "images": {"top": np.zeros((4, 4), np.uint8)}})
    text = str(caught.value).split("\n", 1)[1]
    assert json.loads(text)["error"]["param"] == "observation.images.top"
    assert "Traceback" not in text
    with pytest.raises(RuntimeError, match='"param": "seed"'):
        client.infer({**observation(0), "seed": "seven"})
    # The connection stays open for the next observation.
    assert client.infer({**observation(0), "seed": 1})["actions"].shape == (10, 2)
    client._ws.close()


def test_keys_are_checked(server: RunningPolicyServer) -> None:
    obs = as_json(observation(0))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        answer = _post(server, {"observation": obs}, headers)
        assert answer.status_code == 401 and answer.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{server.url}/metadata").status_code == 401
    assert httpx.get(f"{server.url}/stats", headers={"Authorization": f"Api-Key {KEY}"}).status_code == 200
    for key in (None, "wrong"):
        with pytest.raises(InvalidStatus) as caught:
            _client(server, key)
        assert caught.value.response.status_code == 401


def test_sizes_are_limited_before_parsing(server: RunningPolicyServer) -> None:
    big = b"x" * (MAX_BODY_BYTES + 1)
    answer = httpx.post(f"{server.url}/actions", content=big, headers=AUTH)
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "body_too_large"

    def chunks() -> Any:  # no Content-Length: counted as it arrives
        for _ in range(MAX_BODY_BYTES // 4096 + 2):
            yield b"x" * 4096

    answer = httpx.post(f"{server.url}/actions", content=chunks(), headers=AUTH)
    assert answer.status_code == 413

    with websockets.sync.client.connect(
        server.url.replace("http", "ws") + "/", additional_headers=AUTH, max_size=None
    ) as connection:
        msgpack_numpy.unpackb(connection.recv())  # the metadata
        connection.send(msgpack_numpy.packb({"images": {"top": np.zeros(MAX_BODY_BYTES + 1, np.uint8)}}))
        with pytest.raises(ConnectionClosed) as caught:
            connection.recv()
        assert caught.value.rcvd is not None and caught.value.rcvd.code == 1009


def test_other_endpoints_answer_json(server: RunningPolicyServer) -> None:
    assert httpx.get(f"{server.url}/healthz", headers=AUTH).json()["status"] == "ok"
    assert httpx.get(f"{server.url}/metadata", headers=AUTH).json() == server.metadata
    stats = httpx.get(f"{server.url}/stats", headers=AUTH).json()
    assert stats["requests"] >= 1 and set(stats["latency_ms"]) == {"p50", "p90", "p99"}
    assert {"requests_per_second", "clients", "batches", "mean_batch", "last_request_at"} <= set(stats)
    missing = httpx.get(f"{server.url}/nowhere", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    wrong_method = httpx.get(f"{server.url}/actions", headers=AUTH)
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def test_hostile_input_is_a_clear_400_and_leaves_later_requests_alone(server: RunningPolicyServer) -> None:
    """What a fault probe sent, each answered 500 before, after which 7-12% of that client's requests
    failed (a failure closed the keep-alive connection under the API's next request): now each is a
    400 naming what is wrong, and the same connection answers the next requests."""
    good = {"observation": as_json(observation(1)), "seed": 3}
    lone_surrogate = json.dumps({"observation": {**as_json(observation(1)), "prompt": "\ud800"}})
    deep = b'{"observation": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    hostile: list[tuple[bytes, str, str | None]] = [
        (lone_surrogate.encode(), "lone surrogate", "observation.prompt"),
        (deep, "nested too deeply", None),
        (msgpack_numpy.packb(5), "not JSON", None),  # a bare msgpack scalar, as HTTP's body
        (b"5", "must be a JSON object", None),
    ]
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as http:
        for body, words, param in hostile:
            answer = http.post("/actions", content=body, headers={"content-type": "application/json"})
            assert answer.status_code == 400, (words, answer.status_code, answer.text)
            error = answer.json()["error"]
            assert words in error["message"] and error["param"] == param, error
            assert answer.headers.get("connection") != "close"
            for _ in range(5):
                assert http.post("/actions", json=good).status_code == 200

    # And on openpi's websocket, each a text frame naming the problem; the connection stays open.
    with websockets.sync.client.connect(
        server.url.replace("http", "ws") + "/", additional_headers=AUTH, max_size=None
    ) as connection:
        msgpack_numpy.unpackb(connection.recv())  # the metadata
        scalar = {b"__npgeneric__": True, b"data": 300, b"dtype": "|u1"}
        for message, words in [
            (msgpack_numpy.packb(5), "must be an observation"),
            (b"\x91" * 100_000 + b"\x01", "not a msgpack message"),
            (msgpack_numpy.packb(scalar), "out of bounds"),
            # A lone surrogate's UTF-8 bytes in the prompt (no encoder writes them).
            (
                msgpack_numpy.packb({**observation(1), "prompt": "@@@"}).replace(
                    b"\xa3@@@", b"\xa3\xed\xa0\x80"
                ),
                "not a msgpack message",
            ),
        ]:
            connection.send(message)
            answer = connection.recv()
            assert isinstance(answer, str), message[:20]
            error = json.loads(answer)["error"]
            assert error["type"] == "invalid_request_error" and words in error["message"], error
        connection.send(msgpack_numpy.packb({**observation(1), "seed": 1}))
        assert msgpack_numpy.unpackb(connection.recv())["actions"].shape == (10, 2)
