"""No statistic crosses the split cutoff: a row planted after the validation cutoff, with a huge
number and a far-future date, leaves every earlier row's encoding and every train context exactly
as they were without it."""

from __future__ import annotations

import dataclasses
import shutil
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from relay_engine.families.rtj.database import open_database, seconds
from relay_engine.families.rtj.encoding import HashEmbedder
from relay_engine.families.rtj.sampling import ContextSampler
from relay_engine.families.rtj.synth import DAY, write_fake_shop

FAR_FUTURE = datetime(2500, 1, 1)
HUGE = 1e9


def sampler(root: Path, task: str = "user-churn") -> ContextSampler:
    return ContextSampler(open_database(root), task, HashEmbedder(16), context_length=96, max_children=8)


def _with_shipping_date(root: Path) -> None:
    """Give every review a second datetime column (a day after the review), so a datetime value
    column other than the time column is encoded too."""
    path = root / "tables" / "review.parquet"
    review = pq.read_table(path)
    shipped = pc.add(review.column("review_time"), pa.scalar(DAY * 1_000_000, pa.duration("us")))
    pq.write_table(review.append_column("shipped_at", shipped), path)


@pytest.fixture(scope="module")
def shops(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shop, and the same shop with one review planted after the validation cutoff: rating
    1e9 and shipped in the year 2500."""
    clean = write_fake_shop(tmp_path_factory.mktemp("clean"))
    _with_shipping_date(clean)
    planted = tmp_path_factory.mktemp("planted") / "shop"
    shutil.copytree(clean, planted)
    path = planted / "tables" / "review.parquet"
    review = pq.read_table(path)
    last = review.column("review_time")[-1].value
    row = {
        "customer_id": ["customer_0"],
        "product_id": ["product_0"],
        "review_time": pa.array([last + DAY * 1_000_000], pa.timestamp("us")),
        "rating": [int(HUGE)],
        "review": ["positive"],
        "shipped_at": pa.array([FAR_FUTURE], pa.timestamp("us")),
    }
    pq.write_table(pa.concat_tables([review, pa.table(row, schema=review.schema)]), path)
    return clean, planted


@pytest.mark.parametrize("task", ["user-churn", "user-ltv"])
def test_a_row_after_the_cutoff_changes_no_earlier_encoding_and_no_train_context(
    shops: tuple[Path, Path], task: str
) -> None:
    clean, planted = sampler(shops[0], task), sampler(shops[1], task)
    assert planted.statistics_cutoff == clean.statistics_cutoff
    planted_time = seconds(planted.database.tables["review"].data.column("review_time"))[-1]
    assert planted_time > planted.statistics_cutoff.seconds, "the planted row must lie after the cutoff"

    assert (planted.time_mean, planted.time_std) == (clean.time_mean, clean.time_std)
    for before, after in zip(clean.tables, planted.tables, strict=True):
        rows = before.num_rows  # the planted review is the last row; the rows before it
        assert np.array_equal(after.scalars[:rows], before.scalars[:rows]), before.name
        assert np.array_equal(after.present[:rows], before.present[:rows]), before.name
    # The planted row itself is encoded (it is data, seen by seeds after it), just not counted.
    review = planted.tables[planted.table_index["review"]]
    assert review.num_rows == clean.tables[clean.table_index["review"]].num_rows + 1

    for clean_example, planted_example in zip(
        clean.examples("train"), planted.examples("train"), strict=True
    ):
        assert clean_example.label == planted_example.label
        for name in (f.name for f in dataclasses.fields(clean_example.input)):
            assert torch.equal(getattr(clean_example.input, name), getattr(planted_example.input, name)), name


def test_statistics_come_from_rows_before_the_earliest_val_timestamp(shops: tuple[Path, Path]) -> None:
    """Brute force: the rating column's z-score uses the mean and std of the reviews strictly before
    the cutoff, so the planted 1e9 does not squash every earlier rating towards 0 (it did when the
    statistics read every row)."""
    s = sampler(shops[1])
    val_times = seconds(s.splits["val"].column("timestamp"))
    assert s.statistics_cutoff.seconds == val_times.min() and not s.statistics_cutoff.inclusive

    data = s.database.tables["review"].data
    times = seconds(data.column("review_time"))
    ratings = np.asarray(data.column("rating").to_numpy(), np.float64)
    before = times < val_times.min()
    assert 0 < before.sum() < len(times)
    expected = (ratings - ratings[before].mean()) / ratings[before].std()
    review = s.tables[s.table_index["review"]]
    column = list(s.database.tables["review"].value_columns()).index("rating")
    np.testing.assert_array_equal(review.scalars[:, column], expected.astype(np.float32))
    # Counting every row, the planted rating would put each real one within 1e-4 of the mean.
    assert np.abs(review.scalars[:-1, column]).max() > 0.5

    # Datetimes: the mean over the datetime cells of rows before the cutoff and the train timestamps.
    shipped = seconds(data.column("shipped_at"))
    train_times = seconds(s.splits["train"].column("timestamp"))
    known = np.concatenate([times[before], shipped[before], train_times])
    assert s.time_mean == pytest.approx(known.mean(), rel=1e-12)
    assert s.time_std == pytest.approx(known.std(), rel=1e-12)


def test_without_a_val_split_the_cutoff_is_the_latest_train_timestamp(
    shops: tuple[Path, Path], tmp_path: Path
) -> None:
    root = tmp_path / "shop"
    shutil.copytree(shops[1], root)
    (root / "tasks" / "user-churn" / "val.parquet").unlink()
    s = sampler(root)
    train_times = seconds(s.splits["train"].column("timestamp"))
    assert s.statistics_cutoff.seconds == train_times.max()
    assert s.statistics_cutoff.inclusive and s.statistics_cutoff.source == "train"
    # A row at the cutoff's instant counts; one after it does not.
    counts = s.statistics_cutoff.counts(np.array([train_times.max(), train_times.max() + 1, np.nan]), 3)
    assert counts.tolist() == [True, False, False]
    assert s.statistics_cutoff.isoformat == datetime.fromtimestamp(train_times.max(), UTC).isoformat()


def test_rows_of_tables_without_a_time_column_all_count(shops: tuple[Path, Path]) -> None:
    """The customer table has no time column: its age statistics use every customer."""
    s = sampler(shops[1])
    ages = np.asarray(s.database.tables["customer"].data.column("age").to_numpy(), np.float64)
    customer = s.tables[s.table_index["customer"]]
    column = s.database.tables["customer"].value_columns().index("age")
    expected = ((ages - ages.mean()) / ages.std()).astype(np.float32)
    np.testing.assert_array_equal(customer.scalars[:, column], expected)
