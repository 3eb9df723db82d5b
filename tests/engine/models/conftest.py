"""One torch thread for these tests (tests/engine/conftest.py:one_torch_thread): their tensors are
tiny, and on a shared 2-core machine threads waiting on each other cost more than they bring."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """Every test of this folder on one torch thread."""
