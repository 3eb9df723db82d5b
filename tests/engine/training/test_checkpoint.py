import os
from pathlib import Path

import pytest

from relay_engine.training.checkpoint import CheckpointStore


def write_two_files(directory: Path) -> None:
    (directory / "weights.bin").write_bytes(b"w" * 100)
    (directory / "state.json").write_text("{}")


def test_save_records_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=2)
    assert store.latest() is None
    store.save(10, write_two_files, {"note": "a"})
    store.save(20, write_two_files, {"note": "b"})
    latest = store.latest()
    assert latest is not None and latest.name == "step-00000020"
    assert store.manifest(latest)["note"] == "b"
    assert store.manifest(latest)["files"] == {"state.json": 2, "weights.bin": 100}


def test_only_the_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=2)
    for step in (1, 2, 3, 4):
        store.save(step, write_two_files, {})
    assert [p.name for p in store.complete()] == ["step-00000003", "step-00000004"]


def test_a_writer_that_fails_leaves_the_previous_checkpoint_and_pointer(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(1, write_two_files, {})

    def crash_halfway(directory: Path) -> None:
        (directory / "weights.bin").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        store.save(2, crash_halfway, {})
    latest = store.latest()
    assert latest is not None and latest.name == "step-00000001"
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())


def test_a_checkpoint_with_a_missing_or_short_file_is_not_complete(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    path = store.save(1, write_two_files, {})
    assert store.is_complete(path)
    with open(path / "weights.bin", "r+b") as file:
        file.truncate(10)
    assert not store.is_complete(path)
    with pytest.raises(RuntimeError, match="incomplete"):
        store.latest()
    os.remove(path / "weights.bin")
    assert not store.is_complete(path)
