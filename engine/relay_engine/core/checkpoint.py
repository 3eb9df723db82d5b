"""Checkpoints that are either complete or absent.

A checkpoint is a directory written under a temporary name, flushed to disk (every file, then the
directory), renamed into place, and only then recorded in the `latest` pointer, itself replaced
atomically. A crash at any moment leaves the previous checkpoint and pointer intact; a reader
trusts only what the pointer names and whose manifest lists every file at its recorded size.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from relay.events import checkpoint_dir
from relay_engine.errors import DiskFullError

MANIFEST = "manifest.json"
POINTER = "latest"
# A temporary directory this old was left by a writer that died; younger ones may belong to a
# writer still at work (a second attempt of the same job), so they are left alone.
STALE_TMP_SECONDS = 3600
# A checkpoint is not started unless the disk has this much more than the last one took.
FREE_SPACE_MARGIN = 1.1
# Not failures of a write: a stop asked of the process, which must go on as it is.
_NOT_WRITE_FAILURES = (KeyboardInterrupt, SystemExit, GeneratorExit)
# With this little left after a failed write, the disk is taken to be full (torch reports a full
# disk as "unexpected pos ...", not as ENOSPC).
NEARLY_FULL_BYTES = 16 << 20
# A temporary directory's name says which attempt (of a service's job) writes it: `.tmp-a3-step-...`.
# Names without one (`.tmp-step-...`) are of attempt 0: a local run, or a store older than the naming.
_TMP_ATTEMPT = re.compile(r"\.tmp-a(\d+)-")


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _causes(error: BaseException) -> Iterator[BaseException]:
    """`error` and what lies under it: its causes and contexts, and the failures each rank reported
    to torch's CheckpointException (its `failures`: rank -> (exception, traceback))."""
    seen: set[int] = set()
    waiting = [error]
    while waiting:
        cause = waiting.pop()
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        yield cause
        waiting.extend(c for c in (cause.__cause__, cause.__context__) if c is not None)
        failures = getattr(cause, "failures", None)
        if isinstance(failures, dict):
            waiting.extend(f[0] for f in failures.values() if isinstance(f, tuple) and f)


def _is_disk_full(error: BaseException, free: int) -> bool:
    if any(isinstance(c, OSError) and c.errno == errno.ENOSPC for c in _causes(error)):
        return True
    return free < NEARLY_FULL_BYTES


def _root_cause(error: BaseException) -> BaseException:
    """The deepest failure under `error` (what a rank's writer raised), for a message in its words."""
    return list(_causes(error))[-1]


class CheckpointWriteError(RuntimeError):
    """A checkpoint write failed (not for a full disk). torch's CheckpointException derives from
    BaseException, which `except Exception` misses: converted here, where checkpoints are written,
    so that every caller sees the failure as an ordinary error with the writer's own reason."""


def _disk_full_message(root: Path, needed: int, free: int, before: bool, kept: bool) -> str:
    """What a full disk cost, in words: `kept` says whether a complete checkpoint remains (there is
    none while the first one is written, and then nothing is kept to resume from)."""
    gib = 1 << 30
    when = "cannot write a checkpoint" if before else "the disk filled up while writing a checkpoint"
    what_remains = (
        "the last complete checkpoint is kept"
        if kept
        else "no checkpoint is complete yet (this was the first), so there is none to resume from"
    )
    return (
        f"no space left on device at {root}: {when} (a checkpoint needs about {needed / gib:.2f} GB, "
        f"{free / gib:.2f} GB free); {what_remains}"
    )


def temporary_attempt(name: str) -> int:
    """The attempt that writes the temporary directory `name` (0 when its name does not say)."""
    found = _TMP_ATTEMPT.match(name)
    return int(found.group(1)) if found else 0


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that readers see the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    _fsync_path(path.parent)


def write_whole(output_dir: Path, write: Callable[[Path], None]) -> None:
    """`write(directory)` into a directory beside `output_dir`, then renamed into place: a new
    output appears whole. Into an existing one (a local run's directory, which also holds its
    checkpoints, or the output of an attempt that finished writing but not reporting) each file
    and folder is replaced whole."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = output_dir.with_name(f".{output_dir.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        if output_dir.exists():
            for path in sorted(tmp.iterdir()):
                target = output_dir / path.name
                if path.is_dir() and target.is_dir():
                    shutil.rmtree(target)
                os.replace(path, target)
            tmp.rmdir()
        else:
            os.rename(tmp, output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class CheckpointStore:
    """The checkpoints of one run, in `root`, named `step-00001000` and so on.

    `attempt` is the writer's fencing token (a service job's attempt; 0 for a local run): it names
    this writer's temporary directories, so that tidying up can spare those of a newer attempt."""

    def __init__(self, root: Path, keep_last: int = 2, attempt: int = 0) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        self.attempt = attempt

    @staticmethod
    def name_of(step: int) -> str:
        return checkpoint_dir(step)

    def save(self, step: int, write_files: Callable[[Path], None], meta: dict[str, object]) -> Path:
        """Write a checkpoint: `write_files(dir)` fills a fresh directory; `meta` goes in its manifest.
        Raises DiskFullError, before writing when the last checkpoint's size is not free, or when
        the disk fills up meanwhile; the last complete checkpoint stays as it was."""
        tmp = self.begin(step)
        try:
            write_files(tmp)
        except BaseException as error:
            self.abandon(tmp, error)
            raise
        return self.commit(step, tmp, meta)

    def begin(self, step: int) -> Path:
        """A fresh temporary directory for the checkpoint of `step` (to fill, then `commit`); DiskFullError
        when the disk has less room than the last checkpoint took."""
        self.root.mkdir(parents=True, exist_ok=True)
        needed = self._expected_bytes()
        free = shutil.disk_usage(self.root).free
        if needed is not None and free < needed * FREE_SPACE_MARGIN:
            raise DiskFullError(_disk_full_message(self.root, needed, free, before=True, kept=True))
        tmp = self.root / f".tmp-a{self.attempt}-{self.name_of(step)}-{uuid.uuid4().hex}"
        tmp.mkdir()
        return tmp

    def abandon(self, tmp: Path, error: BaseException, remove: bool = True) -> None:
        """A write into `tmp` failed with `error`: remove the partial directory (unless not `remove`:
        another process of the group does), and raise what the caller should see instead, if not
        `error` itself: DiskFullError when the disk is full (torch says "unexpected pos ..."),
        CheckpointWriteError for a failure torch raised as a BaseException. A stop (KeyboardInterrupt,
        SystemExit) and ordinary errors are left as they are."""
        if isinstance(error, _NOT_WRITE_FAILURES):
            if remove:
                shutil.rmtree(tmp, ignore_errors=True)
            return
        written = _bytes_under(tmp) if tmp.exists() else 0
        free = shutil.disk_usage(self.root).free  # before the partial files' space comes back
        if remove:
            shutil.rmtree(tmp, ignore_errors=True)
        if _is_disk_full(error, free):
            needed = max(self._expected_bytes() or 0, written)
            kept = bool(self.complete())  # none while the first checkpoint is written
            message = _disk_full_message(self.root, needed, free, before=False, kept=kept)
            raise DiskFullError(message) from error
        if not isinstance(error, Exception):
            cause = _root_cause(error)
            raise CheckpointWriteError(
                f"the checkpoint write into {self.root} failed: {type(cause).__name__}: {cause}"
            ) from error

    def commit(self, step: int, tmp: Path, meta: dict[str, object]) -> Path:
        """Seal a filled temporary directory: manifest, fsync, rename into place, then the pointer.

        Files may sit one level down (a sharded checkpoint's per-rank files); the manifest lists
        them by their path relative to the checkpoint.
        """
        final = self.root / self.name_of(step)
        try:
            files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
            manifest = {"step": step, "files": files, **meta}
            try:
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
            except OSError as error:
                self.abandon(tmp, error)
                raise
            for path in sorted(tmp.rglob("*"), reverse=True):  # files before their directories
                _fsync_path(path)
            _fsync_path(tmp)
            if final.exists():  # a re-run of the same step (after a resume) replaces it whole
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_path(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        write_atomic(self.root / POINTER, final.name.encode())
        self._prune(keep=final.name)
        return final

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None.

        The pointer is written after the rename that seals a checkpoint, so a process killed between
        the two leaves a sealed checkpoint newer than the pointer: it is whole (its manifest says
        so), and resuming from the pointer instead would redo steps for nothing. A pointer that names
        an incomplete checkpoint means the disk lost what was sealed, which is raised, not skipped."""
        pointer = self.root / POINTER
        if pointer.exists():
            named = self.root / pointer.read_text().strip()
            if not self.is_complete(named):
                raise RuntimeError(f"checkpoint pointer names {named}, which is incomplete")
        complete = self.complete()
        return complete[-1] if complete else None

    @staticmethod
    def is_complete(path: Path) -> bool:
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            return False
        manifest = json.loads(manifest_path.read_text())
        return all(
            (path / name).is_file() and (path / name).stat().st_size == size
            for name, size in manifest["files"].items()
        )

    @staticmethod
    def manifest(path: Path) -> dict[str, Any]:
        return dict(json.loads((path / MANIFEST).read_text()))

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(
            p
            for p in self.root.iterdir()
            if p.is_dir() and p.name.startswith("step-") and self.is_complete(p)
        )

    def _expected_bytes(self) -> int | None:
        """About how much the next checkpoint takes: as much as the last one."""
        try:
            latest = self.latest()
        except (OSError, RuntimeError, ValueError):
            return None
        return None if latest is None else _bytes_under(latest)

    def remove_temporaries(self) -> list[Path]:
        """Remove the leftovers of interrupted writes of this attempt and of older ones, however
        young; never a newer attempt's. Attempts are fencing tokens: an older attempt may still be
        at work (a frozen worker that has not yet noticed it lost the job), but its writes no longer
        count, so removing them is safe. A newer attempt's temporaries are the live writes of the job's
        owner, and this attempt may be the frozen one that woke up: whatever the order in which the
        two run, sparing every higher number is what keeps the owner's write whole."""
        if not self.root.is_dir():
            return []
        removed = [
            path
            for path in self.root.iterdir()
            if path.name.startswith(".tmp-") and temporary_attempt(path.name) <= self.attempt
        ]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def _prune(self, keep: str) -> None:
        """Drop stale leftovers of interrupted writes and all but the newest `keep_last` checkpoints."""
        now = time.time()
        for path in self.root.iterdir():
            if path.name.startswith(".tmp-") and now - path.stat().st_mtime > STALE_TMP_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
        complete = [p for p in self.complete() if p.name != keep]
        for path in complete[: max(0, len(complete) - (self.keep_last - 1))]:
            shutil.rmtree(path, ignore_errors=True)
