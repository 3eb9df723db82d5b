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

`open_database` also takes a SQL database's URL (sqlite:///shop.db, postgresql://host/db): it reads
one consistent snapshot of it into a directory of this layout under the cache
(relay_engine.families.rtj.sql), and opens that. A `tasks_dir` holds the tasks kept apart from the
database: a schema.json whose `tasks` section defines them, and their splits as
tasks_dir/<task>/<split>.parquet or .csv.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from relay.dataset_names import is_database_url, is_relbench_name, redacted_url
from relay.events import SnapshotEvent
from relay_engine.errors import DatasetError
from relay_engine.families.rtj.mapped import memory_mapped_table
from relay_engine.paths import cache_dir_or_default, note_use

SCHEMA_FILE = "schema.json"
# What a snapshot of a SQL database records of where and when it was read (no password).
SNAPSHOT_FILE = "snapshot.json"
# What a directory converted from a RelBench dataset records of what it was made from (relbench_source).
RELBENCH_MARKER_FILE = "relbench.json"
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


@dataclass(frozen=True)
class DatabaseSnapshot:
    """A SQL database read into a database directory: where it is, the URL it was read from (its
    password hidden), each table's rows, and when (ISO 8601, UTC)."""

    path: Path
    source: str
    row_counts: dict[str, int]
    taken_at: str = ""

    def event(self, step: int) -> SnapshotEvent:
        """The snapshot as a run reports it (a job's, or `relay local train`'s)."""
        return SnapshotEvent(
            step=step,
            source=self.source,
            path=str(self.path),
            taken_at=self.taken_at,
            row_counts=dict(self.row_counts),
        )


@dataclass
class Database:
    """Tables by name, the tasks the schema defines, and where they came from: `root`, the
    directory; `tasks_dir`, the directory of its tasks when they are kept apart from it (None:
    root/tasks); `snapshot`, for a directory read from a SQL database, what was read and from where."""

    root: Path
    tables: dict[str, Table]
    tasks: dict[str, TaskSpec]
    tasks_dir: Path | None = None
    snapshot: DatabaseSnapshot | None = None

    @property
    def tasks_root(self) -> Path:
        """Where the task splits are: <tasks_root>/<task>/<split>.parquet or .csv."""
        return self.tasks_dir if self.tasks_dir is not None else self.root / "tasks"

    @property
    def source(self) -> str:
        """What the database was read from, to show: the URL (password hidden) or the directory."""
        return self.snapshot.source if self.snapshot is not None else str(self.root)

    def split_file(self, task: str, split: str) -> Path | None:
        """The file holding a task's split, if there is one."""
        return _table_file(self.tasks_root / task, split)

    def has_split(self, task: str, split: str) -> bool:
        return self.split_file(task, split) is not None

    def task_split(self, task: str, split: str) -> pa.Table:
        spec = self.task(task)
        if split not in SPLITS:
            raise DatasetError(self.source, f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        path = self.split_file(task, split)
        # Files are named relative to the directory (tasks/...), or in full in a tasks_dir elsewhere.
        shown_from = self.root if self.tasks_root.is_relative_to(self.root) else self.tasks_root.parent
        if path is None:
            where = (self.tasks_root / task / split).relative_to(shown_from)
            raise DatasetError(self.source, f"task {task} has no {split} split ({where}.parquet or .csv)")
        data = _read_table(path, shown_from)
        for column in (spec.entity_column, spec.time_column, spec.target_column):
            if column not in data.column_names:
                raise DatasetError(self.source, f"{path.name} of task {task} has no column {column!r}")
        return data

    def task(self, name: str) -> TaskSpec:
        if name not in self.tasks:
            known = ", ".join(self.tasks) or "none"
            raise DatasetError(self.source, f"no task {name!r} in {SCHEMA_FILE} (tasks: {known})")
        return self.tasks[name]


def is_database(path: Path) -> bool:
    """Whether a directory is a relational database (it has a schema.json with tables)."""
    return (path / SCHEMA_FILE).is_file() and (path / "tables").is_dir()


def open_database(
    source: str | Path, tasks_dir: str | Path | None = None, *, cache_dir: str | Path | None = None
) -> Database:
    """The database in a directory, or a fresh snapshot of the SQL database a URL names (see
    relay_engine.families.rtj.sql), written under `cache_dir` (RELAY_CACHE_DIR or ~/.cache/relay by
    default), or a RelBench dataset named `relbench:<dataset>[/<task>]`, converted through the
    relbench package (relay_engine.families.rtj.relbench_source). `tasks_dir`: where the tasks are,
    when they are kept apart from the database (a schema.json defining them, and
    tasks_dir/<task>/<split>.parquet or .csv).

    Given a `cache_dir`, each table is decoded once into an Arrow IPC file under
    `<cache_dir>/rtj-tables` and opened memory-mapped (mapped.py): `Table.data` is then a pyarrow
    Table over the file's pages rather than over worker memory. Without one, tables are read into
    memory."""
    tasks_root = Path(tasks_dir).expanduser().absolute() if tasks_dir is not None else None
    tables_cache = cache_dir_or_default(cache_dir) / "rtj-tables" if cache_dir is not None else None
    if isinstance(source, str) and is_database_url(source):
        return _open_snapshot(source, tasks_root, cache_dir_or_default(cache_dir), tables_cache)
    if isinstance(source, str) and is_relbench_name(source):
        from relay_engine.families.rtj.relbench_source import relbench_database

        source = relbench_database(source)  # converted once into the cache, then a directory
    database = _open_directory(Path(source).expanduser(), tables_cache)
    if tasks_root is not None:
        database.tasks = {**database.tasks, **_overlay_tasks(tasks_root, database.tables)}
        database.tasks_dir = tasks_root
    return database


def snapshot_directory(source: str, tasks_dir: Path | None = None, cache_dir: Path | None = None) -> Path:
    """Where a new snapshot of the database at `source` goes: one directory per snapshot, under a
    folder of the cache named for the URL (its password hidden) and the tasks_dir. open_database
    never reuses one: each open reads the database as it is then, and a model trained on one keeps
    reading the rows it was trained on (a resumed job opens its snapshot by path)."""
    key = hashlib.sha256(f"{redacted_url(source)}\0{tasks_dir or ''}".encode()).hexdigest()[:16]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return cache_dir_or_default(cache_dir) / "databases" / key / f"{stamp}-{uuid4().hex[:8]}"


def _open_snapshot(
    url: str, tasks_dir: Path | None, cache_dir: Path, tables_cache: Path | None = None
) -> Database:
    from relay_engine.families.rtj.sql import snapshot_database

    snapshot = snapshot_database(url, snapshot_directory(url, tasks_dir, cache_dir), tasks_dir)
    try:
        database = _open_directory(snapshot.path, tables_cache)
    except DatasetError as error:
        # A snapshot that does not open is of no use to anyone: its problem, named by the URL.
        shutil.rmtree(snapshot.path, ignore_errors=True)
        raise DatasetError(snapshot.source, error.problem, reason=error.reason) from None
    database.snapshot = snapshot
    return database


def _overlay_tasks(tasks_dir: Path, tables: dict[str, Table]) -> dict[str, TaskSpec]:
    """The tasks a tasks_dir's schema.json defines (a tasks_dir without one adds none)."""
    where = str(tasks_dir)
    overlay = read_overlay(tasks_dir, where)
    if overlay.get("tables"):
        raise DatasetError(
            where,
            f"{SCHEMA_FILE}: tables here apply to a database read by URL; a directory's tables are "
            "described by its own schema.json",
        )
    return {name: _task_spec(where, name, spec, tables) for name, spec in overlay.get("tasks", {}).items()}


def read_overlay(tasks_dir: Path | None, source: str) -> dict[str, Any]:
    """A tasks_dir's schema.json (empty without one): `tables` (what a database read by URL does
    not declare) and `tasks`, each an object of objects. Problems are named by `source`."""
    if tasks_dir is None:
        return {}
    tasks_dir = Path(tasks_dir).expanduser()
    if not tasks_dir.is_dir():
        raise DatasetError(
            source, f"tasks_dir: no such directory: {tasks_dir}", reason=DatasetError.NOT_FOUND
        )
    path = tasks_dir / SCHEMA_FILE
    if not path.is_file():
        return {}
    try:
        overlay = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise DatasetError(source, f"{path} is not valid JSON: {error}") from None
    if not isinstance(overlay, dict):
        raise DatasetError(source, f"{path} must be an object with tables and tasks")
    unknown = set(overlay) - {"tables", "tasks"}
    if unknown:
        raise DatasetError(source, f"{path} has unknown fields {sorted(unknown)} (known: tables, tasks)")
    for section in ("tables", "tasks"):
        if not isinstance(overlay.get(section, {}), dict):
            raise DatasetError(source, f"{path}: {section} must be an object")
        for name, spec in overlay.get(section, {}).items():
            if not isinstance(spec, dict):
                raise DatasetError(source, f"{path}: {section}.{name} must be an object")
    return overlay


def read_snapshot_record(root: Path) -> DatabaseSnapshot | None:
    """snapshot.json of a directory read from a SQL database (None for any other directory)."""
    try:
        record = json.loads((root / SNAPSHOT_FILE).read_text())
        counts = record["row_counts"]
        return DatabaseSnapshot(
            root, str(record["source"]), {str(k): int(v) for k, v in counts.items()}, str(record["taken_at"])
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _open_directory(root: Path, tables_cache: Path | None = None) -> Database:
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
    tables = {name: _load_table(root, name, spec, tables_cache) for name, spec in schema["tables"].items()}
    for table in tables.values():
        _check_keys(where, table, tables)
    tasks_spec = schema.get("tasks", {})
    if not isinstance(tasks_spec, dict):
        raise DatasetError(where, f"{SCHEMA_FILE}: tasks must be an object")
    tasks = {name: _task_spec(where, name, spec, tables) for name, spec in tasks_spec.items()}
    snapshot = read_snapshot_record(root)
    if snapshot is not None or (root / RELBENCH_MARKER_FILE).is_file():
        note_use(root)  # a snapshot or conversion in the cache: `relay cache` prunes by last use
    return Database(root, tables, tasks, snapshot=snapshot)


def _load_table(root: Path, name: str, spec: Any, tables_cache: Path | None = None) -> Table:
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
    data = _read_table(path, root, tables_cache)
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


def _read_table(path: Path, root: Path, mapped_under: Path | None = None) -> pa.Table:
    """The table in a .parquet or .csv file; with `mapped_under`, over a memory map of its Arrow
    copy there (mapped.py)."""

    def decode(source: Path) -> pa.Table:
        return pq.read_table(source) if source.suffix == ".parquet" else pa_csv.read_csv(source)

    try:
        return decode(path) if mapped_under is None else memory_mapped_table(path, decode, mapped_under)
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
