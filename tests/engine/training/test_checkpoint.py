import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relay_engine.core.checkpoint import POINTER, CheckpointStore, write_atomic
from relay_engine.errors import DiskFullError
from tests.disks import small_disk


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


def test_a_checkpoint_sealed_before_its_pointer_moved_is_the_latest(tmp_path: Path) -> None:
    """A kill between the rename that seals step 20 and the pointer's write: step 20 is whole."""
    store = CheckpointStore(tmp_path, keep_last=3)
    store.save(10, write_two_files, {})
    store.save(20, write_two_files, {})
    write_atomic(tmp_path / POINTER, store.name_of(10).encode())  # the pointer as the kill left it
    latest = store.latest()
    assert latest is not None and latest.name == "step-00000020"


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

    with pytest.raises(DiskFullError):  # ENOSPC, in the words of a full disk
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


@pytest.fixture
def six_mb_disk() -> Iterator[Path]:
    """A 6 MB disk, so that a checkpoint can fill it."""
    with small_disk("6m") as disk:
        yield disk


def torch_saves(megabytes: int) -> Callable[[Path], None]:
    import torch

    def write(directory: Path) -> None:
        torch.save({"weights": torch.zeros(megabytes << 18)}, directory / "state.pt")  # 4-byte floats

    return write


def test_a_full_disk_says_so_and_keeps_the_last_checkpoint(six_mb_disk: Path) -> None:
    store = CheckpointStore(six_mb_disk / "checkpoints")
    store.save(10, torch_saves(2), {})
    with pytest.raises(DiskFullError, match=r"no space left on device at .*checkpoints.*GB free") as caught:
        store.save(20, torch_saves(5), {})  # torch's own error would be "unexpected pos ..."
    assert "the disk filled up while writing" in str(caught.value)
    assert str(caught.value).endswith("; the last complete checkpoint is kept")
    del caught  # its traceback holds torch's writer, and the writer the space of the partial file
    gc.collect()
    latest = store.latest()
    assert latest is not None and latest.name == "step-00000010" and store.is_complete(latest)
    assert not [p for p in store.root.iterdir() if p.name.startswith(".tmp-")]

    (six_mb_disk / "filler").write_bytes(b"\0" * (5 << 19))  # less free than the last checkpoint took
    with pytest.raises(DiskFullError, match=r"cannot write a checkpoint \(a checkpoint needs about 0.00 GB"):
        store.save(30, torch_saves(2), {})
    assert store.latest() == latest


def test_a_full_disk_at_the_first_checkpoint_says_that_none_is_kept(six_mb_disk: Path) -> None:
    """No earlier checkpoint: the message must not promise one ("the last complete checkpoint is
    kept" said so, and there was nothing to resume from)."""
    store = CheckpointStore(six_mb_disk / "checkpoints")
    with pytest.raises(DiskFullError, match="the disk filled up while writing a checkpoint") as caught:
        store.save(10, torch_saves(8), {})
    message = str(caught.value)
    assert "the last complete checkpoint is kept" not in message
    assert message.endswith(
        "no checkpoint is complete yet (this was the first), so there is none to resume from"
    )
    del caught
    gc.collect()
    assert store.latest() is None and not list(store.root.iterdir())


def test_leftovers_of_interrupted_writes_are_removed_when_asked(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(10, write_two_files, {})
    young = tmp_path / ".tmp-step-00000020-abc"
    young.mkdir()
    (young / "weights.bin").write_bytes(b"partial")
    store.save(20, write_two_files, {})
    assert young.exists()  # a save leaves a young one alone: its writer may be at work
    assert store.remove_temporaries() == [young]
    assert not young.exists() and store.latest() == tmp_path / "step-00000020"


def test_an_attempt_removes_its_own_and_older_temporaries_but_never_a_newer_attempts(tmp_path: Path) -> None:
    older, own, newer = (tmp_path / f".tmp-a{n}-step-00000020-abc" for n in (1, 2, 3))
    unnamed = tmp_path / ".tmp-step-00000020-abc"  # a local run's, or one from before the naming
    for path in (older, own, newer, unnamed):
        path.mkdir()
    store = CheckpointStore(tmp_path, attempt=2)
    assert sorted(store.remove_temporaries()) == sorted([older, own, unnamed])
    assert newer.exists()  # the live write of the attempt that owns the job now
    assert store.begin(30).name.startswith(".tmp-a2-step-00000030-")


def test_a_disk_that_fills_while_the_output_is_written_ends_the_run_saying_so(
    synthetic_dataset_path: Path, tmp_path: Path
) -> None:
    """The output is a run's largest write (13.9 GB for pi05): a full disk there is a DiskFullError
    in words, which a worker ends the job with at once, not an OSError it retries on the same disk,
    and no partial output is left."""
    from relay.sft.config import SFTConfig
    from relay_engine.recipe import Recipe, run_recipe

    config = SFTConfig(model="pi05-tiny", dataset_name=str(synthetic_dataset_path), batch_size=2, steps=2)
    with small_disk("1m") as disk:  # pi05-tiny's model.safetensors alone is about 2 MB
        with pytest.raises(
            DiskFullError, match=r"no space left on device at .*output: the disk filled up while"
        ):
            run_recipe(
                Recipe.from_config(config, num_workers=0),
                tmp_path / "run",
                on_event=lambda event: None,
                should_stop=lambda: False,
                output_dir=disk / "output",
            )
        gc.collect()
        assert list(disk.iterdir()) == []  # the partial output is gone
