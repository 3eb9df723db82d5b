"""The service's tests run against real PostgreSQL, Redis, uvicorn and Celery worker processes."""

from tests.service.fixtures import (
    alice,
    browser,
    client,
    dataset,
    parked,
    stack,
    user,
    video_dataset,
    worker,
)

__all__ = ["alice", "browser", "client", "dataset", "parked", "stack", "user", "video_dataset", "worker"]
