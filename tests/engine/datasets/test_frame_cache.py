"""The frame index cache: keyed on content (a touched file keeps its index), a dataset's new
content replaces its old index, a size limit with least-recently-used eviction that leaves indexes
in use alone, and `relay cache`."""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay_engine.datasets import open_dataset
from relay_engine.datasets.frame_cache import entries
from tests.engine.datasets.conftest import episode_file, rewrite_episode


def indexes(cache: Path) -> list[str]:
    return sorted(entry.path.name for entry in entries(cache))


def test_touching_or_copying_a_data_file_keeps_the_index(broken: Path, cache_dir: Path) -> None:
    open_dataset(str(broken), cache_dir=cache_dir)
    built = indexes(cache_dir)
    os.utime(episode_file(broken, 1), (1, 1))  # as `touch`, or a copy that did not keep times
    shutil.copyfile(episode_file(broken, 2), episode_file(broken, 2).with_suffix(".tmp"))
    episode_file(broken, 2).with_suffix(".tmp").replace(episode_file(broken, 2))
    open_dataset(str(broken), cache_dir=cache_dir)
    assert indexes(cache_dir) == built and len(built) == 1


def bump_first_action(root: Path, by: float) -> None:
    """Change one number of the data: new content, as far as the index's key can tell."""

    def change(table: pa.Table) -> pa.Table:
        index = table.schema.get_field_index("action")
        column = table.column("action").to_pylist()
        column[0] = [value + by for value in column[0]]
        return table.set_column(index, "action", pa.array(column, type=table.schema.field("action").type))

    rewrite_episode(root, 0, change)


def test_new_content_replaces_the_old_index(broken: Path, cache_dir: Path) -> None:
    open_dataset(str(broken), cache_dir=cache_dir)
    before = indexes(cache_dir)
    bump_first_action(broken, 1.0)
    gc.collect()  # the first dataset object (and its hold on the old index) is gone
    open_dataset(str(broken), cache_dir=cache_dir)
    after = indexes(cache_dir)
    assert len(after) == 1 and after != before  # replaced, not added


def test_a_copy_with_the_same_content_shares_its_index(
    synthetic: Path, broken: Path, cache_dir: Path
) -> None:
    open_dataset(str(synthetic), cache_dir=cache_dir)
    open_dataset(str(broken), cache_dir=cache_dir)  # a copy of the synthetic dataset
    assert len(indexes(cache_dir)) == 1


def test_the_cache_keeps_to_its_limit_least_recently_used_first(
    synthetic: Path, broken: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_use = open_dataset(str(synthetic), cache_dir=cache_dir)  # held open throughout
    first = indexes(cache_dir)
    bump_first_action(broken, 1.0)
    open_dataset(str(broken), cache_dir=cache_dir)
    gc.collect()
    assert len(indexes(cache_dir)) == 2
    monkeypatch.setenv("RELAY_FRAME_CACHE_MAX_BYTES", "1")  # room for nothing: only what is in use stays
    third = Path(shutil.copytree(broken, broken.with_name("third")))
    bump_first_action(third, 2.0)
    open_dataset(str(third), cache_dir=cache_dir)
    left = indexes(cache_dir)
    assert set(first) <= set(left), "an index in use was removed"
    assert len(left) == 2  # the one just built, and the one in use; the idle one went
    del in_use


def test_relay_cache_shows_and_prunes(synthetic: Path, cache_dir: Path) -> None:
    open_dataset(str(synthetic), cache_dir=cache_dir)
    gc.collect()
    runner = CliRunner()
    shown = runner.invoke(app, ["cache", "--cache-dir", str(cache_dir)])
    assert shown.exit_code == 0, shown.output
    said = " ".join(shown.output.split())  # rich wraps the line where the cache's path is long
    assert "1 indexes" in said and "limit 68.7 GB" in said
    pruned = runner.invoke(app, ["cache", "prune", "--max-gb", "0", "--cache-dir", str(cache_dir)])
    assert pruned.exit_code == 0, pruned.output
    assert "1 removed" in pruned.output and indexes(cache_dir) == []
