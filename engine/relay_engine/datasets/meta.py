"""The `meta/` files of a LeRobot dataset: v2.1 (info.json, tasks.jsonl, episodes.jsonl) or v3.0
(info.json, tasks.parquet, meta/episodes/chunk-*/file-*.parquet).

Reading them checks every rule that the meta files alone decide (format version, image vs video
cameras, state and action widths, tasks, the episode table) and records each broken one in
`Problems`, naming the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import pyarrow as pa
import pyarrow.parquet as pq

from relay.catalog import ACTION_DIM, STATE_DIM
from relay_engine.datasets.problems import Problems
from relay_engine.errors import DatasetError

CODEBASE_VERSION = "v2.1"
V3 = "v3.0"
VERSIONS = (CODEBASE_VERSION, V3)
STATE = "observation.state"
ACTION = "action"
# Columns every v2.1 data file has besides the features a user records.
FRAME_COLUMNS = ("timestamp", "frame_index", "episode_index", "task_index")
INFO = "meta/info.json"
TASKS = "meta/tasks.jsonl"
EPISODES = "meta/episodes.jsonl"
V3_TASKS = "meta/tasks.parquet"
V3_EPISODES = "meta/episodes"
DEFAULT_CHUNKS_SIZE = 1000


@dataclass(frozen=True)
class EpisodeMeta:
    index: int
    length: int
    # v3.0: the episode's data file, and per video camera its mp4 and its start time in that file.
    data_file: str | None = None
    video_files: dict[str, tuple[str, float]] = field(default_factory=dict)


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
    version: str = CODEBASE_VERSION
    # Video features in info.json's order, with (height, width) as info.json states them.
    video_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    video_path: str = ""
    meta_files: tuple[str, ...] = (INFO, TASKS, EPISODES)
    _by_index: dict[int, EpisodeMeta] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_index = {episode.index: episode for episode in self.episodes}

    @property
    def camera_sizes(self) -> dict[str, tuple[int, int]]:
        """Every camera, image or video, in info.json's order."""
        return {
            name: self.image_sizes.get(name) or self.video_sizes[name]
            for name in self.features
            if name in self.image_sizes or name in self.video_sizes
        }

    @property
    def episodes_file(self) -> str:
        """Where the episode table comes from, as problems name it."""
        return EPISODES if self.version == CODEBASE_VERSION else f"{V3_EPISODES}/"

    def data_file(self, episode_index: int) -> str:
        """The episode's parquet file, relative to the root (in v3.0, shared with other episodes)."""
        episode = self._by_index.get(episode_index)
        if episode is not None and episode.data_file is not None:
            return episode.data_file
        return self.data_path.format(
            episode_chunk=episode_index // self.chunks_size, episode_index=episode_index
        )

    def data_files(self) -> list[str]:
        """Every data file, once each, in the order of their first episode."""
        return list(dict.fromkeys(self.data_file(episode.index) for episode in self.episodes))

    def video_file(self, episode_index: int, camera: str) -> tuple[str, float]:
        """The episode's mp4 for a video camera, relative to the root, and the episode's start in it."""
        episode = self._by_index.get(episode_index)
        if episode is not None and camera in episode.video_files:
            return episode.video_files[camera]
        relative = self.video_path.format(
            episode_chunk=episode_index // self.chunks_size, video_key=camera, episode_index=episode_index
        )
        return relative, 0.0


def read_meta(root: Path, problems: Problems) -> DatasetMeta | None:
    """Read and check the meta files. None when the dataset cannot be read any further."""
    info = _read_json(root, INFO, problems)
    if info is None:
        return None
    versioned = _versioned_features(info, problems)
    if versioned is None:
        return None
    version, features = versioned
    fps, data_path, chunks_size = _file_layout(info, version, problems)
    image_sizes, video_sizes = _camera_sizes(features, problems)
    video_path = _video_path(info, version, video_sizes, problems)
    state_dim = _vector_width(features, STATE, STATE_DIM, problems)
    action_dim = _vector_width(features, ACTION, ACTION_DIM, problems)
    for column in FRAME_COLUMNS:
        if column not in features:
            problems.add(f"{INFO}: features has no {column!r}")

    if version == CODEBASE_VERSION:
        tasks = _read_tasks(root, problems)
        episodes = _read_episodes(root, info, problems)
        meta_files: tuple[str, ...] = (INFO, TASKS, EPISODES)
    else:
        tasks = _read_v3_tasks(root, problems)
        episode_files = sorted((root / V3_EPISODES).glob("chunk-*/file-*.parquet"))
        episodes = _read_v3_episodes(root, info, episode_files, data_path, video_sizes, problems)
        meta_files = (INFO, V3_TASKS, *(str(p.relative_to(root)) for p in episode_files))
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
        version=version,
        video_sizes=video_sizes,
        video_path=video_path,
        meta_files=meta_files,
    )


def _versioned_features(
    info: dict[str, Any], problems: Problems
) -> tuple[str, dict[str, dict[str, Any]]] | None:
    """info.json's version and features, when it is a version Relay reads and they are feature
    objects; None (the problem recorded) when the dataset cannot be read any further."""
    version = info.get("codebase_version")
    if version not in VERSIONS:
        problems.add(f"{INFO}: codebase_version is {version!r}; Relay reads LeRobot v2.1 and v3.0 datasets")
        return None
    features = info.get("features")
    if not isinstance(features, dict) or not all(isinstance(f, dict) for f in features.values()):
        problems.add(f"{INFO}: features is missing or is not an object of feature objects")
        return None
    return str(version), features


def _file_layout(info: dict[str, Any], version: str, problems: Problems) -> tuple[float, str, int]:
    """info.json's fps, data_path template and chunks_size; a broken one is recorded and given as
    0, "" or the default (the first two then stop the reading once every rule is checked)."""
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, int | float) or fps <= 0:
        problems.add(f"{INFO}: fps must be a positive number, got {fps!r}")
        fps = 0.0
    data_path = info.get("data_path")
    placeholders = ("{episode_index",) if version == CODEBASE_VERSION else ("{chunk_index", "{file_index")
    if not isinstance(data_path, str) or not all(p in data_path for p in placeholders):
        wanted = " and ".join(p + "}" for p in placeholders)
        problems.add(f"{INFO}: data_path must be a template with {wanted}, got {data_path!r}")
        data_path = ""
    chunks_size = info.get("chunks_size", DEFAULT_CHUNKS_SIZE)
    if isinstance(chunks_size, bool) or not isinstance(chunks_size, int) or chunks_size < 1:
        problems.add(f"{INFO}: chunks_size must be a positive integer, got {chunks_size!r}")
        chunks_size = DEFAULT_CHUNKS_SIZE
    return fps, data_path, chunks_size


def _video_path(
    info: dict[str, Any], version: str, video_sizes: dict[str, tuple[int, int]], problems: Problems
) -> str:
    """info.json's video_path template, which a dataset with video cameras needs."""
    if not video_sizes:
        return ""
    video_path = info.get("video_path")
    placeholders = (
        ("{video_key", "{episode_index")
        if version == CODEBASE_VERSION
        else ("{video_key", "{chunk_index", "{file_index")
    )
    if not isinstance(video_path, str) or not all(p in video_path for p in placeholders):
        wanted = " and ".join(p + "}" for p in placeholders)
        problems.add(
            f"{INFO}: video_path must be a template with {wanted} (the dataset has video cameras), "
            f"got {video_path!r}"
        )
        return ""
    return video_path


def _camera_sizes(
    features: dict[str, dict[str, Any]], problems: Problems
) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """The cameras: each image feature's and each video feature's (height, width), in info.json's
    order. A camera without an image shape, and a dataset without any camera, are problems."""
    image_sizes: dict[str, tuple[int, int]] = {}
    video_sizes: dict[str, tuple[int, int]] = {}
    for name, feature in features.items():
        dtype = feature.get("dtype")
        if dtype in ("image", "video"):
            size = _image_size(feature)
            if size is None:
                problems.add(
                    f"{INFO}: features.{name}.shape must be an image shape, got {feature.get('shape')!r}"
                )
            else:
                (image_sizes if dtype == "image" else video_sizes)[name] = size
    if (
        not image_sizes
        and not video_sizes
        and not any(f.get("dtype") in ("image", "video") for f in features.values())
    ):
        problems.add(f'{INFO}: no camera: no feature has "dtype": "image" or "video"')
    return image_sizes, video_sizes


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


def _read_parquet(root: Path, relative: str, problems: Problems) -> pa.Table | None:
    try:
        return pq.read_table(root / relative)
    except FileNotFoundError:
        problems.add(f"{relative} is missing")
    except (OSError, pa.ArrowException) as error:
        problems.add(f"{relative} cannot be read as parquet: {error}")
    return None


def _read_v3_tasks(root: Path, problems: Problems) -> dict[int, str] | None:
    """meta/tasks.parquet: a task_index column and the task strings (lerobot writes them as the
    pandas index, a column named "task" or "__index_level_0__")."""
    table = _read_parquet(root, V3_TASKS, problems)
    if table is None:
        return None
    names = table.column_names
    text = next((n for n in ("task", "__index_level_0__") if n in names), None)
    if "task_index" not in names or text is None:
        problems.add(f"{V3_TASKS} needs a task_index column and a task column, has {', '.join(names)}")
        return None
    tasks: dict[int, str] = {}
    for index, task in zip(
        table.column("task_index").to_pylist(), table.column(text).to_pylist(), strict=True
    ):
        if not _is_index(index) or not isinstance(task, str):
            problems.add(
                f"{V3_TASKS}: each row needs an integer task_index and a string task, got "
                f"{index!r}, {task!r}",
                kind=f"{V3_TASKS} bad rows",
            )
        elif index in tasks:
            problems.add(f"{V3_TASKS}: task_index {index} appears twice", kind=f"{V3_TASKS} duplicates")
        else:
            tasks[index] = task
    if not tasks:
        problems.add(f"{V3_TASKS} lists no tasks")
        return None
    return tasks


def _read_v3_episodes(
    root: Path,
    info: dict[str, Any],
    files: list[Path],
    data_path: str,
    video_sizes: dict[str, tuple[int, int]],
    problems: Problems,
) -> list[EpisodeMeta] | None:
    """meta/episodes/chunk-*/file-*.parquet: per episode its length, data file, and per video camera
    its mp4 and the episode's [from_timestamp, to_timestamp) in it."""
    if not files:
        problems.add(f"{V3_EPISODES}/ has no chunk-*/file-*.parquet files")
        return None
    needed = ["episode_index", "length", "data/chunk_index", "data/file_index"]
    for camera in video_sizes:
        needed += [f"videos/{camera}/{column}" for column in ("chunk_index", "file_index", "from_timestamp")]
    episodes: dict[int, EpisodeMeta] = {}
    for path in files:
        relative = str(path.relative_to(root))
        table = _read_parquet(root, relative, problems)
        if table is None:
            continue
        missing = [column for column in needed if column not in table.column_names]
        if missing:
            problems.add(f"{relative} has no column {', '.join(missing)}")
            continue
        columns: dict[str, list[Any]] = {column: table.column(column).to_pylist() for column in needed}
        for row in range(table.num_rows):
            value: dict[str, Any] = {column: columns[column][row] for column in needed}
            index, length = value["episode_index"], value["length"]
            integers = [value[c] for c in needed if not c.endswith("from_timestamp")]
            starts = [value[c] for c in needed if c.endswith("from_timestamp")]
            if (
                not all(_is_index(v) for v in integers)
                or length < 1
                or not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in starts)
            ):
                problems.add(
                    f"{relative} row {row}: needs integer episode_index, a positive length, "
                    f"file indices and from_timestamps >= 0, got {value!r}",
                    kind=f"{V3_EPISODES} bad rows",
                )
                continue
            if index in episodes:
                problems.add(
                    f"{relative}: episode_index {index} appears twice", kind=f"{V3_EPISODES} duplicates"
                )
                continue
            data_file = (
                data_path.format(chunk_index=value["data/chunk_index"], file_index=value["data/file_index"])
                if data_path
                else ""
            )
            videos = {
                camera: (
                    str(info.get("video_path") or "").format(
                        video_key=camera,
                        chunk_index=value[f"videos/{camera}/chunk_index"],
                        file_index=value[f"videos/{camera}/file_index"],
                    ),
                    float(value[f"videos/{camera}/from_timestamp"]),
                )
                for camera in video_sizes
            }
            episodes[index] = EpisodeMeta(index, length, data_file, videos)
    if not episodes:
        problems.add(f"{V3_EPISODES}/ lists no episodes")
        return None
    total = info.get("total_episodes")
    if total is not None and total != len(episodes):
        problems.add(f"{INFO}: total_episodes is {total} but {V3_EPISODES}/ lists {len(episodes)} episodes")
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
