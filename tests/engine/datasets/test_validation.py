"""Every rule a v2.1 dataset must keep gets a clear error naming the dataset and the field or file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from relay_engine.datasets import inspect_dataset, open_dataset
from relay_engine.errors import DatasetError
from tests.engine.datasets.conftest import edit_info, episode_file, rewrite_episode


def problems_of(root: Path) -> list[str]:
    inspection = inspect_dataset(root, "my/data")
    assert not inspection.ok
    return inspection.problems.messages()


def test_a_good_dataset_has_no_problems(synthetic: Path) -> None:
    inspection = inspect_dataset(synthetic, "synthetic")
    assert inspection.ok, inspection.problems.messages()
    assert inspection.columns is not None and inspection.summary is not None
    assert len(inspection.columns.state) == inspection.summary.frames


def test_codebase_version_must_be_v21_or_v30(broken: Path) -> None:
    edit_info(broken, lambda info: info.update(codebase_version="v2.0"))
    [problem] = problems_of(broken)
    assert problem == "meta/info.json: codebase_version is 'v2.0'; Relay reads LeRobot v2.1 and v3.0 datasets"


def test_video_features_without_a_video_path_are_refused_by_name(broken: Path) -> None:
    def to_video(info: dict) -> None:
        info["features"]["observation.images.wrist"]["dtype"] = "video"

    edit_info(broken, to_video)
    problem = (
        "meta/info.json: video_path must be a template with {video_key} and {episode_index} "
        "(the dataset has video cameras), got None"
    )
    assert problems_of(broken) == [problem]
    with pytest.raises(DatasetError) as caught:
        open_dataset(str(broken), cache_dir=broken.parent / "cache")
    assert caught.value.dataset == str(broken)
    assert caught.value.problem == problem


def test_state_and_action_must_be_present_and_at_most_32_wide(broken: Path) -> None:
    def change(info: dict) -> None:
        del info["features"]["observation.state"]
        info["features"]["action"]["shape"] = [33]

    edit_info(broken, change)
    problems = problems_of(broken)
    assert "meta/info.json: features has no 'observation.state'" in problems
    assert "meta/info.json: features.action is 33 wide; at most 32 is supported" in problems


def test_tasks_file_must_exist(broken: Path) -> None:
    (broken / "meta/tasks.jsonl").unlink()
    assert "meta/tasks.jsonl is missing" in problems_of(broken)


def test_every_task_index_must_be_a_task(broken: Path) -> None:
    rewrite_episode(
        broken,
        2,
        lambda t: t.set_column(
            t.schema.get_field_index("task_index"),
            "task_index",
            pa.array(np.full(t.num_rows, 7, dtype=np.int64)),
        ),
    )
    [problem] = problems_of(broken)
    assert problem == "data/chunk-000/episode_000002.parquet: task_index 7 not in meta/tasks.jsonl"


def test_missing_and_unreadable_data_files(broken: Path) -> None:
    episode_file(broken, 1).unlink()
    episode_file(broken, 4).write_bytes(b"not parquet at all")
    problems = problems_of(broken)
    assert "data/chunk-000/episode_000001.parquet is missing" in problems
    [unreadable] = [p for p in problems if "episode_000004" in p]
    assert unreadable.startswith("data/chunk-000/episode_000004.parquet cannot be read as parquet")


def test_a_data_file_without_a_column(broken: Path) -> None:
    rewrite_episode(broken, 0, lambda t: t.drop_columns(["timestamp"]))
    assert problems_of(broken) == ["data/chunk-000/episode_000000.parquet has no column timestamp"]


def test_timestamps_must_follow_frame_index_over_fps(broken: Path) -> None:
    def shift(table: pa.Table) -> pa.Table:
        timestamps = table.column("timestamp").to_numpy().copy()
        timestamps[5] += 0.01
        return table.set_column(table.schema.get_field_index("timestamp"), "timestamp", pa.array(timestamps))

    rewrite_episode(broken, 3, shift)
    [problem] = problems_of(broken)
    assert problem.startswith(
        "data/chunk-000/episode_000003.parquet: timestamp 0.51 at frame_index 5 is out of sync"
    )


def test_duplicate_episode_and_frame_index_rows(broken: Path) -> None:
    def duplicate(table: pa.Table) -> pa.Table:
        frames = table.column("frame_index").to_numpy().copy()
        frames[4] = 3
        timestamps = frames / 10
        table = table.set_column(table.schema.get_field_index("frame_index"), "frame_index", pa.array(frames))
        return table.set_column(
            table.schema.get_field_index("timestamp"), "timestamp", pa.array(timestamps.astype(np.float32))
        )

    rewrite_episode(broken, 2, duplicate)
    assert problems_of(broken) == [
        "data/chunk-000/episode_000002.parquet: duplicate (episode_index, frame_index) rows: (2, 3)"
    ]


def test_row_count_must_match_episodes_jsonl(broken: Path) -> None:
    rewrite_episode(broken, 1, lambda t: t.slice(0, t.num_rows - 1))
    [problem] = problems_of(broken)
    assert problem.startswith("data/chunk-000/episode_000001.parquet has ")
    assert "but meta/episodes.jsonl says episode 1 has" in problem


def test_non_finite_actions(broken: Path) -> None:
    def poison(table: pa.Table) -> pa.Table:
        values = np.stack(table.column("action").to_numpy(zero_copy_only=False)).astype(np.float32)
        values[2, 1] = np.nan
        array = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
        return table.set_column(table.schema.get_field_index("action"), "action", array)

    rewrite_episode(broken, 0, poison)
    assert problems_of(broken) == ["data/chunk-000/episode_000000.parquet: action has NaN or infinite values"]


def test_the_same_problem_in_many_episodes_is_listed_a_few_times_then_counted(broken: Path) -> None:
    for episode in range(6):
        episode_file(broken, episode).unlink()
    problems = problems_of(broken)
    assert len(problems) == 4
    assert problems[-1] == "... and 3 more like that (missing data files)"


def test_broken_meta_json_is_named(broken: Path) -> None:
    (broken / "meta/info.json").write_text("{not json")
    [problem] = problems_of(broken)
    assert problem.startswith("meta/info.json cannot be read:")
    (broken / "meta/info.json").unlink()
    assert problems_of(broken) == ["meta/info.json is missing"]


def test_open_dataset_reports_every_problem_at_once(broken: Path) -> None:
    episode_file(broken, 1).unlink()
    rewrite_episode(broken, 3, lambda t: t.slice(0, t.num_rows - 1))
    with pytest.raises(DatasetError) as caught:
        open_dataset(str(broken), cache_dir=broken.parent / "cache")
    message = str(caught.value)
    assert message.startswith(f"dataset {broken}: ")
    assert "data/chunk-000/episode_000001.parquet is missing" in message
    assert "but meta/episodes.jsonl says episode 3 has" in message


def test_meta_problems_are_reported_before_reading_data_files(broken: Path) -> None:
    episode_file(broken, 1).unlink()
    lines = (broken / "meta/episodes.jsonl").read_text().splitlines()
    duplicate = json.dumps({"episode_index": 0, "length": 3})
    (broken / "meta/episodes.jsonl").write_text("\n".join([*lines, duplicate]))
    assert problems_of(broken) == ["meta/episodes.jsonl: episode_index 0 appears twice"]
