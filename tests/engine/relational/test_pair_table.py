"""The walk's hash table of (context, row) pairs against a Python dict."""

from __future__ import annotations

import numpy as np

from relay_engine.families.rtj.pair_table import DenseTable, PairTable, table_for


def test_a_pair_table_answers_as_a_dict_through_collisions_and_growth() -> None:
    rng = np.random.default_rng(0)
    table = PairTable()
    expected: dict[int, int] = {}
    # Keys in batches, many sharing low bits (as context x size + row keys do), until the table has
    # grown several times past its first 1,024 slots.
    for batch in range(12):
        candidates = np.unique(rng.integers(0, 1 << 40, 900) & ~np.int64(0xFF) | batch)
        fresh = np.asarray([k for k in candidates.tolist() if k not in expected], np.int64)
        values = rng.integers(0, 1 << 30, len(fresh))
        table.insert(fresh, values)
        expected.update(zip(fresh.tolist(), values.tolist(), strict=True))
        asked = np.concatenate(
            [fresh, rng.integers(0, 1 << 40, 500), np.asarray(list(expected), np.int64)[:300]]
        )
        assert table.get(asked).tolist() == [expected.get(k, -1) for k in asked.tolist()]
        assert table.contains(asked).tolist() == [k in expected for k in asked.tolist()]
    assert table.count == len(expected) and len(table.keys) > 1024
    assert len(table.keys) >= 2 * table.count  # at most half full: probe sequences stay short


def test_an_empty_lookup_and_an_empty_table() -> None:
    table = PairTable()
    assert table.get(np.zeros(0, np.int64)).shape == (0,)
    assert not table.contains(np.arange(5)).any()
    table.insert(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert table.count == 0


def test_a_dense_table_answers_as_a_dict_and_is_chosen_for_small_key_spaces() -> None:
    rng = np.random.default_rng(1)
    table, expected = DenseTable(5000), dict[int, int]()
    for _ in range(5):
        fresh = np.asarray([k for k in rng.choice(5000, 300, replace=False).tolist() if k not in expected])
        values = rng.integers(0, 1 << 30, len(fresh))
        table.insert(fresh, values)
        expected.update(zip(fresh.tolist(), values.tolist(), strict=True))
        asked = rng.integers(0, 5000, 800)
        assert table.get(asked).tolist() == [expected.get(k, -1) for k in asked.tolist()]
        assert table.contains(asked).tolist() == [k in expected for k in asked.tolist()]
    assert isinstance(table_for(1000, 100), DenseTable)
    assert isinstance(table_for(1 << 40, 1 << 20), PairTable)  # too large
    assert isinstance(table_for(1 << 20, 100), PairTable)  # too sparse to fill
