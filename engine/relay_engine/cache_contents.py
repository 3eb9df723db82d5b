"""What the engine keeps in its cache, by kind, and how each kind may go; `relay cache` shows it.

    frames/<key>/                    frame indexes of LeRobot datasets (datasets/frame_cache.py)
    rtj-contexts/<digest>/*.npy      an RT-J sampler's memory-mapped arrays (families/rtj/mapped.py)
    rtj-tables/<digest>.arrow        a database table's memory-mapped Arrow copy (the same module)
    relbench/<name>/                 RelBench datasets converted to Relay's layout (relbench_source.py)
    databases/<key>/<stamp>-<id>/    snapshots of SQL databases (families/rtj/database.py)

Frame indexes, context arrays, table copies and RelBench conversions are made again when missing, so
they share one size limit and go least recently used first. A snapshot cannot be made again (the database has
changed since), and a model trained on one serves from it (its config's `relay.dataset`), so
snapshots go only when asked, by how long they have gone unused.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from relay_engine.datasets import frame_cache
from relay_engine.families.rtj.database import RELBENCH_MARKER_FILE, read_snapshot_record
from relay_engine.families.rtj.mapped import COMPLETE_FILE
from relay_engine.paths import LAST_USED_FILE

FRAME_INDEX = "frame index"
CONTEXTS = "rtj contexts"
TABLE_COPY = "rtj table copy"
RELBENCH = "relbench"
SNAPSHOT = "database snapshot"
SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class CacheEntry:
    """One thing in the cache: its kind, what it holds (in words), its size and last use (epoch
    seconds), and how to remove it (False when it is in use, and then nothing is removed)."""

    kind: str
    path: Path
    description: str
    bytes: int
    last_used: float
    remove: Callable[[], bool]


def frame_indexes(cache: Path) -> list[CacheEntry]:
    return [
        CacheEntry(FRAME_INDEX, e.path, e.dataset, e.bytes, e.last_used, partial(frame_cache.remove, e))
        for e in frame_cache.entries(cache)
    ]


def context_arrays(cache: Path) -> list[CacheEntry]:
    found = []
    for path in _children(cache / "rtj-contexts"):
        if not (path / COMPLETE_FILE).is_file():
            continue  # being written
        arrays = sum(1 for p in path.glob("*.npy"))
        found.append(
            CacheEntry(
                CONTEXTS,
                path,
                f"{arrays} arrays of a context sampler",
                _size(path),
                _last_used(path, path / COMPLETE_FILE),
                partial(frame_cache.remove_unless_open, path, path / COMPLETE_FILE),
            )
        )
    return found


def table_copies(cache: Path) -> list[CacheEntry]:
    """Arrow copies of database tables. One already mapped stays readable after its removal (the
    map holds the file's pages), and the next open writes it again."""
    folder = cache / "rtj-tables"
    copies = sorted(folder.glob("[!.]*.arrow")) if folder.is_dir() else []
    return [
        CacheEntry(
            TABLE_COPY,
            path,
            "a database table, decoded for memory-mapping",
            path.stat().st_size,
            path.stat().st_mtime,  # (its opener touches it: the last use)
            partial(_remove_file, path),
        )
        for path in copies
    ]


def relbench_conversions(cache: Path) -> list[CacheEntry]:
    found = []
    for path in _children(cache / "relbench"):
        marker = path / RELBENCH_MARKER_FILE
        if not marker.is_file():
            continue
        found.append(
            CacheEntry(
                RELBENCH,
                path,
                _relbench_description(marker),
                _size(path),
                _last_used(path, marker),
                partial(_remove, path),
            )
        )
    return found


def snapshots(cache: Path) -> list[CacheEntry]:
    found = []
    for folder in _children(cache / "databases"):
        for path in _children(folder):
            snapshot = read_snapshot_record(path)
            if snapshot is None:
                continue
            rows = ", ".join(f"{table} {count:,}" for table, count in snapshot.row_counts.items())
            found.append(
                CacheEntry(
                    SNAPSHOT,
                    path,
                    f"{snapshot.source}, taken {snapshot.taken_at}; rows: {rows}",
                    _size(path),
                    _last_used(path, path / "snapshot.json"),
                    partial(_remove, path),
                )
            )
    return found


def remade_when_missing(cache: Path) -> list[CacheEntry]:
    """Frame indexes, context arrays, table copies and RelBench conversions, least recently used first."""
    found = frame_indexes(cache) + context_arrays(cache) + table_copies(cache) + relbench_conversions(cache)
    return sorted(found, key=lambda entry: entry.last_used)


def everything(cache: Path) -> list[CacheEntry]:
    """Every entry of every kind, least recently used first."""
    return sorted(remade_when_missing(cache) + snapshots(cache), key=lambda entry: entry.last_used)


def prune_to_size(cache: Path, limit: int) -> list[CacheEntry]:
    """Remove frame indexes, context arrays and RelBench conversions, least recently used first and
    none in use, until they take at most `limit` bytes (0: all that are not in use). Snapshots stay."""
    found = remade_when_missing(cache)
    total = sum(entry.bytes for entry in found)
    removed = []
    for entry in found:
        if total <= limit:
            break
        if entry.remove():
            removed.append(entry)
            total -= entry.bytes
    return removed


def prune_snapshots(cache: Path, unused_days: float, now: float | None = None) -> list[CacheEntry]:
    """Remove the database snapshots nobody has opened (nor taken) for `unused_days` days or more."""
    cutoff = (time.time() if now is None else now) - unused_days * SECONDS_PER_DAY
    return [entry for entry in snapshots(cache) if entry.last_used <= cutoff and entry.remove()]


def _relbench_description(marker: Path) -> str:
    """The RelBench name a conversion was made from, as its marker file records it."""
    try:
        made_from = json.loads(marker.read_text())
        dataset, tasks = str(made_from["dataset"]), [str(task) for task in made_from["tasks"]]
    except (OSError, ValueError, KeyError, TypeError):
        return "a RelBench conversion"
    return f"relbench:{dataset}" + (f" (tasks: {', '.join(tasks)})" if tasks else " (all its tasks)")


def _children(directory: Path) -> Iterable[Path]:
    """The entries of a cache folder, without the ones being written or removed (dot names)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _last_used(path: Path, made: Path) -> float:
    """When it was last opened (its last_used file), else when it was made."""
    for candidate in (path / LAST_USED_FILE, made):
        with contextlib.suppress(OSError):
            return candidate.stat().st_mtime
    return 0.0


def _remove(path: Path) -> bool:
    """Rename the directory away, then delete it: a reader never finds half of it under its name."""
    doomed = path.with_name(f".removing-{path.name}-{time.monotonic_ns()}")
    try:
        os.rename(path, doomed)
    except OSError:
        return False
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def _remove_file(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:
        return False
    return True
