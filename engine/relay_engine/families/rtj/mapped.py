"""Arrays written once to files named by their content and opened memory-mapped.

A sampler's per-row arrays (cells, times, parents, children, the text embeddings) grow with the
database; opened from files with `np.load(mmap_mode="r")` they take no worker memory of their own:
the pages a walk touches are read from the file as needed and the system can drop them again.
The directory is named by a digest of every array's name, dtype, shape and bytes, so the same
database, task and settings find the files already written, and two processes writing the same
arrays do not disturb each other (each writes aside, then renames). The directory's last use is
noted (paths.note_use), and its `complete` file is held (a shared lock) while the files are opened,
so that `relay cache prune` removes the least recently used and never one being opened; once open,
a map outlives its file's removal.

A database's tables can be mapped the same way (`memory_mapped_table`): each is decoded once into
an Arrow IPC file, which pyarrow opens without copying, so `Table.data` is a pyarrow Table whose
buffers lie in the mapped file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from relay_engine.paths import note_use

FORMAT = b"relay-rtj-mapped-1"  # change it when what the files mean changes
COMPLETE_FILE = "complete"  # written last: the directory holds every array


def memory_mapped(arrays: dict[str, np.ndarray], root: Path) -> dict[str, np.ndarray]:
    """The arrays, over read-only memory maps of .npy files under `root` (empty arrays, which cannot
    be mapped, stay as they are). Names must be usable as file names.

    Each is a plain ndarray view of its np.memmap (`is_memory_mapped` tells): np.memmap indexes
    through Python code, which a walk that indexes thousands of times a second would feel."""
    contiguous = {name: np.ascontiguousarray(array) for name, array in arrays.items()}
    directory = root / _digest(contiguous)
    while True:
        if not (directory / COMPLETE_FILE).exists():
            _write(contiguous, directory)
        try:
            held = os.open(directory / COMPLETE_FILE, os.O_RDONLY)
        except FileNotFoundError:
            continue  # pruned between the two looks: written again
        try:
            fcntl.flock(held, fcntl.LOCK_SH)
            if not (directory / COMPLETE_FILE).exists():
                continue  # pruned before the lock was ours
            note_use(directory)
            return {
                name: np.load(directory / f"{name}.npy", mmap_mode="r").view(np.ndarray)
                if array.size
                else array
                for name, array in contiguous.items()
            }
        finally:
            os.close(held)


def is_memory_mapped(array: np.ndarray) -> bool:
    """Whether the array's memory is a memory-mapped file (it or an array it views is a np.memmap)."""
    current: object = array
    while isinstance(current, np.ndarray):
        if isinstance(current, np.memmap):
            return True
        current = current.base
    return False


def _digest(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256(FORMAT)
    for name in sorted(arrays):
        array = arrays[name]
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.data)  # (contiguous: no copy)
    return digest.hexdigest()[:32]


def _write(arrays: dict[str, np.ndarray], directory: Path) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    aside = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".writing-"))
    try:
        for name, array in arrays.items():
            np.save(aside / f"{name}.npy", array)
        (aside / COMPLETE_FILE).touch()
        os.replace(aside, directory)
    except OSError:
        if not (directory / COMPLETE_FILE).exists():
            raise
    finally:  # another process may have renamed the same arrays into place first
        shutil.rmtree(aside, ignore_errors=True)


TABLE_FORMAT = b"relay-rtj-table-1"


def memory_mapped_table(source: Path, read: Callable[[Path], pa.Table], root: Path) -> pa.Table:
    """The table in the file `source` (as `read` decodes it), over a read-only memory map of an
    Arrow IPC copy under `root`: its columns' buffers are pages of that file, not worker memory.

    The copy is written on the first open and named by the source's path, size and modification
    time, so a changed file is decoded again; written aside, then renamed, as the arrays are."""
    status = source.stat()
    digest = hashlib.sha256(TABLE_FORMAT)
    digest.update(f"{source.resolve()}|{status.st_size}|{status.st_mtime_ns}".encode())
    copy = root / f"{digest.hexdigest()[:32]}.arrow"
    if not copy.exists():
        table = read(source)
        root.mkdir(parents=True, exist_ok=True)
        handle, aside = tempfile.mkstemp(dir=root, prefix=".writing-", suffix=".arrow")
        os.close(handle)
        try:
            with pa.OSFile(aside, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            os.replace(aside, copy)
        finally:
            Path(aside).unlink(missing_ok=True)
    else:
        with contextlib.suppress(OSError):  # its last use, for `relay cache prune`
            os.utime(copy)
    with pa.memory_map(str(copy), "r") as mapped:  # (the table's buffers keep the map open)
        return pa.ipc.open_file(mapped).read_all()
