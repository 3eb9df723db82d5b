"""The service's tests run against real PostgreSQL, Redis, uvicorn and Celery worker processes."""

from tests.service.fixtures import client, dataset, stack, user, worker

__all__ = ["client", "dataset", "stack", "user", "worker"]
