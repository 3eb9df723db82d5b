"""A small real disk for the disk-full tests: a tmpfs mounted for the test, unmounted after."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(size: str) -> Iterator[Path]:
    """A tmpfs of `size` ("6m", "1m"); the test is skipped where this machine cannot mount one
    (not Linux, not root), since only a real full disk shows what a full disk does."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux; the disk-full checks need a small disk")
    mount_point = Path(tempfile.mkdtemp(prefix="relay-small-disk-"))
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)]
    mounted = subprocess.run(mount, capture_output=True, text=True)
    if mounted.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
        mount_point.rmdir()
