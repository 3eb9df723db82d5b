"""SDK tests that need the service use the same real stack as tests/service."""

from tests.service.fixtures import client, dataset, stack, user, worker

__all__ = ["client", "dataset", "stack", "user", "worker"]
