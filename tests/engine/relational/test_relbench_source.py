"""RelBench datasets and tasks as RT-J databases, offline: RelBench's own Dataset, EntityTask and
manifest-built task objects over a small shop made in code, converted, opened, sampled and trained
on; `relbench:` names for a local RelBench directory; and a name that needs a download, refused
plainly when the Hub cannot be reached."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest
from relbench.base import Database as RelBenchDatabase
from relbench.base import Dataset, EntityTask, TaskType
from relbench.base import Table as RelBenchTable
from relbench.load import build_task
from relbench.manifest import DatasetManifest, TableSpec, TaskManifest
from typer.testing import CliRunner

from relay.cli import app
from relay_engine.errors import DatasetError
from relay_engine.families.rtj.database import open_database, seconds
from relay_engine.families.rtj.encoding import HashEmbedder
from relay_engine.families.rtj.relbench_source import parse_relbench_name, relbench_database
from relay_engine.families.rtj.sampling import ContextSampler
from relay_engine.families.rtj.summary import column_stats
from relay_engine.families.rtj.tasks import WindowTask, window_labels
from relay_engine.relational import (
    RelationalTrainer,
    RelationalTrainingArguments,
    RelationalTransformer,
)

DAYS = 300
CUSTOMERS = 40
PRODUCTS = 12


class ShopDataset(Dataset):
    """A RelBench dataset made in code: customers, products, a review every day (a few pointing to
    customers that do not exist), and customer-product relations without a time."""

    val_timestamp = pd.Timestamp("2020-01-01") + pd.Timedelta(days=240)
    test_timestamp = pd.Timestamp("2020-01-01") + pd.Timedelta(days=270)

    def make_db(self) -> RelBenchDatabase:
        rng = np.random.default_rng(7)
        activity = rng.gamma(1.0, 1.0, CUSTOMERS)
        who = rng.choice(CUSTOMERS + 3, DAYS, p=np.append(activity, [0.2] * 3) / (activity.sum() + 0.6))
        customer = pd.DataFrame(
            {
                "customer_id": pd.array(np.arange(CUSTOMERS), dtype="Int64"),
                "age": rng.integers(18, 70, CUSTOMERS),
                "city": ["north", "south"] * (CUSTOMERS // 2),
            }
        )
        product = pd.DataFrame(
            {
                "product_id": pd.array(np.arange(PRODUCTS), dtype="Int64"),
                "tags": [None, [], ["toy", "health"]] * (PRODUCTS // 3),  # a list column
                "price": rng.random(PRODUCTS) * 10,
                "note": [1, "fragile", None] * (PRODUCTS // 3),  # mixed objects: read as text
            }
        )
        review = pd.DataFrame(
            {
                "customer_id": pd.array(who, dtype="Int64"),
                "product_id": pd.array(rng.integers(0, PRODUCTS, DAYS), dtype="Int64"),
                "review_time": pd.Timestamp("2020-01-01") + pd.to_timedelta(np.arange(DAYS), unit="D"),
                "rating": rng.integers(1, 6, DAYS),
            }
        )
        relations = pd.DataFrame(
            {
                "customer_id": pd.array(rng.integers(0, CUSTOMERS, 10), dtype="Int64"),
                "product_id": pd.array(rng.integers(0, PRODUCTS, 10), dtype="Int64"),
            }
        )
        both = {"customer_id": "customer", "product_id": "product"}
        return RelBenchDatabase(
            {
                "customer": RelBenchTable(customer, {}, pkey_col="customer_id"),
                "product": RelBenchTable(product, {}, pkey_col="product_id"),
                "review": RelBenchTable(review, both, time_col="review_time"),
                "relations": RelBenchTable(relations, both),
            }
        )


class QuietTask(EntityTask):
    """Binary: a customer who reviewed in the 20 days before a timestamp reviews nothing in the 20
    after it. A plain EntityTask subclass, its labels made in pandas."""

    task_type = TaskType.BINARY_CLASSIFICATION
    entity_col = "customer_id"
    entity_table = "customer"
    time_col = "timestamp"
    target_col = "quiet"
    timedelta = pd.Timedelta(days=20)
    metrics: ClassVar[list[Any]] = []

    def make_table(self, db: RelBenchDatabase, timestamps: pd.Series) -> RelBenchTable:
        reviews = db.table_dict["review"].df.dropna(subset=["customer_id"])
        rows = []
        for t in timestamps:
            before = reviews[(reviews.review_time > t - self.timedelta) & (reviews.review_time <= t)]
            after = reviews[(reviews.review_time > t) & (reviews.review_time <= t + self.timedelta)]
            for customer in sorted(before.customer_id.unique()):
                rows.append((t, customer, int(customer not in set(after.customer_id))))
        frame = pd.DataFrame(rows, columns=["timestamp", "customer_id", "quiet"])
        return RelBenchTable(frame, {"customer_id": "customer"}, time_col="timestamp")


# A task as RelBench's manifests define them (its label SQL run by duckdb): reviews in the next
# 20 days of each customer who has reviewed by then.
REVIEWS_SQL = """
SELECT t.timestamp AS timestamp, c.customer_id AS customer_id,
       CAST(COUNT(fut.review_time) AS DOUBLE) AS reviews
FROM timestamps t
JOIN (SELECT DISTINCT customer_id, MIN(review_time) AS first FROM review
      WHERE customer_id IS NOT NULL GROUP BY customer_id) c ON c.first <= t.timestamp
LEFT JOIN review fut ON fut.customer_id = c.customer_id
    AND fut.review_time > t.timestamp AND fut.review_time <= t.timestamp + INTERVAL '{timedelta}'
GROUP BY t.timestamp, c.customer_id
"""
REVIEWS = TaskManifest(
    name="user-reviews",
    kind="forecast",
    task_type="regression",
    entity_table="customer",
    entity_col="customer_id",
    target_col="reviews",
    time_col="timestamp",
    timedelta="20 days",
    sql=REVIEWS_SQL,
)


@pytest.fixture(scope="module")
def dataset() -> ShopDataset:
    return ShopDataset()


def test_relbench_objects_convert_open_sample_and_train(dataset: ShopDataset, tmp_path: Path) -> None:
    quiet, reviews = QuietTask(dataset), build_task(dataset, REVIEWS)
    root = relbench_database(dataset, task=[quiet, reviews], directory=tmp_path / "shop")
    assert root == tmp_path / "shop"
    database = open_database(root)

    relbench_db = dataset.get_db()
    assert set(database.tables) == set(relbench_db.table_dict)
    review = database.tables["review"]
    assert review.foreign_keys == {"customer_id": "customer", "product_id": "product"}
    assert review.time_column == "review_time" and database.tables["customer"].primary_key == "customer_id"
    assert review.num_rows == len(relbench_db.table_dict["review"].df)  # up to the test timestamp
    expected_times = (relbench_db.table_dict["review"].df.review_time - pd.Timestamp(0)).dt.total_seconds()
    np.testing.assert_array_equal(seconds(review.data.column("review_time")), expected_times)
    np.testing.assert_array_equal(
        review.data.column("rating").to_numpy(), relbench_db.table_dict["review"].df.rating
    )
    # Dangling customers (RelBench nulls them) stay null; the odd columns are read.
    assert (
        review.data.column("customer_id").null_count
        == relbench_db.table_dict["review"].df.customer_id.isna().sum()
    )
    product = database.tables["product"].data
    assert product.column("note").to_pylist()[:3] == ["1", "fragile", None]
    assert product.column("tags").to_pylist()[:3] == [None, "[]", '["toy", "health"]']
    assert column_stats(database)["product"]["tags"]["type"] == "text"  # `relay datasets stats` reads it

    cutoffs = {"val": "2020-08-28T00:00:00", "test": "2020-09-27T00:00:00"}
    assert (
        database.task("quiet-task").problem_type == "binary"
        and database.task("quiet-task").cutoffs == cutoffs
    )
    assert database.task("user-reviews").problem_type == "regression"
    for name, task in (("quiet-task", quiet), ("user-reviews", reviews)):
        for split in ("train", "val", "test"):
            ours = database.task_split(name, split)
            theirs = task.get_table(split, mask_input_cols=False).df
            assert ours.num_rows == len(theirs) > 0
            np.testing.assert_array_equal(
                ours.column(task.target_col).to_numpy(), theirs[task.target_col].to_numpy()
            )

    sampler = ContextSampler(database, "quiet-task", HashEmbedder(384), context_length=48, max_children=4)
    assert sampler.statistics_cutoff.seconds == dataset.val_timestamp.timestamp()
    examples = sampler.examples("train")
    assert {e.label for e in examples} == {0.0, 1.0}
    model = RelationalTransformer("rt-j-tiny", device="cpu")
    args = RelationalTrainingArguments(
        output_dir=str(tmp_path / "out"),
        num_train_epochs=1,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        save_strategy="no",
    )
    result = RelationalTrainer(model=model, args=args, train_dataset=examples[:24]).train()
    assert result["steps"] == 3 and math.isfinite(result["train_loss"])


def test_window_labels_agree_with_relbench(dataset: ShopDataset, tmp_path: Path) -> None:
    """The window tasks' labels (tasks.py) are RelBench's: for each customer and timestamp of
    RelBench's user-reviews train and val splits, our count of reviews in (t, t + 20 days] is
    theirs. (Their entities are the customers who reviewed by t; ours every customer.)"""
    database = open_database(relbench_database(dataset, directory=tmp_path / "shop"))
    task = WindowTask("reviews", "customer", "review", timedelta(days=20))
    theirs_task = build_task(dataset, REVIEWS)
    for split in ("train", "val"):
        theirs = theirs_task.get_table(split, mask_input_cols=False).df
        stamps = sorted({t.to_pydatetime() for t in theirs.timestamp})
        ours = window_labels(database, task, stamps).to_pandas()
        joined = theirs.merge(ours, on=["customer_id", "timestamp"], how="left")
        assert len(joined) == len(theirs) > 0 and not joined.target.isna().any()
        np.testing.assert_array_equal(joined.target.to_numpy(), joined.reviews.to_numpy())


def test_a_local_relbench_directory_by_name(
    dataset: ShopDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """relbench:<directory>/<task> reads a RelBench directory (manifest.yaml, db/, tasks/) through
    relbench.load_dataset, regenerating the labels with the task's SQL; it is kept in the Relay cache
    and reused."""
    source = tmp_path / "rel-shop"
    (source / "db").mkdir(parents=True)
    tables = {}
    for name, table in dataset.get_db(upto_test_timestamp=False).table_dict.items():
        frame = table.df.copy()
        if name == "product":
            frame = frame.drop(columns=["note"])  # parquet wants one type per column
        frame.to_parquet(source / "db" / f"{name}.parquet")
        tables[name] = TableSpec(table.pkey_col, table.time_col, dict(table.fkey_col_to_pkey_table))
    DatasetManifest("rel-shop", str(dataset.val_timestamp), str(dataset.test_timestamp), tables=tables).save(
        source / "manifest.yaml"
    )
    REVIEWS.save(source / "tasks" / "user-reviews" / "manifest.yaml")
    monkeypatch.setenv("RELAY_CACHE_DIR", str(tmp_path / "cache"))

    assert parse_relbench_name(f"relbench:{source}/user-reviews") == (str(source), "user-reviews")
    root = relbench_database(f"relbench:{source}/user-reviews")
    assert root == tmp_path / "cache" / "relbench" / "rel-shop__user-reviews"
    database = open_database(root)
    assert list(database.tasks) == ["user-reviews"]
    assert database.task_split("user-reviews", "train").num_rows > 0
    written = (root / "schema.json").stat().st_mtime_ns
    assert relbench_database(f"relbench:{source}/user-reviews") == root
    assert (root / "schema.json").stat().st_mtime_ns == written, "a second call reuses the conversion"
    # Without a task: every binary or regression entity task the dataset lists.
    assert list(open_database(relbench_database(f"relbench:{source}")).tasks) == ["user-reviews"]
    # The name itself wherever a database is named: open_database, and a local training run.
    assert open_database(f"relbench:{source}/user-reviews").root == root
    options = ["--model", "rt-j-tiny", "--task", "user-reviews", "--steps", "2", "--batch-size", "4"]
    name = f"relbench:{source}/user-reviews"
    out = tmp_path / "out"
    trained = CliRunner().invoke(
        app, ["local", "train", *options, "--dataset", name, "--output-dir", str(out)]
    )
    assert trained.exit_code == 0, trained.output
    assert any(out.rglob("model.safetensors")), trained.output
    with pytest.raises(DatasetError, match="RelBench refused it: no task 'nope'"):
        relbench_database(f"relbench:{source}/nope")


def test_names() -> None:
    assert parse_relbench_name("relbench:rel-f1") == ("rel-f1", None)
    assert parse_relbench_name("relbench:rel-f1/driver-dnf") == ("rel-f1", "driver-dnf")
    for bad, message in (
        ("rel-f1", "starts with 'relbench:'"),
        ("relbench:", "name a dataset"),
        ("relbench:rel-f1/driver-dnf/x", "relbench:<dataset> or relbench:<dataset>/<task>"),
    ):
        with pytest.raises(DatasetError, match=message):
            parse_relbench_name(bad)


def test_a_dataset_not_downloaded_and_no_network_is_refused_plainly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DatasetError, match="rel-f1 must be downloaded first") as refused:
        relbench_database("relbench:rel-f1/driver-dnf", directory=tmp_path / "out")
    assert str(cache) in str(refused.value) and "relbench.load_dataset('rel-f1')" in str(refused.value)
    assert not (tmp_path / "out").exists()
