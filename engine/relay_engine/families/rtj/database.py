"""A relational database on disk: tables, a schema file and task tables.

    shop/
      schema.json                   primary keys, foreign keys, time columns, tasks
      tables/customer.parquet       one file per table: .parquet or .csv
      tables/review.csv
      tasks/user-churn/train.parquet, val.parquet, test.parquet

schema.json:
    {"tables": {
        "customer": {"primary_key": "customer_id"},
        "review": {"foreign_keys": {"customer_id": "customer", "product_id": "product"},
                   "time_column": "review_time",
                   "column_types": {"rating": "number"}}},
     "tasks": {
        "user-churn": {"entity_table": "customer", "entity_column": "customer_id",
                       "time_column": "timestamp", "target_column": "churn",
                       "problem_type": "binary"}}}

Column types are read from the files (numbers, booleans, datetimes, text: anything else is shown as
text); `column_types` overrides them. Every problem names the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from relay_engine.errors import DatasetError

SCHEMA_FILE = "schema.json"
SPLITS: tuple[str, ...] = ("train", "val", "test")
COLUMN_TYPES: tuple[str, ...] = ("number", "text", "datetime", "boolean")
TASK_PROBLEM_TYPES: tuple[str, ...] = ("binary", "regression")
MAX_FOREIGN_KEYS = 5  # a row's parents travel in f2p_nbr_idxs, which has five slots


@dataclass
class Table:
    name: str
    data: pa.Table
    primary_key: str | None = None
    foreign_keys: dict[str, str] = field(default_factory=dict)
    time_column: str | None = None
    column_types: dict[str, str] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.data.num_rows)

    def value_columns(self) -> list[str]:
        """The columns that become cells: all but the keys."""
        keys = {self.primary_key, *self.foreign_keys}
        return [name for name in self.data.column_names if name not in keys]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    entity_table: str
    entity_column: str
    time_column: str
    target_column: str
    problem_type: str
    # Optional: the split cutoffs the task was made with ({"val": ISO datetime, "test": ...}), as
    # written by tasks.py; kept so the task can be remade and reported, not used for sampling.
    cutoffs: dict[str, str] | None = field(default=None, hash=False)


@dataclass
class Database:
    """Tables by name, the tasks the schema defines, and where they came from."""

    root: Path
    tables: dict[str, Table]
    tasks: dict[str, TaskSpec]

    def task_split(self, task: str, split: str) -> pa.Table:
        spec = self.task(task)
        if split not in SPLITS:
            raise DatasetError(str(self.root), f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        path = _table_file(self.root / "tasks" / task, split)
        if path is None:
            raise DatasetError(
                str(self.root), f"task {task} has no {split} split (tasks/{task}/{split}.parquet or .csv)"
            )
        data = _read_table(path, self.root)
        for column in (spec.entity_column, spec.time_column, spec.target_column):
            if column not in data.column_names:
                raise DatasetError(str(self.root), f"{path.name} of task {task} has no column {column!r}")
        return data

    def task(self, name: str) -> TaskSpec:
        if name not in self.tasks:
            known = ", ".join(self.tasks) or "none"
            raise DatasetError(str(self.root), f"no task {name!r} in {SCHEMA_FILE} (tasks: {known})")
        return self.tasks[name]


def is_database(path: Path) -> bool:
    """Whether a directory is a relational database (it has a schema.json with tables)."""
    return (path / SCHEMA_FILE).is_file() and (path / "tables").is_dir()


def open_database(root: str | Path) -> Database:
    root = Path(root).expanduser()
    where = str(root)
    if not root.is_dir():
        raise DatasetError(where, f"no such directory: {root}")
    schema_path = root / SCHEMA_FILE
    if not schema_path.is_file():
        raise DatasetError(
            where, f"a relational database needs {SCHEMA_FILE} (primary keys, foreign keys, tasks)"
        )
    try:
        schema = json.loads(schema_path.read_text())
    except json.JSONDecodeError as error:
        raise DatasetError(where, f"{SCHEMA_FILE} is not valid JSON: {error}") from None
    if not isinstance(schema, dict) or not isinstance(schema.get("tables"), dict) or not schema["tables"]:
        raise DatasetError(where, f"{SCHEMA_FILE}: tables must be an object naming at least one table")
    tables = {name: _load_table(root, name, spec) for name, spec in schema["tables"].items()}
    for table in tables.values():
        _check_keys(where, table, tables)
    tasks_spec = schema.get("tasks", {})
    if not isinstance(tasks_spec, dict):
        raise DatasetError(where, f"{SCHEMA_FILE}: tasks must be an object")
    tasks = {name: _task_spec(where, name, spec, tables) for name, spec in tasks_spec.items()}
    return Database(root, tables, tasks)


def _load_table(root: Path, name: str, spec: Any) -> Table:
    where = str(root)
    if not isinstance(spec, dict):
        raise DatasetError(where, f"{SCHEMA_FILE}: tables.{name} must be an object")
    unknown = set(spec) - {"primary_key", "foreign_keys", "time_column", "column_types"}
    if unknown:
        raise DatasetError(
            where,
            f"{SCHEMA_FILE}: tables.{name} has unknown fields {sorted(unknown)} "
            "(known: primary_key, foreign_keys, time_column, column_types)",
        )
    path = _table_file(root / "tables", name)
    if path is None:
        raise DatasetError(where, f"table {name} has no file tables/{name}.parquet or tables/{name}.csv")
    data = _read_table(path, root)
    foreign_keys = spec.get("foreign_keys", {}) or {}
    column_types = spec.get("column_types", {}) or {}
    if not isinstance(foreign_keys, dict) or not isinstance(column_types, dict):
        raise DatasetError(
            where, f"{SCHEMA_FILE}: tables.{name}.foreign_keys and column_types must be objects"
        )
    if len(foreign_keys) > MAX_FOREIGN_KEYS:
        raise DatasetError(where, f"tables.{name}: at most {MAX_FOREIGN_KEYS} foreign keys per table")
    table = Table(
        name, data, spec.get("primary_key"), dict(foreign_keys), spec.get("time_column"), dict(column_types)
    )
    for column in (
        [c for c in (table.primary_key, table.time_column) if c] + list(foreign_keys) + list(column_types)
    ):
        if column not in data.column_names:
            raise DatasetError(where, f"tables.{name}: {path.name} has no column {column!r}")
    for column, kind in column_types.items():
        if kind not in COLUMN_TYPES:
            raise DatasetError(
                where,
                f"tables.{name}.column_types.{column}: {kind!r} (must be one of {', '.join(COLUMN_TYPES)})",
            )
    if table.time_column and not _is_datetime_like(data.column(table.time_column).type):
        raise DatasetError(where, f"tables.{name}.time_column {table.time_column!r} must hold datetimes")
    return table


def _check_keys(where: str, table: Table, tables: dict[str, Table]) -> None:
    for column, parent in table.foreign_keys.items():
        if parent not in tables:
            raise DatasetError(where, f"tables.{table.name}.foreign_keys.{column} names no table: {parent!r}")
        if tables[parent].primary_key is None:
            raise DatasetError(
                where,
                f"tables.{table.name}.foreign_keys.{column} points to {parent}, which has no primary_key",
            )
    if table.primary_key:
        keys = table.data.column(table.primary_key)
        if keys.null_count or len(pc.unique(keys)) != table.num_rows:
            raise DatasetError(
                where, f"tables.{table.name}.primary_key {table.primary_key!r} must be unique and set"
            )


def _task_spec(where: str, name: str, spec: Any, tables: dict[str, Table]) -> TaskSpec:
    needed = ("entity_table", "entity_column", "time_column", "target_column", "problem_type")
    if not isinstance(spec, dict) or any(not isinstance(spec.get(key), str) for key in needed):
        raise DatasetError(where, f"{SCHEMA_FILE}: tasks.{name} must set {', '.join(needed)}")
    if spec["entity_table"] not in tables or tables[spec["entity_table"]].primary_key is None:
        raise DatasetError(
            where, f"tasks.{name}.entity_table {spec['entity_table']!r} is not a table with a primary_key"
        )
    if spec["problem_type"] not in TASK_PROBLEM_TYPES:
        raise DatasetError(
            where,
            f"tasks.{name}.problem_type {spec['problem_type']!r} (must be {' or '.join(TASK_PROBLEM_TYPES)})",
        )
    entity_table, entity_column, time_column, target_column, problem_type = (str(spec[key]) for key in needed)
    return TaskSpec(
        name,
        entity_table,
        entity_column,
        time_column,
        target_column,
        problem_type,
        cutoffs=_task_cutoffs(where, name, spec),
    )


def _task_cutoffs(where: str, name: str, spec: dict[str, Any]) -> dict[str, str] | None:
    """The optional `cutoffs` of a task: an object from "val"/"test" to ISO datetimes."""
    cutoffs = spec.get("cutoffs")
    if cutoffs is None:
        return None
    rule = 'an object from "val" or "test" to ISO datetimes, e.g. {"val": "2024-01-01T00:00:00"}'
    if not isinstance(cutoffs, dict) or not set(cutoffs) <= {"val", "test"}:
        raise DatasetError(where, f"{SCHEMA_FILE}: tasks.{name}.cutoffs must be {rule}")
    for split, value in cutoffs.items():
        try:
            datetime.fromisoformat(value)
        except (TypeError, ValueError):
            raise DatasetError(
                where, f"{SCHEMA_FILE}: tasks.{name}.cutoffs.{split} must be an ISO datetime, got {value!r}"
            ) from None
    return dict(cutoffs)


def _table_file(directory: Path, name: str) -> Path | None:
    for suffix in (".parquet", ".csv"):
        path = directory / (name + suffix)
        if path.is_file():
            return path
    return None


def _read_table(path: Path, root: Path) -> pa.Table:
    try:
        return pq.read_table(path) if path.suffix == ".parquet" else pa_csv.read_csv(path)
    except (pa.ArrowException, OSError) as error:
        raise DatasetError(str(root), f"cannot read {path.relative_to(root)}: {error}") from None


def _is_datetime_like(kind: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(kind) or pa.types.is_date(kind))


def column_type(table: Table, column: str) -> str:
    """number, boolean, datetime or text: the schema's word, else the file's type."""
    if column in table.column_types:
        return table.column_types[column]
    kind = table.data.column(column).type
    if pa.types.is_boolean(kind):
        return "boolean"
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "number"
    if _is_datetime_like(kind):
        return "datetime"
    return "text"


def seconds(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Datetimes as float seconds since 1970 (NaN for nulls)."""
    kind = values.type
    unit = pa.timestamp("us") if pa.types.is_date(kind) else pa.timestamp("us", tz=kind.tz)
    micros = pc.cast(pc.cast(values, unit), pa.int64())
    # Unsafe: past the year 2255 microseconds exceed 2**53 and a float64 rounds them, which is fine.
    as_float = pc.cast(micros, pa.float64(), safe=False)
    return np.asarray(as_float.to_numpy(zero_copy_only=False), dtype=np.float64) / 1e6
