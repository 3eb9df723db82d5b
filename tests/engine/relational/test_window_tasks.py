"""Tasks from time windows: labels checked by brute force on a database small enough to check by
hand, the splits RelBench's way, the schema entry with its cutoffs, the CLI, and training on a
written task through ContextSampler."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay_engine.errors import DatasetError
from relay_engine.families.rtj.database import open_database
from relay_engine.families.rtj.encoding import HashEmbedder
from relay_engine.families.rtj.sampling import ContextSampler
from relay_engine.families.rtj.synth import write_fake_shop
from relay_engine.families.rtj.tasks import (
    SplitTimestamps,
    Threshold,
    WindowTask,
    parse_duration,
    stepped_timestamps,
    window_labels,
    write_window_task,
)
from relay_engine.relational import RelationalTrainer, RelationalTrainingArguments, RelationalTransformer

START = datetime(2024, 1, 1)
WINDOW = timedelta(days=10)


def day(n: float) -> datetime:
    return START + timedelta(days=n)


# Customers join on these days (customer 4 joins after the first timestamps); orders by
# (order, customer, day, amount): one to a customer that does not exist, one without an amount,
# two on a window's closing day (counted) and one on its opening day (not counted).
CUSTOMERS = {1: 0, 2: 0, 3: 15, 4: 33}
ORDERS = [
    (1, 1, 5, 10.0),
    (2, 1, 12, 20.0),
    (3, 2, 20, 5.0),  # on day 20: not in (20, 30], in (10, 20]
    (4, 1, 25, None),
    (5, 3, 30, 7.0),  # on day 30: in (20, 30]
    (6, 99, 22, 100.0),  # no such customer
    (7, 3, 34, 1.0),
    (8, 2, 38, 4.0),
    (9, 4, 41, 8.0),
    (10, 1, 48, 2.0),
    (11, 3, 55, 3.0),
]


def _write(root: Path) -> Path:
    (root / "tables").mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "customer_id": list(CUSTOMERS),
                "joined": pa.array([day(d) for d in CUSTOMERS.values()], pa.timestamp("us")),
                "age": [30, 40, 50, 60],
            }
        ),
        root / "tables" / "customer.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "order_id": [o[0] for o in ORDERS],
                "customer_id": [o[1] for o in ORDERS],
                "placed": pa.array([day(o[2]) for o in ORDERS], pa.timestamp("us")),
                "amount": pa.array([o[3] for o in ORDERS], pa.float64()),
            }
        ),
        root / "tables" / "orders.parquet",
    )
    schema = {
        "tables": {
            "customer": {"primary_key": "customer_id", "time_column": "joined"},
            "orders": {
                "primary_key": "order_id",
                "foreign_keys": {"customer_id": "customer"},
                "time_column": "placed",
            },
        }
    }
    (root / "schema.json").write_text(json.dumps(schema))
    return root


@pytest.fixture
def orders_db(tmp_path: Path) -> Path:
    return _write(tmp_path / "db")


def brute_force(aggregate: str, at: float, threshold: Threshold | None = None) -> dict[int, float]:
    """Per customer existing on day `at`, the aggregate of its orders in (at, at + 10]."""
    labels: dict[int, float] = {}
    for customer, joined in CUSTOMERS.items():
        if joined > at:
            continue
        mine = [o for o in ORDERS if o[1] == customer and at < o[2] <= at + 10]
        amounts = [o[3] for o in mine if o[3] is not None]
        if aggregate == "count":
            value: float = len(mine)
        elif aggregate == "exists":
            value = float(bool(mine))
        elif aggregate == "sum":
            value = sum(amounts)
        elif not amounts:
            continue  # mean, max, min of nothing: no row
        else:
            value = {"mean": sum(amounts) / len(amounts), "max": max(amounts), "min": min(amounts)}[aggregate]
        if threshold is not None:
            value = float(
                {
                    "==": value == threshold.value,
                    ">=": value >= threshold.value,
                    "<": value < threshold.value,
                }[threshold.comparison]
            )
        labels[customer] = value
    return labels


@pytest.mark.parametrize(
    ("aggregate", "column", "threshold"),
    [
        ("count", None, None),
        ("count", None, "==0"),
        ("count", None, ">=2"),
        ("exists", None, None),
        ("sum", "amount", None),
        ("sum", "amount", "<6"),
        ("mean", "amount", None),
        ("max", "amount", None),
        ("min", "amount", None),
    ],
)
def test_labels_match_brute_force(
    orders_db: Path, aggregate: str, column: str | None, threshold: str | None
) -> None:
    parsed = Threshold.parse(threshold) if threshold else None
    task = WindowTask("t", "customer", "orders", WINDOW, aggregate, column, parsed)
    days = [10, 20, 30, 40]
    rows = window_labels(open_database(orders_db), task, [day(d) for d in days])
    got: dict[tuple[int, float], float] = {}
    for customer, stamp, target in zip(*(rows.column(i).to_pylist() for i in range(3)), strict=True):
        got[(customer, (stamp - START).total_seconds() / 86_400)] = target
    expected = {(c, float(d)): v for d in days for c, v in brute_force(aggregate, d, parsed).items()}
    assert got == pytest.approx(expected)
    assert rows.column_names == ["customer_id", "timestamp", "target"]
    binary = parsed is not None or aggregate == "exists"
    assert rows.schema.field("target").type == (pa.int64() if binary else pa.float64())


def test_hand_checked_labels(orders_db: Path) -> None:
    """A few labels worked out by hand from the table above."""
    task = WindowTask("t", "customer", "orders", WINDOW, "count")
    rows = window_labels(open_database(orders_db), task, [day(20)]).to_pylist()
    # Day 20: customers 1, 2 and 3 exist (4 joins on day 33). Window (20, 30]: customer 1 orders on
    # day 25, customer 3 on day 30; customer 2's order on day 20 is before the window; order 6's
    # customer 99 does not exist.
    assert [(r["customer_id"], r["target"]) for r in rows] == [(1, 1.0), (2, 0.0), (3, 1.0)]
    mean = WindowTask("t", "customer", "orders", WINDOW, "mean", "amount")
    # Customer 1's only order in (20, 30] has no amount: no mean, no row.
    assert [
        r["customer_id"] for r in window_labels(open_database(orders_db), mean, [day(20)]).to_pylist()
    ] == [3]


def test_written_task_opens_keeps_its_cutoffs_and_trains(orders_db: Path, tmp_path: Path) -> None:
    database = open_database(orders_db)
    task = WindowTask("churn", "customer", "orders", WINDOW, "count", threshold=Threshold.parse("==0"))
    stamps = SplitTimestamps((day(10), day(20)), (day(30),), (day(45),))
    spec = write_window_task(database, task, stamps)
    assert spec.problem_type == "binary"
    assert spec.cutoffs == {"val": "2024-01-31T00:00:00", "test": "2024-02-15T00:00:00"}

    reopened = open_database(orders_db)
    assert reopened.task("churn") == spec and reopened.task("churn").cutoffs == spec.cutoffs
    entry = json.loads((orders_db / "schema.json").read_text())["tasks"]["churn"]
    assert entry["cutoffs"] == spec.cutoffs and entry["entity_column"] == "customer_id"
    train = reopened.task_split("churn", "train").to_pylist()
    # Day 10: customers 1 and 2 (3 joins on day 15), both order in (10, 20]. Day 20: only
    # customer 2 has no order in (20, 30].
    assert [(r["customer_id"], r["target"]) for r in train] == [(1, 0), (2, 0), (1, 0), (2, 1), (3, 0)]

    sampler = ContextSampler(reopened, "churn", HashEmbedder(384), context_length=32, max_children=4)
    assert sampler.statistics_cutoff.seconds == (day(30) - datetime(1970, 1, 1)).total_seconds()
    examples = sampler.examples("train")
    assert [e.label for e in examples] == [0.0, 0.0, 0.0, 1.0, 0.0]
    model = RelationalTransformer("rt-j-tiny", device="cpu")
    args = RelationalTrainingArguments(
        output_dir=str(tmp_path / "out"),
        num_train_epochs=2,
        per_device_train_batch_size=3,
        learning_rate=1e-2,
        save_strategy="no",
    )
    result = RelationalTrainer(model=model, args=args, train_dataset=examples).train()
    assert result["steps"] == 4 and math.isfinite(result["train_loss"])

    with pytest.raises(DatasetError, match="already has a task 'churn'"):
        write_window_task(database, task, stamps)
    count = WindowTask("churn", "customer", "orders", WINDOW, "count")
    assert write_window_task(database, count, stamps, replace=True).problem_type == "regression"


def test_rules_are_refused_with_the_field_named(orders_db: Path) -> None:
    database = open_database(orders_db)
    stamps = SplitTimestamps((day(10),), (day(30),))
    cases = [
        (WindowTask("t", "nope", "orders", WINDOW), "entity table 'nope'"),
        (WindowTask("t", "customer", "customer", WINDOW), "no foreign key to customer"),
        (WindowTask("t", "customer", "orders", WINDOW, "median"), "aggregate must be one of"),
        (WindowTask("t", "customer", "orders", WINDOW, "sum"), "aggregate sum needs a column"),
        (WindowTask("t", "customer", "orders", WINDOW, "count", "amount"), "takes no column"),
        (
            WindowTask("t", "customer", "orders", WINDOW, "exists", threshold=Threshold("==", 0)),
            "no threshold",
        ),
        (WindowTask("t", "customer", "orders", WINDOW, "sum", "placed"), "number or boolean column"),
        (WindowTask("bad/name", "customer", "orders", WINDOW), "task name"),
        (WindowTask("t", "customer", "orders", WINDOW, target_column="customer_id"), "would clash"),
    ]
    for task, message in cases:
        with pytest.raises(DatasetError, match=message):
            write_window_task(database, task, stamps)
    # A train window that reaches past the val cutoff would hold val-period events in train labels.
    with pytest.raises(DatasetError, match="train window at 2024-01-25T00:00:00 ends after the val cutoff"):
        write_window_task(
            database, WindowTask("t", "customer", "orders", WINDOW), SplitTimestamps((day(24),), (day(30),))
        )
    with pytest.raises(ValueError, match="threshold must be a comparison"):
        Threshold.parse("=0")
    with pytest.raises(ValueError, match="positive whole number"):
        parse_duration("0d")
    assert parse_duration("2w") == timedelta(days=14) and parse_duration("12h") == timedelta(hours=12)


def test_stepped_timestamps_as_relbench(orders_db: Path) -> None:
    """val at its timestamp, test at its own, train at val - window and then every step back while
    not before the earliest time (day 0 here); both windows must end by the latest time (day 55)."""
    database = open_database(orders_db)
    stamps = stepped_timestamps(database, day(30), day(44), WINDOW)
    assert (
        stamps.train == (day(0), day(10), day(20)) and stamps.val == (day(30),) and stamps.test == (day(44),)
    )
    assert stepped_timestamps(database, day(30), day(44), WINDOW, timedelta(days=7)).train == (
        day(6),
        day(13),
        day(20),
    )
    with pytest.raises(
        DatasetError, match=r"test timestamp \+ window .* is later than the database's latest"
    ):
        stepped_timestamps(database, day(30), day(46), WINDOW)
    with pytest.raises(DatasetError, match="must fit between the val and test timestamps"):
        stepped_timestamps(database, day(30), day(35), WINDOW)


def test_cli_makes_a_task_on_the_shop(tmp_path: Path) -> None:
    root = write_fake_shop(tmp_path / "shop", customers=20, reviews=100)
    runner = CliRunner()
    made = runner.invoke(
        app,
        [
            "datasets", "task", str(root), "quiet-month",
            "--entity", "customer", "--events", "review", "--window", "30d", "--threshold", "==0",
            "--val-timestamp", "1970-05-01", "--test-timestamp", "1970-06-01",
        ],
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert "wrote task quiet-month (binary, on customer)" in made.output
    database = open_database(root)
    spec = database.task("quiet-month")
    assert spec.cutoffs == {"val": "1970-05-01T00:00:00", "test": "1970-06-01T00:00:00"}
    train = database.task_split("quiet-month", "train")
    # 20 customers (no time column: all exist) at each train timestamp: every 30 days back from
    # April 1 (May 1 - 30 days) while not before the first review (January 1).
    times = sorted({t for t in train.column("timestamp").to_pylist() if t is not None})
    assert times == [datetime(1970, 1, 1), datetime(1970, 1, 31), datetime(1970, 3, 2), datetime(1970, 4, 1)]
    assert train.num_rows == 20 * len(times)
    churn = np.asarray(train.column("target").to_numpy())
    assert set(churn.tolist()) == {0, 1}

    listed = runner.invoke(
        app,
        ["datasets", "task", str(root), "quiet-month", "--replace", "--entity", "customer",
         "--events", "review", "--window", "30d", "--aggregate", "exists",
         "--train-timestamps", "1970-02-01,1970-03-01", "--val-timestamps", "1970-05-01"],
    )  # fmt: skip
    assert listed.exit_code == 0, listed.output
    remade = open_database(root)
    assert remade.task("quiet-month").cutoffs == {"val": "1970-05-01T00:00:00"}
    assert not (root / "tasks" / "quiet-month" / "test.parquet").exists()
    assert remade.task_split("quiet-month", "train").num_rows == 40

    refused = runner.invoke(
        app,
        ["datasets", "task", str(root), "x", "--entity", "customer", "--events", "review", "--window", "30x",
         "--val-timestamp", "1970-05-01", "--test-timestamp", "1970-06-01"],
    )  # fmt: skip
    assert refused.exit_code == 1 and "--window: a duration is a positive whole number" in refused.output
    missing = runner.invoke(
        app,
        ["datasets", "task", str(root), "x", "--entity", "customer", "--events", "review", "--window", "30d"],
    )
    assert missing.exit_code == 1 and "give --val-timestamp and --test-timestamp" in missing.output
