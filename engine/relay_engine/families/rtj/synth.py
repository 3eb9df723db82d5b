"""A small shop database generated in code, for tests, demos and benchmarks, with no download.

Its shape follows RelBench's FakeDataset (product, customer, review with a time column and foreign
keys to both, relations; a few reviews point to customers that do not exist) and its two Amazon
tasks: user-churn (binary: no review in the next 91 days) and user-ltv (regression: the sum of
the prices of the products reviewed in the next 91 days), for customers active in the 91 days
before each timestamp; train timestamps every 91 days before the validation cutoff (80% of the
time span), one validation and one test timestamp (90%).

Unlike RelBench's (whose reviews pick customers uniformly, so churn is noise), each customer here
has an activity rate, and younger customers review more, so the tasks can be learnt from the
review history and the customer's age. Relay generates it itself rather than depend on relbench
2.1.2, which pulls in `datasets`, duckdb, pandas and pooch and pins scikit-learn below 1.7.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DAY = 86_400
WINDOW_DAYS = 91


def write_fake_shop(
    root: str | Path, *, customers: int = 100, products: int = 30, reviews: int = 600, seed: int = 0
) -> Path:
    """Write the shop database to `root` (tables, schema.json, tasks user-churn and user-ltv)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    (root / "tables").mkdir(parents=True, exist_ok=True)
    # The tables in the order they draw from `rng`, so a seed gives the same shop.
    product, price = _products(rng, products)
    customer, activity = _customers(rng, customers)
    review, log = _reviews(rng, customers, products, reviews, activity)
    relations = pa.table(
        {
            "customer_id": [f"customer_{int(c)}" for c in rng.integers(0, customers, 20)],
            "product_id": [f"product_{int(p)}" for p in rng.integers(0, products, 20)],
        }
    )
    for name, table in {
        "product": product,
        "customer": customer,
        "review": review,
        "relations": relations,
    }.items():
        pq.write_table(table, root / "tables" / f"{name}.parquet")
    _write_tasks(root, log, price)
    _write_schema(root)
    return root


def _products(rng: np.random.Generator, products: int) -> tuple[pa.Table, np.ndarray]:
    """The product table, and each product's price."""
    price = np.round(rng.random(products) * 10, 2)
    categories = [None, "toy", "health", "toy, health"]
    product = pa.table(
        {
            "product_id": [f"product_{i}" for i in range(products)],
            "category": [categories[i % len(categories)] for i in range(products)],
            "title": [
                "".join(rng.choice(list(string.ascii_lowercase), rng.integers(5, 12)))
                for _ in range(products)
            ],
            "price": price,
        }
    )
    return product, price


def _customers(rng: np.random.Generator, customers: int) -> tuple[pa.Table, np.ndarray]:
    """The customer table, and each customer's activity rate (the younger review more)."""
    activity = np.exp(rng.normal(0.0, 1.0, customers))
    age = np.clip(np.round(45 - 6 * np.log(activity) + rng.normal(0, 3, customers)), 16, 80).astype(np.int64)
    customer = pa.table(
        {
            "customer_id": [f"customer_{i}" for i in range(customers)],
            "age": age,
            "gender": ["female" if i % 2 else "male" for i in range(customers)],
        }
    )
    return customer, activity


@dataclass(frozen=True)
class _ReviewLog:
    """The reviews as the tasks read them: per review, its customer, product and day."""

    who: np.ndarray
    what: np.ndarray
    day: np.ndarray
    known: np.ndarray  # False where the review points to a customer that does not exist


def _reviews(
    rng: np.random.Generator, customers: int, products: int, reviews: int, activity: np.ndarray
) -> tuple[pa.Table, _ReviewLog]:
    """The review table (one review every other day, a customer picked by activity; about 1% point
    to customers that do not exist), and the log of it the tasks are computed from."""
    who = rng.choice(customers, size=reviews, p=activity / activity.sum())
    dangling = rng.random(reviews) < 0.01
    what = rng.integers(0, products, reviews)
    day = 2 * np.arange(reviews)
    rating = rng.integers(1, 6, reviews)
    review = pa.table(
        {
            "customer_id": [
                f"customer_{customers + 1 + int(c) % 5}" if d else f"customer_{c}"
                for c, d in zip(who, dangling, strict=True)
            ],
            "product_id": [f"product_{p}" for p in what],
            "review_time": pa.array(day * DAY * 1_000_000, pa.timestamp("us")),
            "rating": rating,
            "review": ["positive" if r > 3 else "negative" for r in rating],
        }
    )
    return review, _ReviewLog(who=who, what=what, day=day, known=~dangling)


def _write_tasks(root: Path, log: _ReviewLog, price: np.ndarray) -> None:
    """user-churn and user-ltv, each split into train (every WINDOW_DAYS before the validation
    cutoff at 80% of the span), val and test (90%)."""
    span = log.day[-1]
    val_day, test_day = int(0.8 * span), int(0.9 * span)
    train_days = list(range(val_day - WINDOW_DAYS, 0, -WINDOW_DAYS))
    for task, column in (("user-churn", "churn"), ("user-ltv", "ltv")):
        directory = root / "tasks" / task
        directory.mkdir(parents=True, exist_ok=True)
        for split, days in (("train", train_days), ("val", [val_day]), ("test", [test_day])):
            pq.write_table(_task_rows(log, price, column, days), directory / f"{split}.parquet")


def _task_rows(log: _ReviewLog, price: np.ndarray, column: str, days: list[int]) -> pa.Table:
    """One split of a task: at each of `days`, a row per customer who reviewed in the window before
    it, labelled by the window after it (churn: no review; ltv: the prices of those reviewed)."""
    rows: dict[str, list[object]] = {"timestamp": [], "customer_id": [], column: []}
    for t in days:
        before = log.known & (log.day > t - WINDOW_DAYS) & (log.day <= t)
        after = log.known & (log.day > t) & (log.day <= t + WINDOW_DAYS)
        for c in np.unique(log.who[before]):
            mine = after & (log.who == c)
            rows["timestamp"].append(int(t) * DAY * 1_000_000)
            rows["customer_id"].append(f"customer_{c}")
            rows[column].append(
                int(not mine.any()) if column == "churn" else float(price[log.what[mine]].sum())
            )
    return pa.table(
        {
            "timestamp": pa.array(rows["timestamp"], pa.timestamp("us")),
            "customer_id": pa.array(rows["customer_id"], pa.string()),
            column: pa.array(rows[column], pa.int64() if column == "churn" else pa.float64()),
        }
    )


def _write_schema(root: Path) -> None:
    """schema.json: the keys, the review table's time column, and the two tasks."""
    schema = {
        "tables": {
            "product": {"primary_key": "product_id"},
            "customer": {"primary_key": "customer_id"},
            "review": {
                "foreign_keys": {"customer_id": "customer", "product_id": "product"},
                "time_column": "review_time",
            },
            "relations": {"foreign_keys": {"customer_id": "customer", "product_id": "product"}},
        },
        "tasks": {
            "user-churn": _task("churn", "binary"),
            "user-ltv": _task("ltv", "regression"),
        },
    }
    (root / "schema.json").write_text(json.dumps(schema, indent=2) + "\n")


def _task(target: str, problem_type: str) -> dict[str, str]:
    return {
        "entity_table": "customer",
        "entity_column": "customer_id",
        "time_column": "timestamp",
        "target_column": target,
        "problem_type": problem_type,
    }
