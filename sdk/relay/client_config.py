"""Where the SDK finds the API: its base URL and the caller's key.

In order: the arguments a caller passes, then ``RELAY_BASE_URL`` / ``RELAY_API_KEY``, then the
client file that ``relay server`` writes in its data directory. That directory is ``RELAY_HOME``,
else the user's ``~/.relay``, so the SDK and the CLI find a local server from any working
directory. An empty ``RELAY_HOME`` counts as unset.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
CLIENT_FILE = "client.json"


def data_dir() -> Path:
    """Relay's local data directory: ``RELAY_HOME`` (when not empty), else ``~/.relay``. Read at each call."""
    return Path(os.environ.get("RELAY_HOME") or Path.home() / ".relay").expanduser().absolute()


def client_file() -> Path:
    return data_dir() / CLIENT_FILE


@dataclass(frozen=True)
class ClientSettings:
    base_url: str
    api_key: str | None


def resolve(base_url: str | None = None, api_key: str | None = None) -> ClientSettings:
    saved = _read_client_file()
    url = base_url or os.environ.get("RELAY_BASE_URL") or saved.get("base_url") or DEFAULT_BASE_URL
    key = api_key or os.environ.get("RELAY_API_KEY") or saved.get("api_key")
    return ClientSettings(base_url=url.rstrip("/"), api_key=key)


def write_client_file(directory: Path, base_url: str, api_key: str) -> Path:
    """Save the local server's URL and key where `resolve` finds them (readable by the owner only)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CLIENT_FILE
    tmp = path.with_name(f".{CLIENT_FILE}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump({"base_url": base_url, "api_key": api_key}, file)
    os.replace(tmp, path)
    return path


def where_looked() -> str:
    """Where the settings came from, for an error that says why no server answered."""
    if os.environ.get("RELAY_BASE_URL"):
        return "the URL is RELAY_BASE_URL's"
    path = client_file()
    if _read_client_file().get("base_url"):
        return f"the URL is from {path}, written by the last `relay server` with this data directory"
    home = "RELAY_HOME" if os.environ.get("RELAY_HOME") else "~/.relay (RELAY_HOME is not set)"
    return (
        f"looked for a local server's {CLIENT_FILE} in {home}: no {path}; "
        "start one with `relay server`, or set RELAY_BASE_URL"
    )


def _read_client_file() -> dict[str, str]:
    path = client_file()
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in saved.items() if isinstance(v, str)} if isinstance(saved, dict) else {}
