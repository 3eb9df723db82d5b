"""A job's files: the output (model.safetensors, configs, processors, norm stats), its checkpoints,
its closed-loop evaluations (``eval/step-N.json`` and the videos under ``eval/step-N/``), and the
TensorBoard event files of a recipe whose integrations name TensorBoard (``tensorboard/``).

Paths are relative to the job's work directory and always start with ``output/``,
``checkpoints/``, ``eval/`` or ``tensorboard/``; nothing else in the data directory can be named.
An event file grows while the job runs: a download reads a copy taken when it starts (`pin`), so
that its checksum holds. An evaluation's
files are listed once its report is written (the worker writes it last). The output's sha256 is recorded
when the job completes; a checkpoint file's is computed when first listed or downloaded and
remembered (checkpoint files never change once complete).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

from relay.events import EVAL_FILES, TENSORBOARD_FILES
from relay.http_client import sha256_of
from relay.rules import has_control_characters
from relay_api.errors import APIProblem

OUTPUT = "output"
CHECKPOINTS = "checkpoints"
EVAL = EVAL_FILES
TENSORBOARD = TENSORBOARD_FILES
CHECKPOINT_MANIFEST = "manifest.json"
PATH_MAX = 1024


def output_manifest(work_dir: Path, output_dir: Path) -> dict[str, dict[str, Any]]:
    """Every output file with its size and sha256, keyed by path relative to the work directory."""
    manifest: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in output_dir.rglob("*") if p.is_file()):
        relative = PurePosixPath(OUTPUT, *path.relative_to(output_dir).parts)
        manifest[str(relative)] = {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
    return manifest


class ChecksumCache:
    """sha256 of files that do not change once written (complete checkpoints), by inode, size and mtime."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, int, int, int], str] = {}
        self._lock = threading.Lock()

    def sha256(self, path: Path) -> str:
        stat = path.stat()
        # By inode, not name: a download reads a pinned second name of the same file (see `pin`).
        key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        with self._lock:
            known = self._known.get(key)
        if known is None:
            known = sha256_of(path)
            with self._lock:
                if len(self._known) > 10_000:
                    self._known.clear()
                self._known[key] = known
        return known


def checkpoint_files(work_dir: Path, checksums: ChecksumCache) -> list[dict[str, Any]]:
    """Files of the job's complete checkpoints (those with a manifest), oldest first, with sha256."""
    root = work_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    found: list[dict[str, Any]] = []
    for checkpoint in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            found += _files_of(checkpoint, root, checksums)
        except FileNotFoundError:  # pruned while listed: it is gone, so it is not listed
            continue
    return found


def _files_of(checkpoint: Path, root: Path, checksums: ChecksumCache) -> list[dict[str, Any]]:
    if not (checkpoint / CHECKPOINT_MANIFEST).is_file():
        return []
    files = []
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file() and not p.name.startswith(".")):
        relative = PurePosixPath(CHECKPOINTS, *path.relative_to(root).parts)
        files.append({"path": str(relative), "bytes": path.stat().st_size, "sha256": checksums.sha256(path)})
    return files


def eval_files(work_dir: Path, checksums: ChecksumCache) -> list[dict[str, Any]]:
    """The files of the job's complete evaluations (those whose report is written), oldest first:
    each report, then its videos."""
    root = work_dir / EVAL
    if not root.is_dir():
        return []
    found: list[dict[str, Any]] = []
    for report in sorted(root.glob("step-*.json")):
        videos = root / report.stem
        files = [report, *sorted(p for p in videos.glob("*") if p.is_file() and not p.name.startswith("."))]
        for path in files:
            relative = PurePosixPath(EVAL, *path.relative_to(root).parts)
            with contextlib.suppress(FileNotFoundError):
                found.append(
                    {"path": str(relative), "bytes": path.stat().st_size, "sha256": checksums.sha256(path)}
                )
    return found


def tensorboard_files(work_dir: Path, checksums: ChecksumCache) -> list[dict[str, Any]]:
    """The job's TensorBoard event files (relay_engine.trackers writes them), by name."""
    root = work_dir / TENSORBOARD
    if not root.is_dir():
        return []
    found: list[dict[str, Any]] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
        relative = PurePosixPath(TENSORBOARD, *path.relative_to(root).parts)
        with contextlib.suppress(FileNotFoundError):
            found.append(
                {"path": str(relative), "bytes": path.stat().st_size, "sha256": checksums.sha256(path)}
            )
    return found


def listing(job: dict[str, Any], work_dir: Path, checksums: ChecksumCache) -> list[dict[str, Any]]:
    outputs = [{"path": path, **meta} for path, meta in sorted((job.get("files") or {}).items())]
    found = checkpoint_files(work_dir, checksums) + eval_files(work_dir, checksums)
    return outputs + found + tensorboard_files(work_dir, checksums)


def resolve(job: dict[str, Any], work_dir: Path, path: str) -> tuple[Path, str | None]:
    """The file `path` names in the job's work directory and its sha256 if recorded; 404 otherwise."""
    if len(path) > PATH_MAX or has_control_characters(path):  # NUL and friends: no file has them
        raise APIProblem(404, f"no such file in fine-tune {job['id']}", param="path", code="not_found")
    relative = PurePosixPath(path)
    parts = relative.parts
    if (
        len(parts) < 2
        or parts[0] not in (OUTPUT, CHECKPOINTS, EVAL, TENSORBOARD)
        or relative.is_absolute()
        or any(part in ("..", ".") or part.startswith(".") for part in parts)
    ):
        raise APIProblem(404, f"no file {path} in fine-tune {job['id']}", param="path", code="not_found")
    recorded = (job.get("files") or {}).get(str(relative))
    if parts[0] == OUTPUT and recorded is None:
        # The output is served only once the job completed and recorded it.
        raise APIProblem(404, f"no file {path} in fine-tune {job['id']}", param="path", code="not_found")
    full = work_dir.joinpath(*parts)
    if parts[0] == CHECKPOINTS and not (work_dir / CHECKPOINTS / parts[1] / CHECKPOINT_MANIFEST).is_file():
        raise APIProblem(404, f"no file {path} in fine-tune {job['id']}", param="path", code="not_found")
    if parts[0] == EVAL and not (work_dir / EVAL / f"{PurePosixPath(parts[1]).stem}.json").is_file():
        raise APIProblem(404, f"no file {path} in fine-tune {job['id']}", param="path", code="not_found")
    if not full.is_file() or not full.resolve().is_relative_to(work_dir.resolve()):
        raise APIProblem(404, f"no file {path} in fine-tune {job['id']}", param="path", code="not_found")
    return full, recorded["sha256"] if recorded else None


PINS = ".pins"


def pin(work_dir: Path, full: Path, job_id: str, path: str) -> Path:
    """A second name (a hard link) for a checkpoint file, under the job's work directory, that its
    pruning cannot take away while a download reads it; the caller unlinks it when done. Without it a
    checkpoint pruned mid-download gave a 500 or a truncated body."""
    pins = work_dir / PINS
    pins.mkdir(exist_ok=True)
    _drop_stale_pins(pins)
    pinned = pins / f"{uuid.uuid4().hex}-{full.name}"
    try:
        if PurePosixPath(path).parts[0] == TENSORBOARD:
            # An event file is appended to while the job runs: a copy, which its checksum describes.
            shutil.copyfile(full, pinned)
        else:
            os.link(full, pinned)
    except FileNotFoundError:  # pruned since it was listed
        raise APIProblem(
            404, f"no file {path} in fine-tune {job_id}", param="path", code="not_found"
        ) from None
    return pinned


def unpin(pinned: Path) -> None:
    pinned.unlink(missing_ok=True)


# A pin this old was left by a download that never finished (a dropped connection, an API restart).
STALE_PIN_SECONDS = 24 * 3600


def _drop_stale_pins(pins: Path) -> None:
    now = time.time()
    for pinned in pins.iterdir():
        with contextlib.suppress(FileNotFoundError):
            if now - pinned.stat().st_ctime > STALE_PIN_SECONDS:  # a link sets ctime, not mtime
                pinned.unlink()
