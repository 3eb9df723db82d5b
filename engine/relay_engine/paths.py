"""Where the engine keeps what it downloads and derives: datasets fetched from the Hub, frame indexes."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """`RELAY_CACHE_DIR` if set, else `~/.cache/relay`. Read at each call, so tests and workers can set it."""
    configured = os.environ.get("RELAY_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "relay"


def cache_dir_or_default(cache_dir: str | os.PathLike[str] | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
