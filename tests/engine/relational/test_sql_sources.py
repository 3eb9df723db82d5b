"""RT-J databases read by URL: a SQLite file and a PostgreSQL database written from the fake shop
read back as the directory they came from, in one consistent snapshot, with task tables in the
database or in a tasks_dir, the password of the URL nowhere, and every bad URL a DatasetError."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from relay.cli import app
from relay.sft.config import SFTConfig
from relay_engine.errors import DatasetError
from relay_engine.families.rtj import sql
from relay_engine.families.rtj.database import Database, column_type, open_database
from relay_engine.families.rtj.sql import snapshot_database
from relay_engine.families.rtj.synth import write_fake_shop
from relay_engine.recipe import Recipe, run_recipe
from relay_engine.serving.relational import ServedRelationalModel
from tests.sql_shop import postgres_database, write_shop

PASSWORD = "Hunter2-s3cret"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshots taken by open_database go under this test's directory."""
    monkeypatch.setenv("RELAY_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Database:
    return open_database(write_fake_shop(tmp_path_factory.mktemp("shop"), customers=40, reviews=240))


@pytest.fixture
def postgres() -> Iterator[str]:
    with postgres_database() as url:
        yield url


def sqlite_shop(tmp_path: Path, shop: Database, **options: Any) -> str:
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    write_shop(url, shop, **options)
    return url


def assert_same_database(read: Database, shop: Database) -> None:
    assert read.tables.keys() == shop.tables.keys()
    for name, table in shop.tables.items():
        got = read.tables[name]
        assert (got.primary_key, got.foreign_keys, got.time_column) == (
            table.primary_key,
            table.foreign_keys,
            table.time_column,
        ), name
        assert got.data.equals(table.data), f"{name}'s rows differ"
    assert read.snapshot is not None
    assert read.snapshot.row_counts == {name: t.num_rows for name, t in shop.tables.items()}
    assert read.tasks == shop.tasks
    for task in shop.tasks:
        for split in ("train", "val", "test"):
            assert read.task_split(task, split).equals(shop.task_split(task, split)), (task, split)


def test_a_sqlite_file_reads_as_the_directory_it_came_from(tmp_path: Path, shop: Database) -> None:
    url = sqlite_shop(tmp_path, shop)
    read = open_database(url, tasks_dir=shop.root / "tasks")
    assert_same_database(read, shop)
    assert read.snapshot is not None and read.snapshot.source == url
    record = json.loads((read.root / "snapshot.json").read_text())
    assert record["source"] == url and record["row_counts"]["review"] == 240
    assert datetime.fromisoformat(record["taken_at"]).tzinfo is not None
    # The snapshot is a database directory of its own: opened by path, it says where it came from.
    again = open_database(read.root)
    assert again.snapshot is not None and again.snapshot.source == url and again.tasks == shop.tasks


def test_a_relative_sqlite_url_is_the_file_where_the_command_runs(
    tmp_path: Path, shop: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    sqlite_shop(tmp_path, shop)
    monkeypatch.chdir(tmp_path)
    checked = CliRunner().invoke(
        app, ["datasets", "check", "sqlite:///shop.db", "--tasks-dir", str(shop.root / "tasks")]
    )
    assert checked.exit_code == 0, checked.output
    assert f"sqlite:///{tmp_path / 'shop.db'}" in checked.output and "review 240" in checked.output
    missing = CliRunner().invoke(app, ["datasets", "check", "sqlite:///nothing.db"])
    assert missing.exit_code == 1 and "no such SQLite file" in missing.output
    assert not (tmp_path / "nothing.db").exists()


def test_a_postgresql_database_reads_as_the_directory_it_came_from(postgres: str, shop: Database) -> None:
    write_shop(postgres, shop)
    assert_same_database(open_database(postgres, tasks_dir=shop.root / "tasks"), shop)


def test_postgresql_types_become_rt_j_column_types(postgres: str) -> None:
    engine = sa.create_engine(postgres.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "CREATE TABLE account (id UUID PRIMARY KEY, opened TIMESTAMPTZ, balance NUMERIC(12, 2), "
            "active BOOLEAN, tier SMALLINT, born DATE, notes JSONB, nickname VARCHAR(20))"
        )
        connection.exec_driver_sql(
            "INSERT INTO account VALUES ('8c6f2a4e-0d3b-4d8e-9a51-2b7d6c1e9f00', '2024-03-01 12:00:00+02', "
            "12.50, true, 3, '1990-05-17', '{\"plan\": \"gold\"}', 'ann')"
        )
    engine.dispose()
    account = open_database(postgres).tables["account"]
    assert account.primary_key == "id" and account.time_column is None  # two date/time columns
    assert {column: column_type(account, column) for column in account.value_columns()} == {
        "opened": "datetime",
        "balance": "number",
        "active": "boolean",
        "tier": "number",
        "born": "datetime",
        "notes": "text",
        "nickname": "text",
    }
    row = account.data.to_pylist()[0]
    assert row["opened"] == datetime(2024, 3, 1, 10, 0, tzinfo=UTC) and row["balance"] == 12.5
    assert row["id"] == "8c6f2a4e-0d3b-4d8e-9a51-2b7d6c1e9f00" and json.loads(row["notes"]) == {
        "plan": "gold"
    }


def test_task_tables_in_the_database_are_tasks_not_tables(tmp_path: Path, shop: Database) -> None:
    url = sqlite_shop(tmp_path, shop, task_tables=True)
    read = open_database(url)  # no tasks_dir: each task's spec is inferred from its tables
    assert_same_database(read, shop)
    assert sorted(p.name for p in (read.root / "tables").iterdir()) == sorted(
        f"{name}.parquet" for name in shop.tables
    )


def test_a_task_table_that_leaves_doubt_asks_for_the_overlay(tmp_path: Path, shop: Database) -> None:
    url = sqlite_shop(tmp_path, shop)
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            'CREATE TABLE "rating_train" (timestamp DATETIME, customer_id TEXT, rating INTEGER, note TEXT)'
        )
    engine.dispose()
    with pytest.raises(DatasetError) as raised:
        open_database(url)
    assert "task rating: cannot tell which column is the target (2 other columns)" in str(raised.value)
    assert "add tasks.rating to schema.json in tasks_dir" in str(raised.value)

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    spec = {
        "entity_table": "customer",
        "entity_column": "customer_id",
        "time_column": "timestamp",
        "target_column": "rating",
        "problem_type": "regression",
    }
    (overlay / "schema.json").write_text(json.dumps({"tasks": {"rating": spec}}))
    read = open_database(url, tasks_dir=overlay)
    assert read.tasks["rating"].target_column == "rating" and read.has_split("rating", "train")
    assert not read.has_split("rating", "val") and "rating_train" not in read.tables


def split_directory(tmp_path: Path, shop: Database) -> tuple[Path, Path]:
    """The shop as a directory without tasks, and a tasks_dir holding them."""
    bare, tasks = tmp_path / "bare", tmp_path / "tasks"
    (bare / "tables").mkdir(parents=True)
    for name in shop.tables:
        shutil.copyfile(shop.root / "tables" / f"{name}.parquet", bare / "tables" / f"{name}.parquet")
    schema = json.loads((shop.root / "schema.json").read_text())
    (bare / "schema.json").write_text(json.dumps({"tables": schema["tables"]}))
    shutil.copytree(shop.root / "tasks", tasks)
    (tasks / "schema.json").write_text(json.dumps({"tasks": schema["tasks"]}))
    return bare, tasks


def test_a_directory_takes_its_tasks_from_a_tasks_dir(tmp_path: Path, shop: Database) -> None:
    bare, tasks = split_directory(tmp_path, shop)
    assert open_database(bare).tasks == {}
    read = open_database(bare, tasks_dir=tasks)
    assert read.tasks == shop.tasks and read.tasks_root == tasks and read.snapshot is None
    assert read.tasks_dir == tasks
    assert read.task_split("user-ltv", "val").equals(shop.task_split("user-ltv", "val"))
    (tasks / "user-churn" / "test.parquet").unlink()
    with pytest.raises(DatasetError, match="task user-churn has no test split"):
        read.task_split("user-churn", "test")
    (tasks / "schema.json").write_text(json.dumps({"tables": {"review": {}}}))
    with pytest.raises(DatasetError, match="tables here apply to a database read by URL"):
        open_database(bare, tasks_dir=tasks)


def test_a_job_on_a_directory_and_a_tasks_dir_serves_from_both(tmp_path: Path, shop: Database) -> None:
    bare, tasks = split_directory(tmp_path, shop)
    config = SFTConfig(
        model="rt-j-tiny",
        dataset_name=str(bare),
        task="user-ltv",
        tasks_dir=str(tasks),
        batch_size=8,
        steps=2,
        learning_rate=1e-3,
    )
    recipe = Recipe.from_config(config, checkpoint_every=2, log_every=2, device="cpu")
    result = run_recipe(recipe, tmp_path / "job", on_event=lambda e: None, should_stop=lambda: False)
    assert result.status == "completed" and result.output_dir is not None
    saved = json.loads((result.output_dir / "config.json").read_text())["relay"]
    assert saved["dataset"] == str(bare) and saved["tasks_dir"] == str(tasks)
    assert "dataset_source" not in saved
    served = ServedRelationalModel.load(result.output_dir, device="cpu")
    assert served.spec == shop.tasks["user-ltv"] and served.sampler.database.tasks_root == tasks


def test_the_snapshot_is_one_transaction(
    postgres: str, shop: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review added by another connection while the snapshot reads is not in it (the snapshot
    reads every table as of one moment); the next snapshot has it."""
    write_shop(postgres, shop)
    writer = sa.create_engine(postgres.replace("postgresql://", "postgresql+psycopg://"))
    review = sa.Table("review", sa.MetaData(), autoload_with=writer)
    read_rows = sql._read_rows
    added: list[str] = []

    def read_then_write(connection: sa.Connection, table: sa.Table) -> pa.Table:
        rows = read_rows(connection, table)
        if not added:  # after the first table is read, the transaction's snapshot is fixed
            with writer.begin() as other:
                other.execute(review.insert(), [{"customer_id": "customer_1", "product_id": "product_1"}])
            added.append(table.name)
        return rows

    monkeypatch.setattr(sql, "_read_rows", read_then_write)
    first = snapshot_database(postgres, tmp_path / "first")
    monkeypatch.setattr(sql, "_read_rows", read_rows)
    second = snapshot_database(postgres, tmp_path / "second")
    writer.dispose()
    assert added and added[0] != "review", "the row must be added before the review table is read"
    assert first.row_counts["review"] == 240 and second.row_counts["review"] == 241


def test_a_sqlite_snapshot_is_one_read_transaction(
    tmp_path: Path, shop: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In WAL mode another connection may write while the snapshot reads; the snapshot does not see it."""
    url = sqlite_shop(tmp_path, shop)
    writer = sa.create_engine(url)
    with writer.connect() as connection:
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")
    read_rows = sql._read_rows
    added: list[str] = []

    def read_then_write(connection: sa.Connection, table: sa.Table) -> pa.Table:
        rows = read_rows(connection, table)
        if not added:
            with writer.begin() as other:
                other.exec_driver_sql(
                    "INSERT INTO review (customer_id, product_id) VALUES ('customer_1', 'product_1')"
                )
            added.append(table.name)
        return rows

    monkeypatch.setattr(sql, "_read_rows", read_then_write)
    first = snapshot_database(url, tmp_path / "first")
    monkeypatch.setattr(sql, "_read_rows", read_rows)
    second = snapshot_database(url, tmp_path / "second")
    writer.dispose()
    assert added and added[0] != "review"
    assert first.row_counts["review"] == 240 and second.row_counts["review"] == 241


def test_the_password_is_nowhere(postgres: str, shop: Database, tmp_path: Path) -> None:
    """The local server trusts its clients, so a URL with any password connects: the password must
    appear in no file of the snapshot, no field, and no message."""
    write_shop(postgres, shop)
    url = postgres.replace("postgres@", f"postgres:{PASSWORD}@")
    read = open_database(url, tasks_dir=shop.root / "tasks")
    assert read.snapshot is not None and PASSWORD not in read.snapshot.source
    assert read.snapshot.source == postgres.replace("postgres@", "postgres:***@")
    for path in [*read.root.rglob("*"), *(tmp_path / "cache").rglob("*")]:
        assert PASSWORD not in str(path)
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path
    problems = [
        url.replace("127.0.0.1:5432", "127.0.0.1:1"),  # nothing listens there
        url.rsplit("/", 1)[0] + "/no_such_database_here",
        url.replace("postgresql://", "postgresql+nosuchdriver://"),
        f"mysql+pymysql://relay:{PASSWORD}@127.0.0.1/shop",  # its driver is not installed
    ]
    for bad in problems:
        with pytest.raises(DatasetError) as raised:
            open_database(bad)
        assert PASSWORD not in str(raised.value) and "***" in str(raised.value), str(raised.value)
    checked = CliRunner().invoke(app, ["datasets", "check", url, "--tasks-dir", str(shop.root / "tasks")])
    assert checked.exit_code == 0, checked.output
    assert PASSWORD not in checked.output and "review 240" in checked.output
    # A job trained on it: its output, checkpoints and snapshot hold no password either.
    trained = CliRunner().invoke(
        app,
        [
            "local", "train", "--model", "rt-j-tiny", "--dataset", url, "--task", "user-churn",
            "--tasks-dir", str(shop.root / "tasks"), "--steps", "1", "--batch-size", "8",
            "--device", "cpu", "--output-dir", str(tmp_path / "job"),
        ],
    )  # fmt: skip
    assert trained.exit_code == 0 and PASSWORD not in trained.output, trained.output
    written = [path for path in [*tmp_path.rglob("*")] if path.is_file()]
    assert any(path.name == "model.safetensors" for path in written)
    assert not [path for path in written if PASSWORD.encode() in path.read_bytes()]
    saved = json.loads((tmp_path / "job" / "config.json").read_text())["relay"]
    assert saved["dataset_source"] == read.snapshot.source


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("sqlite:///{tmp}/missing.db", "no such SQLite file"),
        ("sqlite://", "names no database file"),
        ("sqlite:///{tmp}/empty.db", "the database has no tables"),
        ("postgresql+nosuchdriver://127.0.0.1/db", "unknown database driver 'postgresql+nosuchdriver'"),
        (
            "mysql+pymysql://127.0.0.1/shop",
            "the database driver pymysql is not installed: pip install 'pymysql'",
        ),
        ("postgresql://postgres@127.0.0.1:1/shop", "cannot read the database"),
        ("postgresql+asyncpg://127.0.0.1/shop", "asyncio driver"),
    ],
)
def test_bad_urls_name_the_problem(tmp_path: Path, url: str, words: str) -> None:
    (tmp_path / "empty.db").write_bytes(b"")
    url = url.format(tmp=tmp_path)
    with pytest.raises(DatasetError) as raised:
        open_database(url)
    assert words in str(raised.value)
    assert not (tmp_path / "missing.db").exists(), "a snapshot must not create the SQLite file it reads"
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.parquet"))


def test_a_value_its_column_cannot_hold_is_named_with_its_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'loose.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE visit (id INTEGER PRIMARY KEY, seen DATETIME)")
        connection.exec_driver_sql("INSERT INTO visit VALUES (1, 'last tuesday')")  # SQLite keeps it
    engine.dispose()
    with pytest.raises(DatasetError, match="table visit: cannot read its rows"):
        open_database(url)


def test_keys_and_time_columns_come_from_the_database_or_the_overlay(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'wide.db'}"
    engine = sa.create_engine(url)
    parents = [f"p{i}" for i in range(6)]
    with engine.begin() as connection:
        for parent in parents:
            connection.exec_driver_sql(f"CREATE TABLE {parent} (id INTEGER PRIMARY KEY, name TEXT)")
            connection.exec_driver_sql(f"INSERT INTO {parent} VALUES (1, 'one')")
        links = ", ".join(f"{p}_id INTEGER REFERENCES {p}(id)" for p in parents)
        connection.exec_driver_sql(
            "CREATE TABLE wide (a INTEGER, b INTEGER, opened DATETIME, closed DATE, "
            f"{links}, PRIMARY KEY (a, b))"
        )
        values = ", ".join("1" for _ in parents)
        connection.exec_driver_sql(
            f"INSERT INTO wide VALUES (1, 2, '2024-01-01 10:00:00', '2024-02-01', {values})"
        )
    engine.dispose()
    with pytest.raises(DatasetError) as raised:
        open_database(url)
    assert "table wide has 6 foreign keys" in str(raised.value)
    assert "tables.wide.foreign_keys of schema.json in tasks_dir" in str(raised.value)

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    picked = {"wide": {"foreign_keys": {"p0_id": "p0", "p1_id": "p1"}}}
    (overlay / "schema.json").write_text(json.dumps({"tables": picked}))
    read = open_database(url, tasks_dir=overlay)
    wide = read.tables["wide"]
    # A composite key is no primary key; two datetime columns leave the time column unchosen.
    assert wide.primary_key is None and wide.time_column is None
    assert wide.foreign_keys == {"p0_id": "p0", "p1_id": "p1"} and read.tables["p3"].primary_key == "id"
    assert wide.data.column("opened").type == pa.timestamp("us")

    picked["wide"]["time_column"] = "closed"  # type: ignore[assignment]
    (overlay / "schema.json").write_text(json.dumps({"tables": picked}))
    assert open_database(url, tasks_dir=overlay).tables["wide"].time_column == "closed"

    (overlay / "schema.json").write_text(json.dumps({"tables": {"nope": {"primary_key": "id"}}}))
    with pytest.raises(DatasetError, match=r"tables\.nope names no table of the database"):
        open_database(url, tasks_dir=overlay)


def test_a_failed_snapshot_leaves_nothing(tmp_path: Path, shop: Database) -> None:
    url = sqlite_shop(tmp_path, shop)
    target = tmp_path / "out" / "snap"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "schema.json").write_text(json.dumps({"tables": {"review": {"time_column": "rating"}}}))
    with pytest.raises(DatasetError, match="must hold datetimes"):
        open_database(url, tasks_dir=overlay)
    assert not any((tmp_path / "cache").rglob("schema.json")), "a snapshot that does not open is removed"
    (overlay / "schema.json").write_text("{not json")
    with pytest.raises(DatasetError, match="is not valid JSON"):
        snapshot_database(url, target, overlay)
    assert not target.exists() and not any(target.parent.glob("*")) if target.parent.exists() else True
    snapshot = snapshot_database(url, target)
    with pytest.raises(DatasetError, match="already exists"):
        snapshot_database(url, target)
    assert snapshot.path == target and sorted(p.name for p in target.parent.iterdir()) == ["snap"]


def test_local_train_reads_a_sqlite_url(tmp_path: Path, shop: Database) -> None:
    """The tasks kept apart (--tasks-dir); the model records the snapshot, which serving reads."""
    url = sqlite_shop(tmp_path, shop)
    output = tmp_path / "job"
    result = CliRunner().invoke(
        app,
        [
            "local", "train", "--model", "rt-j-tiny", "--dataset", url, "--task", "user-churn",
            "--tasks-dir", str(shop.root / "tasks"), "--steps", "2", "--batch-size", "8",
            "--checkpoint-every", "2", "--device", "cpu", "--output-dir", str(output),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    saved = json.loads((output / "config.json").read_text())["relay"]
    assert saved["dataset_source"] == url and saved["task"] == "user-churn"
    snapshot = Path(saved["dataset"])
    # The run says what it read: the snapshot, where it is, and its row counts.
    said = " ".join(result.output.split())
    assert f"reading a snapshot of {url} (" in said and "review 240" in said
    assert json.loads((snapshot / "snapshot.json").read_text())["source"] == url
    assert open_database(snapshot).tasks == shop.tasks, "the snapshot holds the tasks_dir's tasks"

    served = ServedRelationalModel.load(output, device="cpu")
    assert served.metadata()["database"] == str(snapshot)
    assert served.sampler.database.snapshot is not None
    assert served.sampler.database.snapshot.row_counts["review"] == 240


def test_a_resumed_job_reads_the_snapshot_its_first_run_took(tmp_path: Path, shop: Database) -> None:
    """Rows added between a stop and the resume are not read: the resumed run trains on what the
    stopped one did, so it ends with the weights of an uninterrupted run on that snapshot."""
    url = sqlite_shop(tmp_path, shop, task_tables=True)
    config = SFTConfig(model="rt-j-tiny", dataset_name=url, task="user-churn", batch_size=8, steps=4)
    recipe = Recipe.from_config(config, checkpoint_every=2, log_every=2, device="cpu")
    events: list[Any] = []
    stop_at_2 = lambda: any(e.get("event") == "checkpoint" and e["step"] == 2 for e in events)  # noqa: E731
    first = run_recipe(recipe, tmp_path / "split", on_event=events.append, should_stop=stop_at_2)
    assert first.status == "stopped" and first.step == 2
    taken = (tmp_path / "split" / "database-snapshot.txt").read_text().strip()

    engine = sa.create_engine(url)
    with engine.begin() as connection:  # a new train row: a fresh snapshot would train differently
        connection.exec_driver_sql(
            'INSERT INTO "user-churn_train" (timestamp, customer_id, churn) '
            "VALUES ('2020-01-01 00:00:00.000000', 'customer_1', 1)"
        )
    engine.dispose()
    second = run_recipe(recipe, tmp_path / "split", on_event=events.append, should_stop=lambda: False)
    assert second.status == "completed" and second.resumed_from == 2 and second.output_dir is not None
    saved = json.loads((second.output_dir / "config.json").read_text())["relay"]
    assert saved["dataset"] == taken and saved["dataset_source"] == url

    fresh = run_recipe(recipe, tmp_path / "fresh", on_event=lambda e: None, should_stop=lambda: False)
    assert fresh.output_dir is not None
    assert json.loads((fresh.output_dir / "config.json").read_text())["relay"]["dataset"] != taken
