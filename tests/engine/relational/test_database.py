"""From tables to contexts: the database format, context sampling as RT does it, no label
leakage, and the learning proof on the generated shop database."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import torch

from relay_engine.errors import DatasetError
from relay_engine.families.rtj.database import open_database
from relay_engine.families.rtj.encoding import HashEmbedder
from relay_engine.families.rtj.evaluate import auroc, evaluate, label_frequency_baseline
from relay_engine.families.rtj.sampling import ContextSampler
from relay_engine.families.rtj.synth import write_fake_shop
from relay_engine.relational import (
    SEM_BOOLEAN,
    SEM_DATETIME,
    SEM_NUMBER,
    SEM_TEXT,
    RelationalTrainer,
    RelationalTrainingArguments,
    RelationalTransformer,
)


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_shop(tmp_path_factory.mktemp("shop"))


def sampler(root: Path, task: str = "user-churn", **options: int) -> ContextSampler:
    return ContextSampler(open_database(root), task, HashEmbedder(384), **options)


def test_contexts_hold_the_seed_its_parents_and_its_history(shop: Path) -> None:
    s = sampler(shop, context_length=128, max_children=8)
    example = s.examples("train", limit=1)[0]
    batch = example.input
    assert batch.batch_size == 1 and batch.sequence_length <= 128
    # The seed's timestamp, then its label as the only target.
    assert batch.is_targets[0].nonzero().flatten().tolist() == [1]
    assert batch.sem_types[0, :2].tolist() == [SEM_DATETIME, SEM_BOOLEAN]
    assert batch.boolean_values[0, 1, 0] == 0  # the hidden label carries no value
    tables = [s.tables[t].name for t in batch.table_name_idxs[0].unique().tolist()]
    assert {"user-churn", "customer", "review"} <= set(tables)
    # The seed row points to its customer; review rows point to theirs.
    customer_node = int(batch.f2p_nbr_idxs[0, 0, 0])
    assert (
        customer_node > 0
        and s.tables[int(batch.table_name_idxs[0, batch.node_idxs[0] == customer_node][0])].name == "customer"
    )
    # All four semantic types occur across the shop's contexts (text: review, title, category).
    types = set(torch.cat([e.input.sem_types[0] for e in s.examples("train", limit=20)]).tolist())
    assert types == {SEM_NUMBER, SEM_TEXT, SEM_DATETIME, SEM_BOOLEAN}
    # The same seed gives the same context.
    again = s.examples("train", limit=1)[0].input
    assert all(torch.equal(getattr(batch, f), getattr(again, f)) for f in ("node_idxs", "number_values"))


def test_a_context_holds_each_visited_row_s_non_null_cells_in_order(shop: Path) -> None:
    """Checked against the tables as pyarrow reads them: after the seed's two cells, node by node,
    the rows the walk visited with one cell per non-null value column (keys make none), from the
    right table, until the context length."""
    s = sampler(shop, context_length=160, max_children=16)
    rows = s.splits["train"]
    database = open_database(shop)
    for i in (0, 7, 31):
        entity = s.pk_rows["customer"][rows.column("customer_id")[i].as_py()]
        seed_time = float(rows.column("timestamp")[i].value) / 1e6
        visited = s.visited_rows(entity, seed_time, (s.seed, 0, i))
        batch = s.examples("train", limit=i + 1)[i].input
        expected_tables, expected_nodes = [s.table_index["user-churn"]] * 2, [0, 0]
        for node, (name, row) in enumerate(visited, start=1):
            if name == "user-churn":  # an earlier train row of the task: its timestamp and label
                cells = sum(rows.column(c)[row].is_valid for c in ("timestamp", "churn"))
            else:
                table = database.tables[name]
                cells = sum(table.data.column(c)[row].is_valid for c in table.value_columns())
            expected_tables += [s.table_index[name]] * cells
            expected_nodes += [node] * cells
        length = batch.sequence_length
        assert length == min(len(expected_nodes), 160)
        assert batch.node_idxs[0].tolist() == expected_nodes[:length]
        assert batch.table_name_idxs[0].tolist() == expected_tables[:length]


def test_no_label_or_future_row_reaches_a_context(shop: Path) -> None:
    s = sampler(shop, context_length=512, max_children=64)
    spec = s.spec
    task_index = s.table_index[spec.name]
    review_index = s.table_index["review"]
    for split in ("train", "val", "test"):
        rows = s.splits[split]
        examples = s.examples(split, limit=25)
        seed_times = (
            rows.column(spec.time_column)
            .to_numpy()[: len(examples)]
            .astype("datetime64[us]")
            .astype(np.int64)
            / 1e6
        )
        for example, seed_time in zip(examples, seed_times, strict=True):
            batch = example.input
            datetimes = batch.datetime_values[0, :, 0].numpy() * s.time_std + s.time_mean
            is_dt = batch.sem_types[0].numpy() == SEM_DATETIME
            tables = batch.table_name_idxs[0].numpy()
            nodes = batch.node_idxs[0].numpy()
            # No review later than the seed.
            review_times = datetimes[is_dt & (tables == review_index)]
            assert (review_times <= seed_time + 1e-3).all()
            # Other labelled task rows: strictly earlier than the seed (so never the seed's own row),
            # and only from the train split.
            other_task_rows = is_dt & (tables == task_index) & (nodes != 0)
            assert (datetimes[other_task_rows] < seed_time - 1).all()
            # The only cell of the label column at the seed's node is the hidden target.
            label_cells = (nodes == 0) & (batch.sem_types[0].numpy() == SEM_BOOLEAN)
            assert batch.is_targets[0].numpy()[label_cells].all()


def test_val_and_test_labels_never_appear_as_examples(shop: Path) -> None:
    s = sampler(shop)
    task_rows = s.tables[s.table_index[s.spec.name]]
    assert task_rows.num_rows == s.splits["train"].num_rows  # in-context rows are train rows only


def test_regression_labels_are_z_scored_with_train_stats(shop: Path) -> None:
    s = sampler(shop, "user-ltv", context_length=64)
    labels = np.asarray([e.label for e in s.examples("train")])
    assert abs(labels.mean()) < 1e-6 and abs(labels.std() - 1) < 1e-6
    assert s.examples("val", limit=1)[0].input.sem_types[0, 1] == SEM_NUMBER


def test_csv_tables_and_dangling_keys(tmp_path: Path, shop: Path) -> None:
    root = tmp_path / "csv-shop"
    (root / "tables").mkdir(parents=True)
    for name in ("product", "customer", "review", "relations"):
        pa_csv.write_csv(pq.read_table(shop / "tables" / f"{name}.parquet"), root / "tables" / f"{name}.csv")
    (root / "schema.json").write_text((shop / "schema.json").read_text())
    (root / "tasks").symlink_to(shop / "tasks")
    s = sampler(root, context_length=64)
    assert len(s.examples("val")) == s.splits["val"].num_rows


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda schema: schema["tables"]["review"]["foreign_keys"].update(product_id="nowhere"),
            "names no table",
        ),
        (lambda schema: schema["tables"]["customer"].update(primary_key="nope"), "has no column 'nope'"),
        (lambda schema: schema["tasks"]["user-churn"].update(problem_type="ranking"), "problem_type"),
        (lambda schema: schema["tables"]["customer"].update(colour="red"), "unknown fields"),
    ],
)
def test_bad_schemas_name_the_field(tmp_path: Path, shop: Path, change, message: str) -> None:
    root = tmp_path / "db"
    (root / "tables").mkdir(parents=True)
    for path in (shop / "tables").iterdir():
        (root / "tables" / path.name).symlink_to(path)
    schema = json.loads((shop / "schema.json").read_text())
    change(schema)
    (root / "schema.json").write_text(json.dumps(schema))
    with pytest.raises(DatasetError, match=message):
        open_database(root)


def test_a_primary_key_must_be_unique(tmp_path: Path, shop: Path) -> None:
    root = tmp_path / "db"
    (root / "tables").mkdir(parents=True)
    for path in (shop / "tables").iterdir():
        (root / "tables" / path.name).symlink_to(path)
    (root / "tables" / "customer.parquet").unlink()
    pq.write_table(pa.table({"customer_id": ["a", "a"], "age": [1, 2]}), root / "tables" / "customer.parquet")
    (root / "schema.json").write_text((shop / "schema.json").read_text())
    with pytest.raises(DatasetError, match="primary_key 'customer_id' must be unique"):
        open_database(root)


@pytest.mark.slow
def test_tuned_rt_j_tiny_beats_untrained_and_the_label_frequency_baseline(shop: Path, tmp_path: Path) -> None:
    s = sampler(shop, context_length=64, max_children=16)
    train = s.examples("train")
    held_out = s.examples("val") + s.examples("test")
    labels = np.asarray([e.label for e in held_out])
    model = RelationalTransformer("rt-j-tiny", device="cpu")
    untrained = evaluate(model, held_out, "binary").metrics["auroc"]
    baseline = auroc(
        labels, np.concatenate([label_frequency_baseline(s, "val"), label_frequency_baseline(s, "test")])
    )
    args = RelationalTrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=3,
        per_device_train_batch_size=16,
        learning_rate=2e-3,
        seed=0,
    )
    RelationalTrainer(model=model, args=args, train_dataset=train).train()
    tuned = evaluate(model, held_out, "binary").metrics["auroc"]
    print(f"held-out AUROC: untrained {untrained:.3f}, label frequency {baseline:.3f}, tuned {tuned:.3f}")
    assert tuned > untrained + 0.1
    assert tuned > baseline + 0.03
