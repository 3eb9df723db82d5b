"""Where the engine keeps what it downloads and derives: datasets fetched from the Hub, frame indexes."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

# In a directory of the cache, a file whose modification time is when the directory was last used.
LAST_USED_FILE = "last_used"


def default_cache_dir() -> Path:
    """`RELAY_CACHE_DIR` if set, else `~/.cache/relay`. Read at each call, so tests and workers can set it."""
    configured = os.environ.get("RELAY_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "relay"


def cache_dir_or_default(cache_dir: str | os.PathLike[str] | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def note_use(directory: Path) -> None:
    """Mark a directory of the cache as used now: `relay cache` shows it, and pruning by last use
    reads it. A read-only cache is used as it is."""
    with contextlib.suppress(OSError):
        (directory / LAST_USED_FILE).touch()
