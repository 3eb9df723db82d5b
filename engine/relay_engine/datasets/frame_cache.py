"""The frame indexes' cache (`<cache>/frames/`): what it holds, its size limit, and its pruning.

Each index is a directory keyed by its dataset's content. A new index of a dataset replaces the
dataset's older ones, and the cache is held to `RELAY_FRAME_CACHE_MAX_BYTES` by removing the
least recently used indexes. An index that a process has open (a FrameIndex holds a shared lock on
its summary file) is never removed; its last use is the time it was last opened.
`relay cache` shows the cache and prunes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

# The default limit: a few datasets' worth (an index takes about as much as the dataset's parquet files).
DEFAULT_MAX_BYTES = 64 << 30
LIMIT_VARIABLE = "RELAY_FRAME_CACHE_MAX_BYTES"
_SUMMARY = "summary.json"
_SOURCE = "source.json"
_LAST_USED = "last_used"


def limit_bytes() -> int:
    """RELAY_FRAME_CACHE_MAX_BYTES (0: no limit), read at each call; the default, 64 GiB."""
    configured = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not configured:
        return DEFAULT_MAX_BYTES
    try:
        value = int(configured)
    except ValueError:
        raise ValueError(
            f"bad {LIMIT_VARIABLE}: {configured!r} (must be a whole number of bytes; 0: no limit)"
        ) from None
    if value < 0:
        raise ValueError(f"bad {LIMIT_VARIABLE}: {value} (must be 0 or more; 0: no limit)")
    return value


@dataclass(frozen=True)
class Entry:
    path: Path
    dataset: str
    root: str
    bytes: int
    last_used: float


def entries(cache: Path) -> list[Entry]:
    """Every complete index in the cache, least recently used first."""
    frames = cache / "frames"
    found = []
    for path in frames.iterdir() if frames.is_dir() else []:
        if path.name.startswith(".") or not (path / _SUMMARY).is_file():
            continue
        try:
            source = json.loads((path / _SOURCE).read_text())
        except (OSError, ValueError):
            source = {}
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        used = path / _LAST_USED
        last_used = used.stat().st_mtime if used.exists() else (path / _SUMMARY).stat().st_mtime
        found.append(Entry(path, source.get("dataset", "?"), source.get("root", ""), size, last_used))
    return sorted(found, key=lambda entry: entry.last_used)


def hold(directory: Path) -> int | None:
    """Note that the index is being used now, and hold it (a shared lock) until the returned
    descriptor is closed."""
    with contextlib.suppress(OSError):  # a read-only cache is used as it is
        (directory / _LAST_USED).touch()
    try:
        descriptor = os.open(directory / _SUMMARY, os.O_RDONLY)
    except OSError:
        return None
    fcntl.flock(descriptor, fcntl.LOCK_SH)
    return descriptor


def remove(entry: Entry) -> bool:
    """Remove an index nobody has open; False (and nothing removed) if one is open."""
    return remove_unless_open(entry.path, entry.path / _SUMMARY)


def remove_unless_open(path: Path, lock_file: Path) -> bool:
    """Remove a cache directory unless a process holds a lock on its `lock_file` (it has it open);
    False (and nothing removed) then. Renamed away first, so a reader never finds half of it under
    its name."""
    try:
        descriptor = os.open(lock_file, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return False
    try:
        doomed = path.with_name(f".removing-{path.name}-{time.monotonic_ns()}")
        os.rename(path, doomed)
    except OSError:
        os.close(descriptor)
        return False
    os.close(descriptor)
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def prune(cache: Path, limit: int, keep: Path | None = None) -> list[Entry]:
    """Remove least recently used indexes (not `keep`, none in use) until the cache is within
    `limit` bytes (0: no limit); returns what was removed."""
    if limit <= 0:
        return []
    found = entries(cache)
    total = sum(entry.bytes for entry in found)
    removed = []
    for entry in found:
        if total <= limit:
            break
        if keep is not None and entry.path == keep:
            continue
        if remove(entry):
            removed.append(entry)
            total -= entry.bytes
    return removed


def remove_older_copies(cache: Path, current: Path) -> list[Entry]:
    """Remove the indexes of the dataset `current` was built from, other than `current`: its
    content changed, so they will not be read again."""
    try:
        root = json.loads((current / _SOURCE).read_text())["root"]
    except (OSError, ValueError, KeyError):
        return []
    return [
        entry for entry in entries(cache) if entry.root == root and entry.path != current and remove(entry)
    ]
