from tests.service.fixtures import dataset, stack, user, worker

__all__ = ["dataset", "stack", "user", "worker"]
