"""The `meta/` files of a LeRobot v2.1 dataset: info.json, tasks.jsonl and episodes.jsonl.

Reading them checks every rule that the meta files alone decide (format version, image vs video
cameras, state and action widths, tasks, the episode table) and records each broken one in
`Problems`, naming the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from relay.catalog import ACTION_DIM, STATE_DIM
from relay_engine.datasets.problems import Problems
from relay_engine.errors import DatasetError

CODEBASE_VERSION = "v2.1"
STATE = "observation.state"
ACTION = "action"
# Columns every v2.1 data file has besides the features a user records.
FRAME_COLUMNS = ("timestamp", "frame_index", "episode_index", "task_index")
INFO = "meta/info.json"
TASKS = "meta/tasks.jsonl"
EPISODES = "meta/episodes.jsonl"
DEFAULT_CHUNKS_SIZE = 1000


def video_not_supported(feature: str) -> str:
    return f"datasets that store video aren't supported yet: {feature}"


@dataclass(frozen=True)
class EpisodeMeta:
    index: int
    length: int


@dataclass
class DatasetMeta:
    root: Path
    fps: float
    features: dict[str, dict[str, Any]]
    # Image features in info.json's order, with (height, width) as info.json states them.
    image_sizes: dict[str, tuple[int, int]]
    state_dim: int
    action_dim: int
    tasks: dict[int, str]
    episodes: list[EpisodeMeta]
    data_path: str
    chunks_size: int
    robot_type: str

    def data_file(self, episode_index: int) -> str:
        """The episode's parquet file, relative to the root."""
        return self.data_path.format(
            episode_chunk=episode_index // self.chunks_size, episode_index=episode_index
        )


def read_meta(root: Path, problems: Problems) -> DatasetMeta | None:
    """Read and check the meta files. None when the dataset cannot be read any further."""
    info = _read_json(root, INFO, problems)
    if info is None:
        return None
    features = _versioned_features(info, problems)
    if features is None:
        return None
    fps, data_path, chunks_size = _file_layout(info, problems)
    image_sizes = _image_sizes(features, problems)
    state_dim = _vector_width(features, STATE, STATE_DIM, problems)
    action_dim = _vector_width(features, ACTION, ACTION_DIM, problems)
    for column in FRAME_COLUMNS:
        if column not in features:
            problems.add(f"{INFO}: features has no {column!r}")

    tasks = _read_tasks(root, problems)
    episodes = _read_episodes(root, info, problems)
    if tasks is None or episodes is None or not data_path or not fps:
        return None
    return DatasetMeta(
        root=root,
        fps=float(fps),
        features=features,
        image_sizes=image_sizes,
        state_dim=state_dim,
        action_dim=action_dim,
        tasks=tasks,
        episodes=episodes,
        data_path=data_path,
        chunks_size=chunks_size,
        robot_type=str(info.get("robot_type") or "unknown"),
    )


def _versioned_features(info: dict[str, Any], problems: Problems) -> dict[str, dict[str, Any]] | None:
    """info.json's features, when it is of the version Relay reads and they are feature objects;
    None (the problem recorded) when the dataset cannot be read any further."""
    version = info.get("codebase_version")
    if version != CODEBASE_VERSION:
        problems.add(
            f"{INFO}: codebase_version is {version!r}; Relay reads LeRobot v2.1 datasets "
            "(v3.0 datasets are not supported yet)"
        )
        return None
    features = info.get("features")
    if not isinstance(features, dict) or not all(isinstance(f, dict) for f in features.values()):
        problems.add(f"{INFO}: features is missing or is not an object of feature objects")
        return None
    return features


def _file_layout(info: dict[str, Any], problems: Problems) -> tuple[float, str, int]:
    """info.json's fps, data_path template and chunks_size; a broken one is recorded and given as
    0, "" or the default (the first two then stop the reading once every rule is checked)."""
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, int | float) or fps <= 0:
        problems.add(f"{INFO}: fps must be a positive number, got {fps!r}")
        fps = 0.0
    data_path = info.get("data_path")
    if not isinstance(data_path, str) or "{episode_index" not in data_path:
        problems.add(f"{INFO}: data_path must be a template with {{episode_index}}, got {data_path!r}")
        data_path = ""
    chunks_size = info.get("chunks_size", DEFAULT_CHUNKS_SIZE)
    if isinstance(chunks_size, bool) or not isinstance(chunks_size, int) or chunks_size < 1:
        problems.add(f"{INFO}: chunks_size must be a positive integer, got {chunks_size!r}")
        chunks_size = DEFAULT_CHUNKS_SIZE
    return fps, data_path, chunks_size


def _image_sizes(features: dict[str, dict[str, Any]], problems: Problems) -> dict[str, tuple[int, int]]:
    """The cameras: each image feature's (height, width), in info.json's order. A video feature, an
    image without an image shape, and a dataset without any camera are problems."""
    image_sizes: dict[str, tuple[int, int]] = {}
    for name, feature in features.items():
        if feature.get("dtype") == "video":
            problems.add(video_not_supported(name))
        elif feature.get("dtype") == "image":
            size = _image_size(feature)
            if size is None:
                problems.add(
                    f"{INFO}: features.{name}.shape must be an image shape, got {feature.get('shape')!r}"
                )
            else:
                image_sizes[name] = size
    if not image_sizes and not any(f.get("dtype") == "video" for f in features.values()):
        problems.add(f'{INFO}: no camera: no feature has "dtype": "image"')
    return image_sizes


def require_meta(root: Path, name: str) -> DatasetMeta:
    """`read_meta`, raising DatasetError when the meta files cannot be read at all."""
    problems = Problems(name)
    meta = read_meta(root, problems)
    if meta is None:
        problems.raise_if_any()
        raise DatasetError(name, "meta files cannot be read")  # read_meta records why; never reached
    return meta


def _read_json(root: Path, relative: str, problems: Problems) -> dict[str, Any] | None:
    try:
        value = json.loads((root / relative).read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.add(f"{relative} is missing")
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        problems.add(f"{relative} cannot be read: {error}")
        return None
    if not isinstance(value, dict):
        problems.add(f"{relative} must hold a JSON object")
        return None
    return value


def _read_jsonl(root: Path, relative: str, problems: Problems) -> list[dict[str, Any]] | None:
    try:
        text = (root / relative).read_text(encoding="utf-8")
    except FileNotFoundError:
        problems.add(f"{relative} is missing")
        return None
    except (OSError, UnicodeDecodeError) as error:
        problems.add(f"{relative} cannot be read: {error}")
        return None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            problems.add(f"{relative} line {number} is not JSON: {error}", kind=f"{relative} bad lines")
            continue
        if not isinstance(row, dict):
            problems.add(f"{relative} line {number} is not a JSON object", kind=f"{relative} bad lines")
            continue
        rows.append(row)
    return rows


def _read_tasks(root: Path, problems: Problems) -> dict[int, str] | None:
    rows = _read_jsonl(root, TASKS, problems)
    if rows is None:
        return None
    tasks: dict[int, str] = {}
    for row in rows:
        index, task = row.get("task_index"), row.get("task")
        if not _is_index(index) or not isinstance(task, str):
            problems.add(
                f"{TASKS}: each line needs an integer task_index and a string task, got {row!r}",
                kind=f"{TASKS} bad lines",
            )
        elif index in tasks:
            problems.add(f"{TASKS}: task_index {index} appears twice", kind=f"{TASKS} duplicates")
        else:
            tasks[index] = task
    if not tasks:
        problems.add(f"{TASKS} lists no tasks")
        return None
    return tasks


def _read_episodes(root: Path, info: dict[str, Any], problems: Problems) -> list[EpisodeMeta] | None:
    rows = _read_jsonl(root, EPISODES, problems)
    if rows is None:
        return None
    episodes: dict[int, EpisodeMeta] = {}
    for row in rows:
        index, length = row.get("episode_index"), row.get("length")
        if not _is_index(index) or not _is_index(length) or length < 1:
            problems.add(
                f"{EPISODES}: each line needs an integer episode_index and a positive length, got {row!r}",
                kind=f"{EPISODES} bad lines",
            )
        elif index in episodes:
            problems.add(f"{EPISODES}: episode_index {index} appears twice", kind=f"{EPISODES} duplicates")
        else:
            episodes[index] = EpisodeMeta(index, length)
    if not episodes:
        problems.add(f"{EPISODES} lists no episodes")
        return None
    total = info.get("total_episodes")
    if total is not None and total != len(episodes):
        problems.add(f"{INFO}: total_episodes is {total} but {EPISODES} lists {len(episodes)} episodes")
    return [episodes[index] for index in sorted(episodes)]


def _vector_width(features: dict[str, dict[str, Any]], name: str, limit: int, problems: Problems) -> int:
    feature = features.get(name)
    if feature is None:
        problems.add(f"{INFO}: features has no {name!r}")
        return 0
    shape = feature.get("shape")
    if not isinstance(shape, list) or len(shape) != 1 or not _is_index(shape[0]) or shape[0] < 1:
        problems.add(f"{INFO}: features.{name}.shape must be [width], got {shape!r}")
        return 0
    if shape[0] > limit:
        problems.add(f"{INFO}: features.{name} is {shape[0]} wide; at most {limit} is supported")
    if feature.get("dtype") not in ("float32", "float64", "float16"):
        problems.add(f"{INFO}: features.{name}.dtype must be a float type, got {feature.get('dtype')!r}")
    return int(shape[0])


def _image_size(feature: dict[str, Any]) -> tuple[int, int] | None:
    """(height, width) from a feature's shape, which is (H, W, C) or, with names saying so, (C, H, W)."""
    shape, names = feature.get("shape"), feature.get("names")
    if not isinstance(shape, list) or len(shape) != 3 or not all(_is_index(n) and n > 0 for n in shape):
        return None
    if isinstance(names, list) and "height" in names and "width" in names:
        return shape[names.index("height")], shape[names.index("width")]
    if shape[0] in (1, 3, 4) and shape[2] not in (1, 3, 4):
        return shape[1], shape[2]
    return shape[0], shape[1]


def _is_index(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
