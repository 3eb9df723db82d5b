"""Tasks made from time windows over an event table, as RelBench's entity tasks are made.

At each timestamp t of a split, every entity that exists at t (all rows of an entity table without a
time column; otherwise those created at or before t) gets one row: (entity key, t, target), where the
target aggregates the entity's events with time in (t, t + window]:

    count   the number of events            sum, mean, max, min   of a number column of the events
    exists  1 if there is an event, else 0

With a threshold ("==0", ">=3", ...) the aggregate becomes a 0/1 label (a binary task); without
one it is the label itself (regression), except `exists`, which is binary already. An entity with no
event in its window has count 0, sum 0 and exists 0; its mean, max and min are undefined, so such
rows are left out of those tasks.

The splits' timestamps are given as lists, or made from a validation and a test timestamp as RelBench
does (`stepped_timestamps`): val at its timestamp, test at its own, and train every `step` back from
val - window while the database has rows, so no train window reaches past the validation cutoff.

`write_window_task` writes tasks/<task>/{train,val,test}.parquet and adds the task, with its cutoffs,
to schema.json.
"""

from __future__ import annotations

import itertools
import json
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from relay_engine.errors import DatasetError
from relay_engine.families.rtj.database import SCHEMA_FILE, Database, Table, TaskSpec, column_type, seconds

AGGREGATES: tuple[str, ...] = ("count", "sum", "mean", "max", "min", "exists")
COLUMN_AGGREGATES: tuple[str, ...] = ("sum", "mean", "max", "min")
COMPARISONS: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
TIME_COLUMN = "timestamp"
_TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_THRESHOLD = re.compile(r"\s*(==|!=|<=|>=|<|>)\s*([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)\s*")
_DURATION = re.compile(r"\s*(\d+)\s*(s|m|h|d|w)\s*")
_DURATION_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass(frozen=True)
class Threshold:
    """Turns an aggregate into a 0/1 label: 1 where `aggregate <comparison> value`."""

    comparison: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Threshold:
        """From "==0", ">=3", "<2.5" (one of ==, !=, <, <=, >, >= then a number)."""
        match = _THRESHOLD.fullmatch(text)
        if match is None:
            raise ValueError(
                "threshold must be a comparison (==, !=, <, <=, >, >=) then a number, e.g. '==0', "
                f"got {text!r}"
            )
        return cls(match.group(1), float(match.group(2)))

    def apply(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(COMPARISONS[self.comparison](values, self.value), dtype=np.int64)

    def __str__(self) -> str:
        return f"{self.comparison}{self.value:g}"


def parse_duration(text: str) -> timedelta:
    """A window or step written as a whole number and a unit: 90s, 30m, 12h, 30d, 2w."""
    match = _DURATION.fullmatch(text)
    if match is None or int(match.group(1)) == 0:
        raise ValueError(
            f"a duration is a positive whole number then s, m, h, d or w (e.g. 30d), got {text!r}"
        )
    return timedelta(**{_DURATION_UNITS[match.group(2)]: int(match.group(1))})


@dataclass(frozen=True)
class WindowTask:
    """What to predict: `aggregate` of the `event_table` rows that point to each `entity_table`
    row, over the `window` after each timestamp.

    `column` is the event column for sum, mean, max and min. `event_key` is the event table's
    foreign key to the entity table, needed only when it has several. `threshold` makes a binary
    task; without one the task is regression (binary for `exists`)."""

    name: str
    entity_table: str
    event_table: str
    window: timedelta
    aggregate: str = "count"
    column: str | None = None
    threshold: Threshold | None = None
    event_key: str | None = None
    target_column: str = "target"

    @property
    def problem_type(self) -> str:
        return "binary" if self.threshold is not None or self.aggregate == "exists" else "regression"


@dataclass(frozen=True)
class SplitTimestamps:
    """The timestamps of each split; val and test may be empty (no such split is written)."""

    train: tuple[datetime, ...]
    val: tuple[datetime, ...] = ()
    test: tuple[datetime, ...] = ()

    def of(self) -> dict[str, tuple[datetime, ...]]:
        return {
            split: stamps
            for split, stamps in (("train", self.train), ("val", self.val), ("test", self.test))
            if stamps
        }

    def cutoffs(self) -> dict[str, str]:
        """Each evaluation split's earliest timestamp (ISO, UTC), as schema.json records it."""
        return {split: _iso(min(stamps)) for split, stamps in self.of().items() if split != "train"}


def stepped_timestamps(
    database: Database,
    val_timestamp: datetime,
    test_timestamp: datetime,
    window: timedelta,
    step: timedelta | None = None,
) -> SplitTimestamps:
    """RelBench's splits: val at `val_timestamp`, test at `test_timestamp`, train at val - window,
    then every `step` (default: the window) back while not before the database's earliest time.
    Both evaluation windows must end by the database's latest time, and the window must fit between
    the val and test timestamps."""
    step = step or window
    where = str(database.root)
    first, last = _time_range(database)
    val, test = _seconds(val_timestamp), _seconds(test_timestamp)
    if step <= timedelta(0) or window <= timedelta(0):
        raise DatasetError(where, "window and step must be positive")
    if test - val < window.total_seconds():
        raise DatasetError(
            where,
            f"the window ({window}) must fit between the val and test timestamps "
            f"({_iso(val_timestamp)} and {_iso(test_timestamp)})",
        )
    for split, start in (("val", val), ("test", test)):
        if start + window.total_seconds() > last:
            raise DatasetError(
                where,
                f"{split} timestamp + window ({_iso_at(start + window.total_seconds())}) is later than the "
                f"database's latest time ({_iso_at(last)}): its labels would be cut short",
            )
    train: list[datetime] = []
    at = val - window.total_seconds()
    while at >= first:
        train.append(_from_seconds(at))
        at -= step.total_seconds()
    if not train:
        raise DatasetError(
            where,
            f"no train timestamp: val timestamp - window ({_iso_at(val - window.total_seconds())}) "
            f"is before the database's earliest time ({_iso_at(first)})",
        )
    return SplitTimestamps(tuple(reversed(train)), (_from_seconds(val),), (_from_seconds(test),))


def window_labels(database: Database, task: WindowTask, timestamps: Sequence[datetime]) -> pa.Table:
    """One split's rows: (entity key, timestamp, target) for each entity existing at each timestamp."""
    entity, events, key = _check_task(database, task)
    window = task.window.total_seconds()
    entity_times = seconds(entity.data.column(entity.time_column)) if entity.time_column else None
    owner = _rows_of(entity, events.data.column(key))  # each event's entity row, -1 if none
    event_times = seconds(events.data.column(events.time_column or ""))
    values = _event_values(events, task.column) if task.column else np.ones(events.num_rows)
    rows: list[np.ndarray] = []
    stamps: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    for stamp in sorted(set(_seconds(t) for t in timestamps)):
        exists = np.ones(entity.num_rows, bool) if entity_times is None else entity_times <= stamp
        in_window = (event_times > stamp) & (event_times <= stamp + window) & (owner >= 0)
        aggregate = _aggregate(task.aggregate, owner[in_window], values[in_window], entity.num_rows)
        keep = exists & ~np.isnan(aggregate)
        target = task.threshold.apply(aggregate[keep]) if task.threshold else aggregate[keep]
        picked = np.flatnonzero(keep)
        rows.append(picked)
        stamps.append(np.full(len(picked), round(stamp * 1e6), np.int64))
        targets.append(target)
    picked_rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    target_type = pa.int64() if task.problem_type == "binary" else pa.float64()
    target_values = np.concatenate(targets) if targets else np.zeros(0)
    return pa.table(
        {
            entity.primary_key or "": entity.data.column(entity.primary_key or "").take(picked_rows),
            TIME_COLUMN: pa.array(
                np.concatenate(stamps) if stamps else np.zeros(0, np.int64), pa.int64()
            ).cast(pa.timestamp("us")),
            task.target_column: pa.array(target_values.astype(np.float64)).cast(target_type),
        }
    )


def write_window_task(
    database: Database,
    task: WindowTask,
    timestamps: SplitTimestamps,
    *,
    directory: str | Path | None = None,
    replace: bool = False,
) -> TaskSpec:
    """Write the task's splits under `directory` (default: the database's own) as
    tasks/<name>/<split>.parquet, add it to schema.json with its cutoffs, and return its spec."""
    root = Path(directory) if directory is not None else database.root
    where = str(root)
    if not _TASK_NAME.fullmatch(task.name):
        raise DatasetError(where, f"task name must be letters, digits, '.', '_' or '-', got {task.name!r}")
    schema_path = root / SCHEMA_FILE
    schema = json.loads(schema_path.read_text())
    tasks = schema.setdefault("tasks", {})
    if task.name in tasks and not replace:
        raise DatasetError(
            where,
            f"{SCHEMA_FILE} already has a task {task.name!r} (remake it with --replace, or replace=True)",
        )
    splits = timestamps.of()
    if "train" not in splits:
        raise DatasetError(where, "timestamps: train needs at least one timestamp")
    _check_order(where, timestamps, task.window)
    tables = {split: window_labels(database, task, stamps) for split, stamps in splits.items()}
    if tables["train"].num_rows == 0:
        raise DatasetError(where, f"task {task.name}: no entity has a label at the train timestamps")
    out = root / "tasks" / task.name
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        for suffix in (".parquet", ".csv"):  # a remade task keeps no split of the old one
            (out / f"{split}{suffix}").unlink(missing_ok=True)
    for split, table in tables.items():
        pq.write_table(table, out / f"{split}.parquet")
    entity_column = database.tables[task.entity_table].primary_key or ""
    spec = TaskSpec(
        task.name,
        task.entity_table,
        entity_column,
        TIME_COLUMN,
        task.target_column,
        task.problem_type,
        cutoffs=timestamps.cutoffs() or None,
    )
    entry: dict[str, object] = {
        "entity_table": spec.entity_table,
        "entity_column": spec.entity_column,
        "time_column": spec.time_column,
        "target_column": spec.target_column,
        "problem_type": spec.problem_type,
    }
    if spec.cutoffs:
        entry["cutoffs"] = spec.cutoffs
    tasks[task.name] = entry
    temporary = schema_path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(schema, indent=2) + "\n")
    temporary.replace(schema_path)  # whole or not at all: a half-written schema opens nothing
    return spec


# --- checks ------------------------------------------------------------------------------------


def _check_task(database: Database, task: WindowTask) -> tuple[Table, Table, str]:
    """The entity table, the event table and the event table's key to the entity table."""
    where = str(database.root)
    entity = database.tables.get(task.entity_table)
    if entity is None or entity.primary_key is None:
        raise DatasetError(where, f"entity table {task.entity_table!r} is not a table with a primary_key")
    events = database.tables.get(task.event_table)
    if events is None:
        raise DatasetError(where, f"event table {task.event_table!r} is not a table of the database")
    if events.time_column is None:
        raise DatasetError(where, f"event table {task.event_table!r} has no time_column: windows need one")
    _check_aggregate(where, task, events)
    if task.target_column in (entity.primary_key, TIME_COLUMN):
        raise DatasetError(
            where, f"target_column {task.target_column!r} would clash with the task's key or timestamp column"
        )
    if task.window <= timedelta(0):
        raise DatasetError(where, f"window must be positive, got {task.window}")
    return entity, events, _event_key(where, task, events)


def _event_key(where: str, task: WindowTask, events: Table) -> str:
    """The event table's foreign key to the entity table: `event_key`, or its only one."""
    keys = [column for column, parent in events.foreign_keys.items() if parent == task.entity_table]
    if task.event_key is not None:
        if task.event_key not in keys:
            raise DatasetError(
                where,
                f"event_key {task.event_key!r} is not a foreign key of {task.event_table} "
                f"to {task.entity_table}",
            )
        return task.event_key
    if not keys:
        raise DatasetError(where, f"event table {task.event_table} has no foreign key to {task.entity_table}")
    if len(keys) > 1:
        raise DatasetError(
            where,
            f"event table {task.event_table} has several foreign keys to {task.entity_table} "
            f"({', '.join(keys)}): name one as event_key",
        )
    return keys[0]


def _check_aggregate(where: str, task: WindowTask, events: Table) -> None:
    if task.aggregate not in AGGREGATES:
        raise DatasetError(where, f"aggregate must be one of {', '.join(AGGREGATES)}, got {task.aggregate!r}")
    if task.aggregate in COLUMN_AGGREGATES:
        if task.column is None:
            raise DatasetError(where, f"aggregate {task.aggregate} needs a column of {task.event_table}")
        if task.column not in events.data.column_names or column_type(events, task.column) not in (
            "number",
            "boolean",
        ):
            raise DatasetError(
                where, f"column {task.column!r} must be a number or boolean column of {task.event_table}"
            )
    elif task.column is not None:
        raise DatasetError(where, f"aggregate {task.aggregate} takes no column (got {task.column!r})")
    if task.aggregate == "exists" and task.threshold is not None:
        raise DatasetError(where, "aggregate exists is a 0/1 label already: it takes no threshold")


def _check_order(where: str, timestamps: SplitTimestamps, window: timedelta) -> None:
    """No label window of a split may reach past the next split's cutoff, or the labels of the
    earlier split would hold events of the later one."""
    ordered = [(split, stamps) for split, stamps in timestamps.of().items()]
    for (split, stamps), (later, later_stamps) in itertools.pairwise(ordered):
        if _seconds(max(stamps)) + window.total_seconds() > _seconds(min(later_stamps)):
            raise DatasetError(
                where,
                f"timestamps: the {split} window at {_iso(max(stamps))} ends after the {later} cutoff "
                f"{_iso(min(later_stamps))}; {split} timestamps must be a window ({window}) before it",
            )


# --- arithmetic ---------------------------------------------------------------------------------


def _aggregate(kind: str, owner: np.ndarray, values: np.ndarray, entities: int) -> np.ndarray:
    """Per entity row, the aggregate of its events' values (NaN where undefined: no events to
    take a mean, max or min of). Null values (NaN) are skipped except by count and exists."""
    if kind == "count":
        return np.bincount(owner, minlength=entities).astype(np.float64)
    if kind == "exists":
        return (np.bincount(owner, minlength=entities) > 0).astype(np.float64)
    known = ~np.isnan(values)
    owner, values = owner[known], values[known]
    total = np.bincount(owner, weights=values, minlength=entities)
    if kind == "sum":
        return total
    counts = np.bincount(owner, minlength=entities)
    if kind == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts > 0, total / np.maximum(counts, 1), np.nan)
    extreme = np.full(entities, -np.inf if kind == "max" else np.inf)
    (np.maximum if kind == "max" else np.minimum).at(extreme, owner, values)
    return np.where(counts > 0, extreme, np.nan)


def _event_values(events: Table, column: str) -> np.ndarray:
    values = pc.cast(events.data.column(column), pa.float64())
    return np.asarray(values.to_numpy(zero_copy_only=False), np.float64)


def _rows_of(entity: Table, keys: pa.ChunkedArray) -> np.ndarray:
    """For each key, the row of the entity table that has it (-1 for a null or dangling key)."""
    index = {key: row for row, key in enumerate(entity.data.column(entity.primary_key or "").to_pylist())}
    return np.asarray([index.get(key, -1) if key is not None else -1 for key in keys.to_pylist()], np.int64)


def _time_range(database: Database) -> tuple[float, float]:
    """The earliest and latest time of the tables with a time column."""
    times = [seconds(t.data.column(t.time_column)) for t in database.tables.values() if t.time_column]
    known = np.concatenate([t[np.isfinite(t)] for t in times]) if times else np.zeros(0)
    if not known.size:
        raise DatasetError(str(database.root), "no table has a time column with a time in it")
    return float(known.min()), float(known.max())


def _seconds(moment: datetime) -> float:
    """Seconds since 1970; a naive datetime is read as UTC."""
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _from_seconds(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC).replace(tzinfo=None)


def _iso(moment: datetime) -> str:
    return _from_seconds(_seconds(moment)).isoformat()


def _iso_at(value: float) -> str:
    return _from_seconds(value).isoformat()
