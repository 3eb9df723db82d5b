"""Errors the engine raises for problems a user can act on.

Anything else that escapes the engine is a bug or an infrastructure fault. The worker ends a
job in `error` with ``str(error)`` for these, and goes on serving.
"""

from __future__ import annotations


class EngineError(Exception):
    """A problem with the user's input (dataset, config, data); the message says what to fix."""


class DatasetError(EngineError):
    """A dataset that cannot be fetched or trained on. The message names the dataset and the field or file."""

    def __init__(self, dataset: str, problem: str) -> None:
        self.dataset = dataset
        self.problem = problem
        super().__init__(f"dataset {dataset}: {problem}")


class ConfigError(EngineError, ValueError):
    """A setting the engine cannot honour (an unknown target, a camera map that does not fit)."""


class DiskFullError(EngineError):
    """No room on the disk for a checkpoint or the output. Retrying on the same disk fails the same
    way, so a job ends with this message at once; the last complete checkpoint is kept."""
