"""One torch thread for these tests: their tensors are tiny, and on a shared 2-core machine
threads waiting on each other cost more than they bring (about 3x slower under load)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
