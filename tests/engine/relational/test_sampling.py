"""The context sampler's machinery: arrays memory-mapped from files, contexts built many at a
time, embeddings looked up when a batch is collated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from relay_engine.families.rtj import pair_table, sampling
from relay_engine.families.rtj.batch import BATCH_FIELDS, LookedUpBatch, RelationalBatch, collate
from relay_engine.families.rtj.database import open_database, seconds
from relay_engine.families.rtj.encoding import HashEmbedder
from relay_engine.families.rtj.mapped import is_memory_mapped
from relay_engine.families.rtj.sampling import ContextSampler
from relay_engine.families.rtj.synth import write_fake_shop


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_shop(tmp_path_factory.mktemp("shop"))


def sampler(root: Path, cache_dir: Path | None = None, context_length: int = 96) -> ContextSampler:
    return ContextSampler(
        open_database(root),
        "user-churn",
        HashEmbedder(64),
        context_length=context_length,
        max_children=8,
        cache_dir=cache_dir,
    )


def same_batches(a: RelationalBatch, b: RelationalBatch) -> bool:
    return all(torch.equal(getattr(a, name), getattr(b, name)) for name in BATCH_FIELDS)


def test_a_sampler_with_a_cache_dir_memory_maps_its_per_row_arrays_and_samples_the_same(
    shop: Path, tmp_path: Path
) -> None:
    in_memory, mapped = sampler(shop), sampler(shop, tmp_path)
    index = mapped._index
    for name in ("cell_value", "cell_text", "parents", "children", "child_start", "visible_from", "table_of"):
        assert is_memory_mapped(getattr(index, name)), name
        assert not is_memory_mapped(getattr(in_memory._index, name)), name
        assert np.array_equal(getattr(index, name), getattr(in_memory._index, name), equal_nan=True), name
    for table in mapped.tables:
        if table.scalars.size:  # (an empty array cannot be mapped: the relations table has no values)
            assert is_memory_mapped(table.scalars) and is_memory_mapped(table.present), table.name
        for _, rows in table.parents:
            assert is_memory_mapped(rows), table.name
    assert is_memory_mapped(mapped.text_table)
    assert len(list((tmp_path / "rtj-contexts").iterdir())) == 1

    for ours, theirs in zip(mapped.examples("val"), in_memory.examples("val"), strict=True):
        assert ours.label == theirs.label
        assert same_batches(ours.input, theirs.input)

    # The same database, task and settings open the files already written.
    again = sampler(shop, tmp_path)
    assert len(list((tmp_path / "rtj-contexts").iterdir())) == 1
    reopened, first = again._index.cell_value.base, index.cell_value.base
    assert isinstance(reopened, np.memmap) and isinstance(first, np.memmap)
    assert reopened.filename == first.filename


def test_a_context_alone_is_the_one_built_with_others(shop: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = sampler(shop)
    examples = s.examples("train")  # every train row in one walk
    monkeypatch.setattr(sampling, "CONTEXTS_PER_WALK", 7)
    count = 20
    in_walks_of_7 = s.examples("train", limit=count)
    rows = s.splits["train"]
    entities = rows.column("customer_id").to_pylist()
    times = seconds(rows.column("timestamp"))
    for i in range(count):
        entity = s.pk_rows["customer"][entities[i]]
        alone = s.context(entity, float(times[i]), (s.seed, 0, i))
        assert same_batches(alone, examples[i].input), i
        assert same_batches(alone, in_walks_of_7[i].input), i
    # Another seed draws other children: contexts are random, yet fixed by (seed, split, row).
    other = ContextSampler(
        open_database(shop), "user-churn", HashEmbedder(64), context_length=96, max_children=8, seed=1
    ).examples("train", limit=count)
    assert any(not same_batches(a.input, b.input) for a, b in zip(in_walks_of_7, other, strict=True))


def test_collate_gathers_looked_up_embeddings_as_a_batch_of_values_would(shop: Path) -> None:
    contexts = [e.input for e in sampler(shop, context_length=4096).examples("train", limit=6)]
    assert all(isinstance(c, LookedUpBatch) for c in contexts)
    assert len({c.sequence_length for c in contexts}) > 1, "the test needs padding"
    materialized = [RelationalBatch(**c.as_dict()) for c in contexts]
    looked_up, plain = collate(contexts), collate(materialized)
    assert same_batches(looked_up, plain)
    assert bool(looked_up.text_values.abs().sum() > 0) and looked_up.validate() is looked_up
    # Padding takes the zero rows.
    assert bool((looked_up.col_name_values[looked_up.is_padding] == 0).all())


def test_with_a_cache_dir_the_tables_are_memory_mapped_and_contexts_stay_the_same(
    shop: Path, tmp_path: Path
) -> None:
    in_memory = open_database(shop)
    open_database(shop, cache_dir=tmp_path)  # (the first open writes the Arrow copies)
    before = pa.total_allocated_bytes()
    mapped = open_database(shop, cache_dir=tmp_path)
    # Opened again, the tables take no memory from pyarrow's pool: their buffers are the files'.
    assert pa.total_allocated_bytes() - before < sum(t.data.nbytes for t in mapped.tables.values()) / 10
    copies = sorted((tmp_path / "rtj-tables").glob("*.arrow"))
    assert len(copies) == len(in_memory.tables)
    for name, table in mapped.tables.items():
        assert table.data.equals(in_memory.tables[name].data), name
        assert table.data.schema == in_memory.tables[name].data.schema, name
    contexts = [
        ContextSampler(db, "user-churn", HashEmbedder(64), context_length=96, max_children=8).examples("val")
        for db in (mapped, in_memory)
    ]
    for ours, theirs in zip(*contexts, strict=True):
        assert ours.label == theirs.label and same_batches(ours.input, theirs.input)


def test_the_walk_s_hash_table_and_its_dense_table_give_the_same_contexts(
    shop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = sampler(shop, context_length=512)
    dense = s.examples("train", limit=40)  # (the shop's pairs fit the dense table)
    monkeypatch.setattr(pair_table, "DENSE_LIMIT", 0)
    hashed = s.examples("train", limit=40)
    assert all(same_batches(a.input, b.input) for a, b in zip(dense, hashed, strict=True))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_walk_s_unstable_sorts_give_what_a_stable_sort_would(seed: int) -> None:
    """`_first_times` and `_order_within_groups` sort with numpy's faster unstable sort: each must
    still give exactly the stable definition, on keys with many repeats and on distinct ones."""
    rng = np.random.default_rng(seed)
    repeated = rng.integers(0, 50, 2_000)
    order = np.argsort(repeated, kind="stable")
    first = np.ones(len(repeated), bool)
    first[order[1:]] = repeated[order][1:] != repeated[order][:-1]
    assert np.array_equal(sampling._first_times(repeated), first)
    assert not sampling._first_times(np.zeros(0, np.int64)).any()

    groups = np.sort(rng.integers(0, 40, 3_000))
    keys = rng.integers(0, 2**63, len(groups), dtype=np.uint64)
    assert np.array_equal(sampling._order_within_groups(groups, keys), np.lexsort((keys, groups)))
    tied = keys % np.uint64(7)  # equal keys within a group: lexsort's order, ties by position
    assert np.array_equal(sampling._order_within_groups(groups, tied), np.lexsort((tied, groups)))
