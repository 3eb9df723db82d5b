"""Where the SDK finds the API and its key, and what it says when it cannot talk to one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relay import client_config as _config
from relay.errors import APIError
from relay.http_client import Client


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("RELAY_BASE_URL", "RELAY_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "relay-home"
    monkeypatch.setenv("RELAY_HOME", str(home))
    return home


def test_the_local_client_file_is_read(clean_env: Path) -> None:
    path = _config.write_client_file(clean_env, "http://127.0.0.1:9999", "relay-local")
    assert path == clean_env / "client.json" and (path.stat().st_mode & 0o777) == 0o600
    assert _config.resolve() == _config.ClientSettings("http://127.0.0.1:9999", "relay-local")


def test_environment_variables_win_over_the_file(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _config.write_client_file(clean_env, "http://127.0.0.1:9999", "relay-local")
    monkeypatch.setenv("RELAY_BASE_URL", "https://relay.example.com/")
    monkeypatch.setenv("RELAY_API_KEY", "relay-env")
    assert _config.resolve() == _config.ClientSettings("https://relay.example.com", "relay-env")
    assert _config.resolve("http://other", "relay-arg") == _config.ClientSettings("http://other", "relay-arg")


def test_without_anything_the_default_url_and_no_key(clean_env: Path) -> None:
    assert _config.resolve() == _config.ClientSettings(_config.DEFAULT_BASE_URL, None)
    (clean_env).mkdir()
    (clean_env / "client.json").write_text(json.dumps(["not", "an", "object"]))
    assert _config.resolve().api_key is None


def test_no_key_is_a_clear_error_before_any_request() -> None:
    with pytest.raises(APIError, match=r"^GET /v1/fine-tunes: no API key: set RELAY_API_KEY, or start"):
        Client().request("GET", "/v1/fine-tunes")


def test_an_unreachable_api_is_a_clear_error() -> None:
    client = Client("http://127.0.0.1:9", "relay-x", max_retries=0)
    with pytest.raises(APIError, match=r"^GET /v1/fine-tunes: cannot reach http://127.0.0.1:9") as caught:
        client.request("GET", "/v1/fine-tunes")
    assert isinstance(caught.value, RuntimeError) and caught.value.status is None
