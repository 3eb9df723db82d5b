"""RT-J's entries in the engine's cache, shown and pruned by `relay cache`: snapshots of a SQLite
database taken by open_database (kept unless --databases-older-than asks, by days unused, and
opening one by its path counts as a use), a sampler's memory-mapped arrays and a RelBench
conversion (made again when missing: pruned least recently used first, never one being opened)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay_engine.cache_contents import CONTEXTS, RELBENCH, SNAPSHOT, TABLE_COPY, everything, prune_to_size
from relay_engine.families.rtj.database import Database, open_database
from relay_engine.families.rtj.mapped import COMPLETE_FILE, is_memory_mapped, memory_mapped
from relay_engine.families.rtj.relbench_source import relbench_database
from relay_engine.families.rtj.synth import write_fake_shop
from tests.engine.relational.test_relbench_source import ShopDataset
from tests.sql_shop import write_shop

DAY = 86_400.0


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's RELAY_CACHE_DIR: open_database's snapshots and the conversions go there."""
    monkeypatch.setenv("RELAY_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("shop")
    shop = open_database(write_fake_shop(directory / "files", customers=20, products=6, reviews=60))
    url = f"sqlite:///{directory / 'shop.db'}"
    write_shop(url, shop)
    return url


def age(path: Path, days: float) -> None:
    """Make a cache entry look unused for `days` days: its files' times, its last use among them."""
    then = time.time() - days * DAY
    for item in [path, *path.rglob("*")]:
        os.utime(item, (then, then))


def relay_cache(*arguments: str) -> str:
    result = CliRunner().invoke(app, ["cache", *arguments])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())  # rich wraps long lines where the terminal is narrow


def test_snapshots_are_shown_and_go_only_by_days_unused(sqlite_url: str, cache: Path) -> None:
    old, recent = open_database(sqlite_url), open_database(sqlite_url)
    assert old.snapshot is not None and recent.snapshot is not None
    shown = relay_cache("--cache-dir", str(cache))
    assert "2 database snapshots" in shown
    assert sqlite_url in shown and old.snapshot.taken_at in shown and "customer 20" in shown

    # Neither the size limit nor --max-gb 0 touches a snapshot.
    said = relay_cache("prune", "--max-gb", "0", "--cache-dir", str(cache))
    assert "0 removed" in said and old.root.is_dir() and recent.root.is_dir()

    age(old.root, 10)
    age(recent.root, 3)
    said = relay_cache("prune", "--databases-older-than", "7", "--cache-dir", str(cache))
    assert f"removed the {SNAPSHOT} {sqlite_url}" in said and "1 removed" in said
    assert not old.root.exists() and recent.root.is_dir()
    assert [entry.path for entry in everything(cache)] == [recent.root]


def test_opening_a_snapshot_by_its_path_keeps_it(sqlite_url: str, cache: Path) -> None:
    """Serving a model opens the snapshot its config names: that is a use, so it is not "old"."""
    snapshot = open_database(sqlite_url).root
    age(snapshot, 30)
    reopened: Database = open_database(snapshot)
    assert reopened.snapshot is not None and reopened.snapshot.source == sqlite_url
    relay_cache("prune", "--databases-older-than", "7", "--cache-dir", str(cache))
    assert snapshot.is_dir()
    age(snapshot, 30)
    relay_cache("prune", "--databases-older-than", "7", "--cache-dir", str(cache))
    assert not snapshot.exists()


def test_a_negative_age_is_refused() -> None:
    result = CliRunner().invoke(app, ["cache", "prune", "--databases-older-than", "-1"])
    assert result.exit_code == 1
    assert "--databases-older-than: -1.0 (must be 0 or more days)" in " ".join(result.output.split())


def arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"cells": rng.normal(size=(5_000, 4)).astype(np.float32), "rows": np.arange(5_000)}


def test_context_arrays_and_conversions_go_least_recently_used_first(cache: Path) -> None:
    first = memory_mapped(arrays(1), cache / "rtj-contexts")
    memory_mapped(arrays(2), cache / "rtj-contexts")
    converted = relbench_database(ShopDataset())
    assert converted.parent == cache / "relbench"
    by_kind = {entry.kind: entry for entry in everything(cache)}
    assert set(by_kind) == {CONTEXTS, RELBENCH}
    assert "relbench:ShopDataset" in by_kind[RELBENCH].description
    contexts = sorted(p for p in (cache / "rtj-contexts").iterdir())
    age(contexts[0], 5)
    age(contexts[1], 1)
    age(converted, 3)
    open_database(converted)  # a use: now the most recent
    entries = everything(cache)
    assert [entry.path for entry in entries] == [contexts[0], contexts[1], converted]

    # Room for the conversion and no more: the two context arrays go, oldest first.
    removed = prune_to_size(cache, entries[-1].bytes)
    assert [entry.path for entry in removed] == [contexts[0], contexts[1]]
    assert converted.is_dir()
    # Arrays already mapped stay readable; asked for again, they are written again.
    assert is_memory_mapped(first["cells"]) and float(first["cells"].sum()) == float(arrays(1)["cells"].sum())
    again = memory_mapped(arrays(1), cache / "rtj-contexts")
    assert np.array_equal(again["cells"], arrays(1)["cells"])
    assert len([e for e in everything(cache) if e.kind == CONTEXTS]) == 1


def test_arrays_being_opened_are_not_removed(cache: Path) -> None:
    memory_mapped(arrays(3), cache / "rtj-contexts")
    (directory,) = (cache / "rtj-contexts").iterdir()
    held = os.open(directory / COMPLETE_FILE, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)  # as memory_mapped holds it while it opens the files
    try:
        said = relay_cache("prune", "--max-gb", "0", "--cache-dir", str(cache))
        assert "0 removed" in said and directory.is_dir()
    finally:
        os.close(held)
    said = relay_cache("prune", "--max-gb", "0", "--cache-dir", str(cache))
    assert f"removed the {CONTEXTS}" in said and not directory.exists()


def test_a_prune_while_arrays_are_being_opened_leaves_them(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memory_mapped holds the directory while it opens the files: a prune meanwhile skips it."""
    memory_mapped(arrays(4), cache / "rtj-contexts")
    opening = np.load
    pruned_meanwhile: list[list[Path]] = []

    def load_with_a_prune_in_between(*args: object, **kwargs: object) -> object:
        if not pruned_meanwhile:
            pruned_meanwhile.append([entry.path for entry in prune_to_size(cache, 0)])
        return opening(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(np, "load", load_with_a_prune_in_between)
    mapped = memory_mapped(arrays(4), cache / "rtj-contexts")
    assert pruned_meanwhile == [[]]
    assert np.array_equal(mapped["rows"], np.arange(5_000))


def test_table_copies_are_shown_pruned_and_written_again(tmp_path: Path, cache: Path) -> None:
    """A database opened with a cache_dir maps Arrow copies of its tables; they are remade on demand,
    so they go under the size limit, and a table already open stays readable after its removal."""
    shop = write_fake_shop(tmp_path / "shop", customers=10, products=4, reviews=30)
    opened = open_database(shop, cache_dir=cache)
    copies = [entry for entry in everything(cache) if entry.kind == TABLE_COPY]
    assert len(copies) == len(opened.tables) and all(entry.bytes > 0 for entry in copies)
    assert f"{len(copies)} context arrays, table copies and RelBench conversions" in relay_cache()
    removed = prune_to_size(cache, 0)
    assert {entry.path for entry in removed} >= {entry.path for entry in copies}
    assert not any((cache / "rtj-tables").glob("*.arrow"))
    assert opened.tables["review"].data.num_rows == 30  # its pages are still mapped
    again = open_database(shop, cache_dir=cache)
    assert len(list((cache / "rtj-tables").glob("*.arrow"))) == len(again.tables)
    assert again.tables["review"].data.equals(opened.tables["review"].data)
