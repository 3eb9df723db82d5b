"""A SQL database as an RT-J database: one consistent snapshot of it, written as a database directory.

    snapshot_database("postgresql://relay@db.internal/shop", Path("shop-snapshot"))

reads every table of the database inside one read-only transaction (PostgreSQL and MySQL: REPEATABLE
READ, so every table is read as of one moment; SQLite: one read transaction), and writes what
`open_database` reads from a directory:

    shop-snapshot/
      schema.json                   made from the database's keys and types, and the overlay
      snapshot.json                 {"source": the URL without its password, "taken_at", "row_counts"}
      tables/<table>.parquet
      tasks/<task>/<split>.parquet  the task tables <task>_train, _val, _test, and the tasks_dir's splits

The schema comes from the database: a table's single-column primary key, its single-column foreign
keys that point at another table's primary key, its columns' types, and its time column (its one
DATE/DATETIME/TIMESTAMP column, if it has exactly one). A `schema.json` in `tasks_dir` (today's
format, every field optional) adds what the database does not declare: a table's primary_key,
time_column and column_types override the database's, its foreign_keys replace them, and its `tasks`
define the tasks. A task found as tables of the database and not defined there is inferred when its
table leaves no doubt (one link to an entity table, one datetime column, one other column).

The URL's password is never written, logged or put in a message: every message names the URL as
`redacted_url` shows it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from relay.dataset_names import is_database_url, redacted_url
from relay_engine.errors import DatasetError
from relay_engine.families.rtj.database import (
    MAX_FOREIGN_KEYS,
    SCHEMA_FILE,
    SNAPSHOT_FILE,
    SPLITS,
    DatabaseSnapshot,
    read_overlay,
)

__all__ = ["DatabaseSnapshot", "snapshot_database"]

# The package that provides each DBAPI driver SQLAlchemy names (the part after `+` in a URL).
DRIVER_PACKAGES: dict[str, str] = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "pg8000": "pg8000",
    "mysqldb": "mysqlclient",
    "pymysql": "pymysql",
    "mysqlconnector": "mysql-connector-python",
    "mariadbconnector": "mariadb",
}
_TASK_TABLE = re.compile(rf"(.+)_({'|'.join(SPLITS)})")
# Rows fetched from the database at a time, so a big table is not held twice as Python objects.
_FETCH_ROWS = 50_000


def snapshot_database(url: str, target: Path, tasks_dir: Path | None = None) -> DatabaseSnapshot:
    """Read the database at `url` in one transaction and write it as a database directory at
    `target` (which must not exist yet); `tasks_dir` adds an overlay schema.json and task splits.
    A failed snapshot leaves nothing at `target`."""
    source = redacted_url(url)
    if not is_database_url(url):
        raise DatasetError(
            source,
            "not a database URL: name one such as sqlite:///shop.db or postgresql://host/db",
            reason=DatasetError.BAD_NAME,
        )
    target = Path(target)
    if target.exists():
        raise DatasetError(source, f"cannot write the snapshot: {target} already exists")
    overlay = read_overlay(tasks_dir, source)
    password = make_url(url).password
    engine = _engine(url, source)
    try:
        with _read_transaction(engine) as connection:
            taken_at = datetime.now(UTC)
            reflected = _reflect(connection)
            data = {name: _rows_of(source, connection, table) for name, table in reflected.tables.items()}
    except SQLAlchemyError as error:
        raise DatasetError(
            source,
            f"cannot read the database: {_driver_message(error, password)}",
            reason=DatasetError.UNAVAILABLE,
        ) from None
    finally:
        engine.dispose()
    if not data:
        raise DatasetError(source, "the database has no tables", reason=DatasetError.NOT_FOUND)
    layout = _Layout.of(source, reflected, data, overlay, tasks_dir)
    row_counts = {name: data[name].num_rows for name in layout.tables}
    snapshot = DatabaseSnapshot(target, source, row_counts, taken_at.isoformat())
    _write_atomically(target, source, lambda directory: layout.write(directory, data, snapshot))
    return snapshot


# --- connecting ---------------------------------------------------------------------------------


def _engine(url: str, source: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite_file(parsed, source)
    parsed = _with_installed_postgresql_driver(parsed)
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise DatasetError(
            source,
            f"unknown database driver {parsed.drivername!r} (for example postgresql+psycopg, "
            "mysql+pymysql or sqlite)",
            reason=DatasetError.BAD_NAME,
        ) from None
    if dialect.is_async:
        raise DatasetError(
            source,
            f"{parsed.drivername} is an asyncio driver; name a plain one such as postgresql+psycopg",
            reason=DatasetError.BAD_NAME,
        )
    try:
        return sa.create_engine(parsed, poolclass=sa.pool.NullPool)
    except ImportError as error:
        driver = parsed.get_driver_name()
        package = DRIVER_PACKAGES.get(driver, getattr(error, "name", None) or driver)
        raise DatasetError(
            source,
            f"the database driver {driver} is not installed: pip install '{package}'",
            reason=DatasetError.UNAVAILABLE,
        ) from None
    except ArgumentError:  # its words may quote the URL, password and all
        raise DatasetError(
            source, "not a usable database URL (SQLAlchemy refused its options)", reason=DatasetError.BAD_NAME
        ) from None


def _check_sqlite_file(url: URL, source: str) -> None:
    # SQLite creates a missing file on connect: a typo would read as an empty database.
    name = url.database
    if name and name.startswith("file:"):
        return  # a URI filename (sqlite:///file:shop.db?mode=ro&uri=true): the driver opens it as told
    if not name or name == ":memory:":
        raise DatasetError(
            source, "names no database file (sqlite:///shop.db, or sqlite:////abs/path/shop.db)"
        )
    path = Path(name).expanduser()
    if not path.is_file():
        raise DatasetError(source, f"no such SQLite file: {path.absolute()}", reason=DatasetError.NOT_FOUND)


def _with_installed_postgresql_driver(url: URL) -> URL:
    """postgresql:// means psycopg2 to SQLAlchemy; where only psycopg (3) is installed, use that."""
    if url.drivername != "postgresql":
        return url
    for module, driver in (("psycopg2", "psycopg2"), ("psycopg", "psycopg")):
        try:
            __import__(module)
        except ImportError:
            continue
        return url.set(drivername=f"postgresql+{driver}")
    return url


@contextmanager
def _read_transaction(engine: Engine) -> Iterator[Connection]:
    """One connection in one read transaction: every table is read as of the same moment."""
    if engine.dialect.name == "sqlite":
        # pysqlite opens no transaction before a SELECT; with the driver's own handling off, an
        # explicit BEGIN holds one read transaction across every table.
        with engine.connect() as plain:
            connection = plain.execution_options(isolation_level="AUTOCOMMIT")
            connection.exec_driver_sql("BEGIN")
            try:
                yield connection
            finally:
                connection.exec_driver_sql("ROLLBACK")
        return
    options: dict[str, Any] = {"isolation_level": "REPEATABLE READ"}
    if engine.dialect.name == "postgresql":
        options["postgresql_readonly"] = True
    with engine.connect() as plain:
        connection = plain.execution_options(**options)
        with connection.begin() as transaction:
            yield connection
            transaction.rollback()  # nothing was written; nothing to commit


def _driver_message(error: SQLAlchemyError, password: str | None) -> str:
    """The driver's own words, first line, without the SQL statement or the password."""
    original = getattr(error, "orig", None) or error
    lines = [line.strip() for line in str(original).splitlines() if line.strip()]
    message = lines[0] if lines else type(original).__name__
    if password:
        message = message.replace(password, "***")
    return message


# --- reading ------------------------------------------------------------------------------------


def _reflect(connection: Connection) -> sa.MetaData:
    metadata = sa.MetaData()
    metadata.reflect(bind=connection, views=False)
    return metadata


def _rows_of(source: str, connection: Connection, table: sa.Table) -> pa.Table:
    try:
        return _read_rows(connection, table)
    except (ValueError, TypeError, OverflowError, pa.ArrowException) as error:
        # A value its column's type does not hold (SQLite keeps any value in any column), or a
        # date SQLAlchemy cannot parse: named with the table, as a DatasetError.
        raise DatasetError(source, f"table {table.name}: cannot read its rows: {error}") from None


def _read_rows(connection: Connection, table: sa.Table) -> pa.Table:
    columns = list(table.columns)
    types = [_arrow_type(column.type) for column in columns]
    batches = []
    result = connection.execute(sa.select(table))
    for rows in result.partitions(_FETCH_ROWS):
        values = list(zip(*rows, strict=True)) if rows else [() for _ in columns]
        arrays = [_arrow_array(list(v), kind) for v, kind in zip(values, types, strict=True)]
        batches.append(pa.record_batch(arrays, names=[column.name for column in columns]))
    if not batches:
        return pa.table(
            {
                column.name: pa.array([], kind or pa.string())
                for column, kind in zip(columns, types, strict=True)
            }
        )
    return pa.Table.from_batches(batches)


def _arrow_type(kind: sa.types.TypeEngine[Any]) -> pa.DataType | None:
    """The Arrow type a SQL column's values become; None: whatever its values are (SQLite's untyped)."""
    if isinstance(kind, sa.Boolean):
        return pa.bool_()
    if isinstance(kind, sa.Integer):
        return pa.int64()
    if isinstance(kind, sa.Numeric | sa.Float):  # decimals become floats, as in a CSV
        return pa.float64()
    if isinstance(kind, sa.DateTime):
        return pa.timestamp("us", tz="UTC" if kind.timezone else None)
    if isinstance(kind, sa.Date):
        return pa.date32()
    if isinstance(kind, sa.String | sa.Enum):
        return pa.string()
    if isinstance(kind, sa.types.NullType):
        return None
    return pa.string()  # times, intervals, UUIDs, JSON, arrays: shown as their text


def _arrow_array(values: list[Any], kind: pa.DataType | None) -> pa.Array:
    if kind is None:
        try:
            return pa.array(values)
        except (pa.ArrowException, TypeError, ValueError):
            return pa.array([None if v is None else str(v) for v in values], pa.string())
    if pa.types.is_floating(kind):
        values = [float(v) if isinstance(v, Decimal) else v for v in values]
    elif pa.types.is_string(kind):
        values = [v if v is None or isinstance(v, str) else _text(v) for v in values]
    return pa.array(values, kind)


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


# --- the schema -----------------------------------------------------------------------------------


class _Layout:
    """What goes where in the snapshot: the tables with their schema, and each task's splits."""

    def __init__(
        self,
        tables: dict[str, dict[str, Any]],
        tasks: dict[str, dict[str, Any]],
        task_tables: dict[tuple[str, str], str],
        task_files: dict[tuple[str, str], Path],
    ) -> None:
        self.tables = tables
        self.tasks = tasks
        self.task_tables = task_tables  # (task, split) -> the database's table
        self.task_files = task_files  # (task, split) -> a file in tasks_dir

    @classmethod
    def of(
        cls,
        source: str,
        reflected: sa.MetaData,
        data: Mapping[str, pa.Table],
        overlay: Mapping[str, Any],
        tasks_dir: Path | None,
    ) -> _Layout:
        overlay_tasks: dict[str, Any] = dict(overlay.get("tasks", {}))
        for name in data:
            if "/" in name or "\\" in name or name in (".", "..") or _has_control_characters(name):
                raise DatasetError(source, f"table {name!r}: a table's name must be usable as a file name")
        task_tables = _task_tables(list(data), overlay_tasks)
        entity_names = [name for name in data if name not in task_tables.values()]
        tables = {name: _table_schema(reflected.tables[name], data[name], overlay) for name in entity_names}
        for name in overlay.get("tables", {}):
            if name not in tables:
                raise DatasetError(
                    source,
                    f"{SCHEMA_FILE} in tasks_dir: tables.{name} names no table of the database "
                    f"(tables: {', '.join(tables)})",
                )
        _fit_foreign_keys(source, tables, overlay)
        task_files = _task_files(tasks_dir)
        both = sorted(set(task_tables) & set(task_files))
        if both:
            task, split = both[0]
            raise DatasetError(
                source,
                f"task {task}'s {split} split is both the table {task_tables[both[0]]} of the database "
                f"and a file in tasks_dir: keep one",
            )
        tasks: dict[str, dict[str, Any]] = {}
        for task in sorted({task for task, _ in [*task_tables, *task_files]} | set(overlay_tasks)):
            if task in overlay_tasks:
                tasks[task] = dict(overlay_tasks[task])
                continue
            split = next(s for s in SPLITS if (task, s) in task_tables or (task, s) in task_files)
            if (task, split) in task_tables:  # the train split where there is one
                table = task_tables[task, split]
                rows, links, what = data[table], _links(reflected.tables[table]), f"its table {table}"
            else:
                rows, links = _read_file(source, task_files[task, split]), {}
                what = f"tasks_dir/{task}/{split}"
            tasks[task] = _infer_task(source, task, rows, links, tables, what)
        return cls(tables, tasks, task_tables, task_files)

    def write(self, directory: Path, data: Mapping[str, pa.Table], snapshot: DatabaseSnapshot) -> None:
        (directory / "tables").mkdir(parents=True)
        for name in self.tables:
            pq.write_table(data[name], directory / "tables" / f"{name}.parquet")
        for (task, split), table in self.task_tables.items():
            (directory / "tasks" / task).mkdir(parents=True, exist_ok=True)
            pq.write_table(data[table], directory / "tasks" / task / f"{split}.parquet")
        for (task, split), path in self.task_files.items():
            (directory / "tasks" / task).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, directory / "tasks" / task / f"{split}{path.suffix}")
        schema = {"tables": self.tables, "tasks": self.tasks}
        (directory / SCHEMA_FILE).write_text(json.dumps(schema, indent=2) + "\n")
        record = {"source": snapshot.source, "taken_at": snapshot.taken_at, "row_counts": snapshot.row_counts}
        (directory / SNAPSHOT_FILE).write_text(json.dumps(record, indent=2) + "\n")


def _fit_foreign_keys(source: str, tables: dict[str, dict[str, Any]], overlay: Mapping[str, Any]) -> None:
    """Keep the declared links to tables that have a primary key (the overlay's own are kept as
    given: open_database names any it cannot use), and at most MAX_FOREIGN_KEYS of them."""
    keyed = {name for name, spec in tables.items() if spec.get("primary_key")}
    for name, spec in tables.items():
        links = spec.pop("foreign_keys", {})
        if "foreign_keys" not in overlay.get("tables", {}).get(name, {}):
            links = {column: parent for column, parent in links.items() if parent in keyed}
        if len(links) > MAX_FOREIGN_KEYS:
            raise DatasetError(
                source,
                f"table {name} has {len(links)} foreign keys, and RT-J follows at most "
                f"{MAX_FOREIGN_KEYS} per table: list the ones to follow in tables.{name}.foreign_keys "
                f"of {SCHEMA_FILE} in tasks_dir",
            )
        if links:
            spec["foreign_keys"] = links


def _has_control_characters(text: str) -> bool:
    return any(ord(character) < 32 or ord(character) == 127 for character in text)


def _task_tables(names: list[str], overlay_tasks: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """The tables that hold a task's split: <task>_train, _val, _test, where <task>_train is a table
    of the database or the overlay defines <task> (a table named like model_test alone stays a table)."""
    found: dict[tuple[str, str], str] = {}
    present = set(names)
    for name in names:
        match = _TASK_TABLE.fullmatch(name)
        if match and (f"{match[1]}_train" in present or match[1] in overlay_tasks):
            found[match[1], match[2]] = name
    return found


def _task_files(tasks_dir: Path | None) -> dict[tuple[str, str], Path]:
    found: dict[tuple[str, str], Path] = {}
    if tasks_dir is None:
        return found
    for task_dir in sorted(Path(tasks_dir).expanduser().iterdir()):
        if not task_dir.is_dir():
            continue
        for split in SPLITS:
            for suffix in (".parquet", ".csv"):
                if (task_dir / f"{split}{suffix}").is_file():
                    found[task_dir.name, split] = task_dir / f"{split}{suffix}"
                    break
    return found


def _read_file(source: str, path: Path) -> pa.Table:
    try:
        return pq.read_table(path) if path.suffix == ".parquet" else pa_csv.read_csv(path)
    except (pa.ArrowException, OSError) as error:
        raise DatasetError(source, f"cannot read {path}: {error}") from None


def _links(table: sa.Table) -> dict[str, str]:
    """A table's single-column foreign keys that point at a table's single-column primary key."""
    links: dict[str, str] = {}
    for constraint in table.foreign_key_constraints:
        if len(constraint.elements) != 1:
            continue
        element = constraint.elements[0]
        parent = element.column.table
        parent_key = [column.name for column in parent.primary_key.columns]
        if parent_key == [element.column.name]:
            links[element.parent.name] = parent.name
    return links


def _table_schema(table: sa.Table, rows: pa.Table, overlay: Mapping[str, Any]) -> dict[str, Any]:
    """A table's entry of schema.json: the database's keys and time column, then the overlay's."""
    own: dict[str, Any] = dict(overlay.get("tables", {}).get(table.name, {}))
    spec: dict[str, Any] = {}
    key = [column.name for column in table.primary_key.columns]
    if len(key) == 1:
        spec["primary_key"] = key[0]
    links = _links(table)
    if links:
        spec["foreign_keys"] = links
    datetimes = [name for name in rows.column_names if _is_datetime(rows.schema.field(name).type)]
    if len(datetimes) == 1:
        spec["time_column"] = datetimes[0]
    column_types = own.pop("column_types", None)
    spec.update(own)
    if column_types:
        spec["column_types"] = column_types
    for field in ("primary_key", "time_column"):
        if field in spec and spec[field] is None:
            del spec[field]  # the overlay says: none
    return spec


def _is_datetime(kind: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(kind) or pa.types.is_date(kind))


def _infer_task(
    source: str,
    task: str,
    rows: pa.Table,
    links: Mapping[str, str],
    tables: Mapping[str, Mapping[str, Any]],
    what: str,
) -> dict[str, Any]:
    """A task's spec from its rows, where it leaves no doubt; else a DatasetError saying what to add."""
    keyed = {name: spec["primary_key"] for name, spec in tables.items() if spec.get("primary_key")}
    entities = [(column, parent) for column, parent in links.items() if parent in keyed]
    if not entities:
        entities = [
            (column, name) for column in rows.column_names for name, key in keyed.items() if key == column
        ]
    datetimes = [name for name in rows.column_names if _is_datetime(rows.schema.field(name).type)]
    problems = []
    if len(entities) != 1:
        problems.append(
            "which column names the entity" + (f" ({len(entities)} candidates)" if entities else "")
        )
    if len(datetimes) != 1:
        problems.append(f"which column is the time ({len(datetimes)} datetime columns)")
    targets = [
        name
        for name in rows.column_names
        if name not in datetimes and (not entities or name != entities[0][0])
    ]
    if not problems and len(targets) != 1:
        problems.append(f"which column is the target ({len(targets)} other columns)")
    if problems:
        raise DatasetError(
            source,
            f"task {task}: cannot tell {' or '.join(problems)} from {what}; add tasks.{task} to "
            f"{SCHEMA_FILE} in tasks_dir with entity_table, entity_column, time_column, target_column "
            "and problem_type (binary or regression)",
        )
    (entity_column, entity_table), target = entities[0], targets[0]
    return {
        "entity_table": entity_table,
        "entity_column": entity_column,
        "time_column": datetimes[0],
        "target_column": target,
        "problem_type": "binary" if _is_binary(rows.column(target)) else "regression",
    }


def _is_binary(values: pa.ChunkedArray) -> bool:
    if pa.types.is_boolean(values.type):
        return True
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        return False
    seen = pc.unique(values.drop_null()).to_pylist()
    return set(seen) <= {0, 1}


# --- writing ------------------------------------------------------------------------------------


def _write_atomically(target: Path, source: str, write: Any) -> None:
    """Write into a fresh directory next to `target`, then rename it: all of it or nothing."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        scratch.mkdir()
        write(scratch)
        os.rename(scratch, target)
    except OSError as error:
        raise DatasetError(
            source,
            f"cannot write the snapshot to {target}: {error.strerror or error}",
            reason=DatasetError.UNAVAILABLE,
        ) from None
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
