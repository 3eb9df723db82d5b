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
    """A dataset that cannot be fetched or trained on. The message names the dataset and the field or file.

    `reason` says which kind of problem it is, for an answer that depends on it (the API's status):
    `refused` (the dataset is there, and Relay does not read it as it is), `not_found` (no such
    directory or Hub repo), `no_such_revision` (the Hub repo has no such branch, tag or commit),
    `bad_name` (neither a Hub repo id nor a local directory) or `unavailable` (the Hub cannot be
    reached, or answered an error, or the cache cannot be written)."""

    REFUSED = "refused"
    NOT_FOUND = "not_found"
    NO_SUCH_REVISION = "no_such_revision"
    BAD_NAME = "bad_name"
    UNAVAILABLE = "unavailable"

    def __init__(self, dataset: str, problem: str, *, reason: str = REFUSED) -> None:
        self.dataset = dataset
        self.problem = problem
        self.reason = reason
        super().__init__(f"dataset {dataset}: {problem}")


class DiskFullError(EngineError):
    """No room on the disk for a checkpoint or the output. Retrying on the same disk fails the same
    way, so a job ends with this message at once; the last complete checkpoint, if any, is kept."""
