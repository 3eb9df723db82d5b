"""A hash table from non-negative int64 keys to int64 values, looked up and filled many keys at a
time with numpy.

The context walk asks, for tens of thousands of (context, row) pairs at once, whether each was
reached already and as which node. A sorted array answers with a binary search per key (and a
re-sort per insert); this table answers with one multiply, one shift and one gather for most keys:
open addressing with linear probing, at most half full, so that a key's probe sequence is short and
the keys still probing after a round are few. Its memory follows the number of keys, not the number
of rows in the database.
"""

from __future__ import annotations

import numpy as np

_EMPTY = -1
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio, odd: multiplicative hashing
_MIN_BITS = 10


class PairTable:
    """Non-negative int64 keys, each with an int64 value; -1 marks an empty slot."""

    def __init__(self, expected: int = 0) -> None:
        self._allocate(max(_MIN_BITS, (2 * max(expected, 1) - 1).bit_length()))
        self.count = 0

    def _allocate(self, bits: int) -> None:
        self.bits = bits
        self.keys = np.full(1 << bits, _EMPTY, np.int64)
        self.values = np.zeros(1 << bits, np.int64)

    def _home(self, keys: np.ndarray) -> np.ndarray:
        """Each key's first slot: the top bits of key x 2^64/phi (keys that differ in any bit spread)."""
        with np.errstate(over="ignore"):
            # (a view, not a copy: the keys are non-negative; the slots index as they are, uint64)
            return (np.asarray(keys, np.int64).view(np.uint64) * _FIBONACCI) >> np.uint64(64 - self.bits)

    def slots(self, keys: np.ndarray) -> np.ndarray:
        """Each key's slot, -1 where the key is not in the table."""
        home = self._home(keys)
        held = self.keys[home]
        hit = held == keys
        probing = np.flatnonzero(~hit & (held != _EMPTY))  # (the few whose home holds another key)
        mask = np.uint64(len(self.keys) - 1)
        slot = (home[probing] + np.uint64(1)) & mask
        found = np.where(hit, home.view(np.int64), -1)
        while len(probing):
            held = self.keys[slot]
            wanted = keys[probing]
            hit = held == wanted
            found[probing[hit]] = slot[hit]
            on = ~hit & (held != _EMPTY)
            probing, slot = probing[on], (slot[on] + np.uint64(1)) & mask
        return found

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self.slots(keys) >= 0

    def get(self, keys: np.ndarray, default: int = -1) -> np.ndarray:
        """Each key's value, `default` where the key is not in the table."""
        found = self.slots(keys)
        return np.where(found >= 0, self.values[np.maximum(found, 0)], default)

    def insert(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Add keys that are distinct and not in the table yet, with their values."""
        if (self.count + len(keys)) * 2 > len(self.keys):
            self._grow(self.count + len(keys))
        self._place(keys, values)
        self.count += len(keys)

    def _place(self, keys: np.ndarray, values: np.ndarray) -> None:
        mask = np.uint64(len(self.keys) - 1)
        pending = np.arange(len(keys))
        slot = self._home(keys)
        while len(pending):
            wanted = keys[pending]
            free = self.keys[slot] == _EMPTY
            # Keys sharing a free slot all write; one stays, the others step on.
            self.keys[slot[free]] = wanted[free]
            placed = self.keys[slot] == wanted
            self.values[slot[placed]] = values[pending[placed]]
            pending, slot = pending[~placed], (slot[~placed] + np.uint64(1)) & mask

    def _grow(self, count: int) -> None:
        held = self.keys != _EMPTY
        keys, values = self.keys[held], self.values[held]
        self._allocate(max(self.bits + 1, (2 * count - 1).bit_length()))
        self._place(keys, values)


# Key spaces up to this many keys get a plain array of values (4 bytes a key: 32 MB at most), when
# they are also at most SPARSEST times the keys expected: filling the array must not cost more than
# the walk it serves (a single context over a large database takes the hash table).
DENSE_LIMIT = 1 << 23
SPARSEST = 64


class DenseTable:
    """The same answers over a small key space [0, size): one int32 value per possible key, -1
    where absent. A lookup is one gather, cheaper than hashing, at a memory cost of the key space."""

    def __init__(self, size: int) -> None:
        self.values = np.full(size, -1, np.int32)
        self.count = 0

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self.values[keys] >= 0

    def get(self, keys: np.ndarray) -> np.ndarray:
        return self.values[keys]

    def insert(self, keys: np.ndarray, values: np.ndarray) -> None:
        self.values[keys] = values
        self.count += len(keys)


def table_for(key_space: int, expected: int) -> PairTable | DenseTable:
    """A DenseTable when the key space is small enough (values fit int32), else a PairTable."""
    dense = key_space <= min(DENSE_LIMIT, SPARSEST * max(expected, 1))
    return DenseTable(key_space) if dense else PairTable(expected)
