"""Check a whole v2.1 or v3.0 dataset and read the columns training needs.

`inspect_dataset` reads the meta files, then the numeric columns of every episode file (in
threads: pyarrow decodes without the GIL), and checks, over all frames at once, the rules a data
file must keep: its rows are its episode's frames 0..n-1 in order, each once; timestamps equal
frame_index / fps; every task_index is a task; states and actions are finite numbers of the right
width. The images are not decoded here (a full pass over them is what the frame index does), except
the first frame of each camera, which gives the camera's real size, and the first frame of every
video file, which shows that the bundled FFmpeg decodes its codec.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image, UnidentifiedImageError

from relay_engine.datasets.meta import (
    ACTION,
    CODEBASE_VERSION,
    INFO,
    STATE,
    TASKS,
    DatasetMeta,
    EpisodeMeta,
    read_meta,
)
from relay_engine.datasets.problems import Problems
from relay_engine.datasets.summary import DatasetSummary
from relay_engine.datasets.video import Probe, VideoError, probe

# lerobot's `check_timestamps_sync` tolerance.
TIMESTAMP_TOLERANCE_S = 1e-4
NUMERIC_COLUMNS = (STATE, ACTION, "timestamp", "frame_index", "episode_index", "task_index")


@dataclass
class FrameColumns:
    """The numeric columns of every frame, episodes in `episode_index` order."""

    state: np.ndarray  # (frames, state_dim) float32
    actions: np.ndarray  # (frames, action_dim) float32
    task_index: np.ndarray  # (frames,) int64
    episode_index: np.ndarray  # (episodes,) int64: the dataset's episode numbers
    episode_start: np.ndarray  # (episodes + 1,) int64: episode e is rows [start[e], start[e + 1])
    timestamp: np.ndarray | None = None  # (frames,) float64: each frame's time in its episode


@dataclass
class Inspection:
    problems: Problems
    meta: DatasetMeta | None = None
    summary: DatasetSummary | None = None
    columns: FrameColumns | None = None
    # Each video camera's first mp4 as decoded: its codec, size, pixel format and rate.
    videos: dict[str, Probe] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems and self.columns is not None


@dataclass
class _EpisodeFile:
    state: np.ndarray
    actions: np.ndarray
    timestamp: np.ndarray
    frame_index: np.ndarray
    episode_index: np.ndarray
    task_index: np.ndarray


def inspect_dataset(root: Path, name: str) -> Inspection:
    """Everything wrong with the dataset at `root` (`name` in messages), and its columns if nothing is."""
    problems = Problems(name)
    meta = read_meta(root, problems)
    inspection = Inspection(problems=problems, meta=meta)
    if meta is None:
        return inspection
    cameras = _first_frame_sizes(meta, problems)
    inspection.videos = _check_videos(meta, problems)
    cameras.update({camera: (found.height, found.width) for camera, found in inspection.videos.items()})
    cameras = {camera: cameras.get(camera, size) for camera, size in meta.camera_sizes.items()}
    inspection.summary = DatasetSummary(
        name=name,
        episodes=len(meta.episodes),
        frames=sum(episode.length for episode in meta.episodes),
        fps=meta.fps,
        cameras=cameras,
        state_dim=meta.state_dim,
        action_dim=meta.action_dim,
        tasks=dict(sorted(meta.tasks.items())),
        robot_type=meta.robot_type,
    )
    if problems:
        # A broken info.json (a missing state, a video camera) makes every data file look broken too.
        return inspection
    readable = _read_episode_files(meta, problems)
    if readable:
        # The readable files are checked too, so that every problem is reported at once.
        columns = _check_frames(meta, readable, problems)
        if not problems:
            inspection.columns = columns
    return inspection


# -- reading ----------------------------------------------------------------------------------------


def _read_episode_files(meta: DatasetMeta, problems: Problems) -> list[tuple[EpisodeMeta, _EpisodeFile]]:
    """The columns of each episode that can be read; a problem for each data file that cannot.
    Each data file is read once (in v3.0 one holds many episodes)."""
    by_file: dict[str, list[EpisodeMeta]] = {}
    for episode in meta.episodes:
        by_file.setdefault(meta.data_file(episode.index), []).append(episode)

    def read(relative: str) -> list[_EpisodeFile] | str:
        return _read_data_file(meta, relative, by_file[relative])

    workers = min(8, os.cpu_count() or 1, len(by_file))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = dict(zip(by_file, pool.map(read, list(by_file)), strict=True))
    readable: list[tuple[EpisodeMeta, _EpisodeFile]] = []
    for relative, result in results.items():
        if isinstance(result, str):
            kind, _, message = result.partition("|")
            problems.add(message, kind=kind)
        else:
            readable.extend(zip(by_file[relative], result, strict=True))
    readable.sort(key=lambda pair: pair[0].index)
    return readable


def _read_data_file(
    meta: DatasetMeta, relative: str, episodes: list[EpisodeMeta]
) -> list[_EpisodeFile] | str:
    """The numeric columns of each of the file's episodes, or "kind|message" naming the file and
    what is wrong. A v2.1 file is one episode's; a v3.0 file's rows are split by episode_index."""
    try:
        parquet = pq.ParquetFile(meta.root / relative)
    except FileNotFoundError:
        return f"missing data files|{relative} is missing"
    except (OSError, pa.ArrowException) as error:
        return f"unreadable data files|{relative} cannot be read as parquet: {error}"
    schema = parquet.schema_arrow
    missing = [
        column for column in (*meta.image_sizes, *NUMERIC_COLUMNS) if schema.get_field_index(column) < 0
    ]
    if missing:
        return f"data files missing columns|{relative} has no column {', '.join(missing)}"
    for camera in meta.image_sizes:
        if _image_bytes_type(schema.field(camera).type) is None:
            return (
                f"data files with bad image columns|{relative}: column {camera} holds "
                f"{schema.field(camera).type}, not images (struct<bytes, path>)"
            )
    try:
        table = parquet.read(columns=list(NUMERIC_COLUMNS))
    except (OSError, pa.ArrowException) as error:
        return f"unreadable data files|{relative} cannot be read: {error}"
    try:
        whole = _EpisodeFile(
            state=_matrix(table, STATE, meta.state_dim),
            actions=_matrix(table, ACTION, meta.action_dim),
            timestamp=_vector(table, "timestamp").astype(np.float64),
            frame_index=_vector(table, "frame_index").astype(np.int64),
            episode_index=_vector(table, "episode_index").astype(np.int64),
            task_index=_vector(table, "task_index").astype(np.int64),
        )
    except _ColumnError as error:
        return f"data files with bad columns|{relative}: {error}"
    if meta.version == CODEBASE_VERSION:
        return [whole]
    parts = []
    for episode in episodes:
        rows = whole.episode_index == episode.index
        parts.append(
            _EpisodeFile(*(getattr(whole, name)[rows] for name in _EpisodeFile.__dataclass_fields__))
        )
    return parts


class _ColumnError(ValueError):
    pass


def _matrix(table: pa.Table, name: str, width: int) -> np.ndarray:
    """A vector column -> float32 (rows, width)."""
    array = table.column(name).combine_chunks()
    if array.null_count:
        raise _ColumnError(f"{name} has {array.null_count} empty rows")
    kind = array.type
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if pa.types.is_fixed_size_list(kind):
            widths_ok = kind.list_size == width
        else:
            lengths = pc.list_value_length(array)
            widths_ok = len(array) == 0 or pc.all(pc.equal(lengths, pa.scalar(width, lengths.type))).as_py()
        if not widths_ok:
            raise _ColumnError(f"{name} rows are not {width} wide as meta/info.json says")
        values = cast("pa.lib.BaseListArray[Any]", array).flatten()
        if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
            raise _ColumnError(f"{name} holds {values.type}, not numbers")
        return values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(-1, width)
    if (pa.types.is_floating(kind) or pa.types.is_integer(kind)) and width == 1:
        return array.to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, 1)
    raise _ColumnError(f"{name} holds {kind}, not vectors of {width} numbers")


def _vector(table: pa.Table, name: str) -> np.ndarray:
    """A scalar column (or one stored as 1-wide lists) -> (rows,)."""
    column = table.column(name)
    array = column.combine_chunks()
    if array.null_count:
        raise _ColumnError(f"{name} has {array.null_count} empty rows")
    if pa.types.is_fixed_size_list(array.type) or pa.types.is_list(array.type):
        array = cast("pa.lib.BaseListArray[Any]", array).flatten()
    if not (pa.types.is_floating(array.type) or pa.types.is_integer(array.type)) or len(array) != len(column):
        raise _ColumnError(f"{name} holds {column.type}, not one number per frame")
    return array.to_numpy(zero_copy_only=False)


def _image_bytes_type(kind: pa.DataType) -> pa.DataType | None:
    """The binary type holding an image column's PNG bytes, or None if the column is not images."""
    if pa.types.is_struct(kind):
        index = kind.get_field_index("bytes")
        if index >= 0 and (
            pa.types.is_binary(kind.field(index).type) or pa.types.is_large_binary(kind.field(index).type)
        ):
            return kind.field(index).type
        return None
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return kind
    return None


def image_bytes(array: pa.Array) -> pa.Array:
    """An image column's chunk -> its array of encoded image bytes."""
    return cast(pa.StructArray, array).field("bytes") if pa.types.is_struct(array.type) else array


def episode_batches(
    meta: DatasetMeta, episode: int, columns: list[str], batch_size: int, buffer_size: int = 1 << 20
) -> Iterator[pa.RecordBatch]:
    """The episode's rows of `columns`, in file order, a batch at a time (streamed page by page).
    In v3.0 only the row groups whose statistics may hold the episode are read, and filtered."""
    parquet = pq.ParquetFile(meta.root / meta.data_file(episode), pre_buffer=False, buffer_size=buffer_size)
    if meta.version == CODEBASE_VERSION:
        yield from parquet.iter_batches(batch_size=batch_size, columns=columns)
        return
    metadata = parquet.metadata
    # The parquet (leaf) column of episode_index: an image struct has two leaves, so not the field's.
    position = next(
        (i for i in range(metadata.num_columns) if metadata.schema.column(i).path == "episode_index"), None
    )
    groups = []
    for group in range(parquet.num_row_groups):
        stats = None if position is None else metadata.row_group(group).column(position).statistics
        low, high = (stats.min, stats.max) if stats is not None and stats.has_min_max else (None, None)
        if low is None or high is None or low <= episode <= high:
            groups.append(group)
    if not groups:
        return
    for batch in parquet.iter_batches(
        batch_size=batch_size, row_groups=groups, columns=[*columns, "episode_index"]
    ):
        mask = pc.equal(batch.column(batch.schema.get_field_index("episode_index")), pa.scalar(episode))
        kept = batch.filter(mask).select(columns)
        if kept.num_rows:
            yield kept


def _first_frame_sizes(meta: DatasetMeta, problems: Problems) -> dict[str, tuple[int, int]]:
    """Each camera's (height, width), from its first decoded frame where it can be read."""
    sizes = dict(meta.image_sizes)
    if not sizes:
        return sizes
    relative = meta.data_file(meta.episodes[0].index)
    try:
        parquet = pq.ParquetFile(meta.root / relative, pre_buffer=False, buffer_size=1 << 20)
        present = [camera for camera in sizes if parquet.schema_arrow.get_field_index(camera) >= 0]
        batch = next(parquet.iter_batches(batch_size=1, columns=present), None)
        if batch is None:
            return sizes
        table = pa.Table.from_batches([batch])
    except (OSError, pa.ArrowException):
        return sizes  # the pass over every data file reports it
    for camera in present:
        column = table.column(camera)
        if _image_bytes_type(column.type) is None or len(column) == 0:
            continue
        # ChunkedArray.chunk gives an Array; pyarrow-stubs say a ChunkedArray.
        encoded = image_bytes(column.chunk(0))[0].as_py()  # type: ignore[arg-type]
        if encoded is None:
            problems.add(
                f"{relative}: {camera} holds no image bytes (only a path); Relay needs embedded images"
            )
            continue
        try:
            with Image.open(io.BytesIO(encoded)) as image:
                sizes[camera] = (image.height, image.width)
        except (UnidentifiedImageError, OSError) as error:
            problems.add(f"{relative}: the first frame of {camera} is not a readable image: {error}")
    return sizes


def _check_videos(meta: DatasetMeta, problems: Problems) -> dict[str, Probe]:
    """Every video file the episodes name exists and its first frame decodes (so the bundled FFmpeg
    decodes its codec); each video camera's first file as probed (codec, size, pixel format, rate)."""
    if not meta.video_path:
        return {}  # info.json's video_path is missing or broken, a problem already recorded
    files: dict[str, dict[str, None]] = {camera: {} for camera in meta.video_sizes}
    for episode in meta.episodes:
        for camera in meta.video_sizes:
            files[camera][meta.video_file(episode.index, camera)[0]] = None
    jobs = [(camera, relative) for camera, found in files.items() for relative in found]

    def check(job: tuple[str, str]) -> Probe | str:
        camera, relative = job
        path = meta.root / relative
        info = meta.features[camera].get("info")
        codec = info.get("video.codec", "unknown") if isinstance(info, dict) else "unknown"
        if not path.is_file():
            return f"missing video files|camera {camera}: {relative} is missing"
        try:
            found = probe(path)
        except VideoError as error:
            return (
                f"undecodable video files|camera {camera}: {relative} (codec {codec} in {INFO}) "
                f"cannot be decoded: {error}"
            )
        return found

    workers = min(8, os.cpu_count() or 1, max(1, len(jobs)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(check, jobs))
    probes: dict[str, Probe] = {}
    for (camera, _), result in zip(jobs, results, strict=True):
        if isinstance(result, str):
            kind, _, message = result.partition("|")
            problems.add(message, kind=kind)
        else:
            probes.setdefault(camera, result)
    return probes


# -- checks over all frames --------------------------------------------------------------------------


def _check_frames(
    meta: DatasetMeta, readable: list[tuple[EpisodeMeta, _EpisodeFile]], problems: Problems
) -> FrameColumns:
    """Check every row of the readable episode files against the meta files, a rule at a time over
    all episodes together; the columns training reads."""
    episodes = [episode for episode, _ in readable]
    files = [file for _, file in readable]
    lengths = np.array([len(f.frame_index) for f in files], dtype=np.int64)
    for episode, length in zip(episodes, lengths, strict=True):
        if length != episode.length:
            rows = "rows" if meta.version == CODEBASE_VERSION else f"rows of episode {episode.index}"
            problems.add(
                f"{meta.data_file(episode.index)} has {length} {rows} but {meta.episodes_file} says "
                f"episode {episode.index} has {episode.length}",
                kind="episode lengths",
            )
    frames = _Frames.of(episodes, files, lengths)
    _check_episode_rows(meta, frames, problems)
    _check_timestamps(meta, frames, problems)
    _check_values(meta, frames, problems)
    return FrameColumns(
        state=frames.state,
        actions=frames.actions,
        task_index=frames.task_index,
        episode_index=frames.episode_numbers,
        episode_start=frames.start,
        timestamp=frames.timestamp,
    )


@dataclass
class _Frames:
    """The readable episode files' rows, concatenated: episode e's rows are start[e]:start[e + 1]."""

    start: np.ndarray  # [E + 1]
    episode_numbers: np.ndarray  # [E] each file's episode_index as meta/episodes.jsonl gives it
    row_episode: np.ndarray  # [R] the position (0 to E - 1) of each row's file
    frame_index: np.ndarray
    episode_index: np.ndarray
    timestamp: np.ndarray
    task_index: np.ndarray
    state: np.ndarray
    actions: np.ndarray

    @classmethod
    def of(cls, episodes: list[EpisodeMeta], files: list[_EpisodeFile], lengths: np.ndarray) -> _Frames:
        return cls(
            start=np.concatenate([[0], np.cumsum(lengths)]),
            episode_numbers=np.array([episode.index for episode in episodes], dtype=np.int64),
            row_episode=np.repeat(np.arange(len(files)), lengths),
            frame_index=np.concatenate([f.frame_index for f in files]),
            episode_index=np.concatenate([f.episode_index for f in files]),
            timestamp=np.concatenate([f.timestamp for f in files]),
            task_index=np.concatenate([f.task_index for f in files]),
            state=np.concatenate([f.state for f in files]),
            actions=np.concatenate([f.actions for f in files]),
        )

    def episodes_where(self, bad: np.ndarray) -> np.ndarray:
        """The positions of the episodes with a row where `bad` (a mask over all rows) is True."""
        return np.flatnonzero(np.bincount(self.row_episode[bad], minlength=len(self.episode_numbers)))

    def rows(self, e: int) -> slice:
        """Episode e's rows."""
        return slice(self.start[e], self.start[e + 1])

    def file(self, meta: DatasetMeta, e: int) -> str:
        """Episode e's data file, as problems name it."""
        return meta.data_file(int(self.episode_numbers[e]))


def _check_episode_rows(meta: DatasetMeta, frames: _Frames, problems: Problems) -> None:
    """Each file holds only its episode's rows, numbered 0, 1, ... by frame_index."""
    for e in frames.episodes_where(frames.episode_index != frames.episode_numbers[frames.row_episode]):
        rows = frames.episode_index[frames.rows(e)]
        others = sorted(set(rows.tolist()) - {int(frames.episode_numbers[e])})[:3]
        problems.add(
            f"{frames.file(meta, e)} holds rows of episode_index {others}, "
            f"not only {frames.episode_numbers[e]}",
            kind="rows in the wrong episode file",
        )
    expected_frame = np.arange(len(frames.frame_index)) - frames.start[frames.row_episode]
    for e in frames.episodes_where(frames.frame_index != expected_frame):
        _frame_order_problem(
            meta, int(frames.episode_numbers[e]), frames.frame_index[frames.rows(e)], problems
        )


def _check_timestamps(meta: DatasetMeta, frames: _Frames, problems: Problems) -> None:
    """Each row's timestamp is its frame_index / fps, within TIMESTAMP_TOLERANCE_S (the first row
    out of sync is named)."""
    timestamp, frame_index = frames.timestamp, frames.frame_index
    drift = np.abs(timestamp - frame_index / meta.fps)
    for e in frames.episodes_where(drift > TIMESTAMP_TOLERANCE_S):
        row = frames.start[e] + int(np.argmax(drift[frames.rows(e)] > TIMESTAMP_TOLERANCE_S))
        problems.add(
            f"{frames.file(meta, e)}: timestamp {timestamp[row]:.6g} at frame_index "
            f"{frame_index[row]} is out of sync with frame_index/fps = {frame_index[row] / meta.fps:.6g} "
            f"(fps {meta.fps:g}, tolerance {TIMESTAMP_TOLERANCE_S:g} s)",
            kind="timestamps out of sync",
        )


def _check_values(meta: DatasetMeta, frames: _Frames, problems: Problems) -> None:
    """Every task_index is one of meta/tasks.jsonl's; states and actions are finite."""
    known_tasks = np.array(sorted(meta.tasks), dtype=np.int64)
    unknown = ~np.isin(frames.task_index, known_tasks)
    for e in frames.episodes_where(unknown):
        rows = frames.rows(e)
        bad = sorted(set(frames.task_index[rows][unknown[rows]].tolist()))
        problems.add(
            f"{frames.file(meta, e)}: task_index {', '.join(map(str, bad[:5]))} not in {TASKS}",
            kind="unknown task_index",
        )
    for name, values in ((STATE, frames.state), (ACTION, frames.actions)):
        for e in frames.episodes_where(~np.isfinite(values).all(axis=1)):
            problems.add(
                f"{frames.file(meta, e)}: {name} has NaN or infinite values",
                kind=f"non-finite {name}",
            )


def _frame_order_problem(meta: DatasetMeta, episode: int, frames: np.ndarray, problems: Problems) -> None:
    relative = meta.data_file(episode)
    values, counts = np.unique(frames, return_counts=True)
    if (counts > 1).any():
        twice = values[counts > 1][:5].tolist()
        rows = ", ".join(f"({episode}, {frame})" for frame in twice)
        problems.add(
            f"{relative}: duplicate (episode_index, frame_index) rows: {rows}", kind="duplicate rows"
        )
        return
    row = int(np.argmax(frames != np.arange(len(frames))))
    problems.add(
        f"{relative}: frame_index must run 0..{len(frames) - 1} in order; row {row} has {frames[row]}",
        kind="frame_index order",
    )
