"""Collecting the problems found in a dataset, so that `check` can print every one of them.

A broken dataset often breaks the same way in every episode; after a few examples of one kind, the
rest are counted instead of listed.
"""

from __future__ import annotations

from collections import Counter

from relay_engine.errors import DatasetError

EXAMPLES_PER_KIND = 3


class Problems:
    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self._messages: list[str] = []
        self._seen: Counter[str] = Counter()

    def add(self, message: str, *, kind: str | None = None) -> None:
        """Record a problem. Messages of the same `kind` past the first few are only counted."""
        kind = kind or message
        self._seen[kind] += 1
        if self._seen[kind] <= EXAMPLES_PER_KIND:
            self._messages.append(message)

    def __bool__(self) -> bool:
        return bool(self._seen)

    def messages(self) -> list[str]:
        hidden = [(kind, count - EXAMPLES_PER_KIND) for kind, count in self._seen.items()]
        more = [f"... and {n} more like that ({kind})" for kind, n in hidden if n > 0]
        return self._messages + more

    def raise_if_any(self) -> None:
        if self:
            raise DatasetError(self.dataset, "; ".join(self.messages()))
