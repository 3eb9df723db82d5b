"""Checkpoints that are either complete or absent.

A checkpoint is a directory written under a temporary name, flushed to disk (every file, then the
directory), renamed into place, and only then recorded in the `latest` pointer, itself replaced
atomically. A crash at any moment leaves the previous checkpoint and pointer intact; a reader
trusts only what the pointer names and whose manifest lists every file at its recorded size.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

MANIFEST = "manifest.json"
POINTER = "latest"
# A temporary directory this old was left by a writer that died; younger ones may belong to a
# writer still at work (a second attempt of the same job), so they are left alone.
STALE_TMP_SECONDS = 3600


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


class CheckpointStore:
    """The checkpoints of one run, in `root`, named `step-00001000` and so on."""

    def __init__(self, root: Path, keep_last: int = 2) -> None:
        self.root = Path(root)
        self.keep_last = keep_last

    @staticmethod
    def name_of(step: int) -> str:
        return f"step-{step:08d}"

    def save(self, step: int, write_files: Callable[[Path], None], meta: dict[str, object]) -> Path:
        """Write a checkpoint: `write_files(dir)` fills a fresh directory; `meta` goes in its manifest."""
        tmp = self.begin(step)
        try:
            write_files(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self.commit(step, tmp, meta)

    def begin(self, step: int) -> Path:
        """A fresh temporary directory for the checkpoint of `step` (to fill, then `commit`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{self.name_of(step)}-{uuid.uuid4().hex}"
        tmp.mkdir()
        return tmp

    def commit(self, step: int, tmp: Path, meta: dict[str, object]) -> Path:
        """Seal a filled temporary directory: manifest, fsync, rename into place, then the pointer.

        Files may sit one level down (a sharded checkpoint's per-rank files); the manifest lists
        them by their path relative to the checkpoint.
        """
        final = self.root / self.name_of(step)
        try:
            files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
            manifest = {"step": step, "files": files, **meta}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
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
        """The last complete checkpoint, or None."""
        pointer = self.root / POINTER
        if not pointer.exists():
            return None
        path = self.root / pointer.read_text().strip()
        if not self.is_complete(path):
            raise RuntimeError(f"checkpoint pointer names {path}, which is incomplete")
        return path

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
    def manifest(path: Path) -> dict[str, object]:
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

    def _prune(self, keep: str) -> None:
        """Drop stale leftovers of interrupted writes and all but the newest `keep_last` checkpoints."""
        now = time.time()
        for path in self.root.iterdir():
            if path.name.startswith(".tmp-") and now - path.stat().st_mtime > STALE_TMP_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
        complete = [p for p in self.complete() if p.name != keep]
        for path in complete[: max(0, len(complete) - (self.keep_last - 1))]:
            shutil.rmtree(path, ignore_errors=True)
