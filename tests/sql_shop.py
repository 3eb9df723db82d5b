"""The fake shop in a SQL database, for the tests of RT-J's database URLs: a new PostgreSQL
database on the local server (dropped afterwards), and the shop's tables written into any SQLAlchemy
URL with their primary and foreign keys declared."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from relay_engine.families.rtj.database import Database

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A new, empty PostgreSQL database on the local server (dropped afterwards); its URL."""
    name = f"relay_sql_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _sql_type(kind: pa.DataType) -> sa.types.TypeEngine[Any]:
    if pa.types.is_integer(kind):
        return sa.BigInteger()
    if pa.types.is_floating(kind):
        return sa.Float()
    if pa.types.is_timestamp(kind):
        return sa.DateTime()
    return sa.Text()


def write_shop(url: str, shop: Database, *, task_tables: bool = False) -> None:
    """The shop's tables (and, with task_tables, its tasks as <task>_<split> tables) in a SQL
    database, with its primary and foreign keys declared. The shop's reviews name customers that do
    not exist: PostgreSQL gets its foreign keys NOT VALID, after the rows (SQLite does not check)."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    postgres = engine.dialect.name == "postgresql"
    metadata = sa.MetaData()
    for name, table in shop.tables.items():
        columns = []
        for field in table.data.schema:
            parent = table.foreign_keys.get(field.name)
            links = (
                [sa.ForeignKey(f"{parent}.{shop.tables[parent].primary_key}")]
                if parent and not postgres
                else []
            )
            columns.append(
                sa.Column(
                    field.name, _sql_type(field.type), *links, primary_key=field.name == table.primary_key
                )
            )
        sa.Table(name, metadata, *columns)
    rows: dict[str, list[dict[str, Any]]] = {name: t.data.to_pylist() for name, t in shop.tables.items()}
    if task_tables:
        for task in shop.tasks:
            for split in ("train", "val", "test"):
                data = shop.task_split(task, split)
                sa.Table(
                    f"{task}_{split}",
                    metadata,
                    *(sa.Column(f.name, _sql_type(f.type)) for f in data.schema),
                )
                rows[f"{task}_{split}"] = data.to_pylist()
    metadata.create_all(engine)
    with engine.begin() as connection:
        for name, table_rows in rows.items():
            connection.execute(metadata.tables[name].insert(), table_rows)
        if postgres:
            for name, table in shop.tables.items():
                for column, parent in table.foreign_keys.items():
                    key = shop.tables[parent].primary_key
                    connection.exec_driver_sql(
                        f'ALTER TABLE "{name}" ADD FOREIGN KEY ("{column}") '
                        f'REFERENCES "{parent}" ("{key}") NOT VALID'
                    )
    engine.dispose()
