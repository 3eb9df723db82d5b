"""Errors the engine raises for problems a user can act on.

Anything else that escapes the engine is a bug or an infrastructure fault. The worker ends a
job in `error` with ``str(error)`` for these, and goes on serving.

There is one ConfigError, the SDK's (``relay.errors.ConfigError``): the engine raises the class
that SFTConfig and SessionConfig raise, and it is an EngineError, so catching EngineError catches
a broken setting too.
"""

from __future__ import annotations

from relay.errors import ConfigError, InputError

__all__ = ["ConfigError", "DatasetError", "DiskFullError", "EngineError"]

# A problem with the user's input (dataset, config, data); the message says what to fix. It is the
# SDK's InputError, the base of ConfigError, under the name the engine's callers know.
EngineError = InputError


class DatasetError(EngineError):
    """A dataset that cannot be fetched or trained on. The message names the dataset and the field or file."""

    def __init__(self, dataset: str, problem: str) -> None:
        self.dataset = dataset
        self.problem = problem
        super().__init__(f"dataset {dataset}: {problem}")


class DiskFullError(EngineError):
    """No room on the disk for a checkpoint or the output. Retrying on the same disk fails the same
    way, so a job ends with this message at once; the last complete checkpoint is kept."""
