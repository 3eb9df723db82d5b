"""A frame index: one dataset laid out for fast random access to single frames, built once.

Why: a parquet file can only be decoded a whole column chunk (a row group, often 100 PNG frames)
at a time, so reading one random frame from parquet costs about a hundred frames' worth of I/O and
decompression. Training reads frames in random order, so the index stores, per camera, every
frame's PNG bytes back to back in one file with an offsets array, and the numeric columns as .npy
files. One frame is then a few `os.pread` calls: no per-process copy of the dataset, and no mmap
(mapped pages count toward a process's RSS as they are touched, and a training run touches all).

The cost is disk: the index holds a second copy of the image bytes (about the size of the
parquet files). It lives in the cache, keyed by the dataset's content (the meta files' bytes and
each data file's size and parquet footer), replaces the dataset's older indexes, and is kept to
the cache's size limit (relay_engine.datasets.frame_cache). It is built in a temporary directory
and renamed into place (the rename is what marks it complete), under a file lock so that workers
opening the same dataset at once build it once.

Layout of `<cache>/frames/<key>/`:
    summary.json                 DatasetSummary
    norm_stats.json              statistics computed over every frame (openpi layout)
    state.npy, actions.npy       float32 (frames, width)
    task_index.npy               int64 (frames,)
    episode_index.npy            int64 (episodes,)   the dataset's episode numbers
    episode_start.npy            int64 (episodes + 1,)
    images/<feature>.bin         the encoded frames, back to back
    images/<feature>.offsets.npy int64 (frames + 1,)
    videos.json                  per video camera, its mp4 files (relative to the dataset's root)
    videos/<feature>.file.npy    int32 (frames,)     each frame's file, a position in videos.json
    videos/<feature>.time.npy    float64 (frames,)   each frame's time in that file, in seconds
    decoded-<fit>/               video cameras' frames, decoded once at a model's size (where they
                                 fit the limit); decoded/ at their recorded size

A video camera's frame is the one at the episode's start in its mp4 plus the frame's timestamp.
Where the decoded frames, at the size the model reads, fit `RELAY_VIDEO_CACHE_MAX_BYTES`, every
frame is decoded once, in order, and fitted to that size into `decoded-<fit>/`
(relay_engine.datasets.decoded_frames); otherwise each sample decodes its frame from the dataset's
mp4 (relay_engine.datasets.video).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from filelock import FileLock

from relay_engine.datasets import decoded_frames, frame_cache
from relay_engine.datasets.meta import DatasetMeta
from relay_engine.datasets.norm_stats import NormStats, compute_norm_stats
from relay_engine.datasets.summary import DatasetSummary
from relay_engine.datasets.validation import FrameColumns, episode_batches, image_bytes, inspect_dataset
from relay_engine.errors import DatasetError
from relay_engine.image_fit import ImageFit

# Bump when the layout changes: old indexes are then rebuilt, not misread.
FORMAT = "relay-frame-index-1"
SUMMARY = "summary.json"
SOURCE = "source.json"  # which dataset (name, root directory) an index was built from
VIDEOS = "videos.json"
NORM_STATS = "norm_stats.json"
# Rows per read while copying images: bounds memory to a few dozen frames per camera.
COPY_BATCH_ROWS = 64
STREAM_BUFFER = 1 << 20


def fingerprint(meta: DatasetMeta) -> str:
    """A key for the dataset's content: the meta files, and each data file's size and parquet footer
    (its schema, row groups and their statistics: it changes with the data, and costs one small read
    at the file's end). Touching a file, or copying the dataset without keeping times, keeps the key."""
    digest = hashlib.sha256(FORMAT.encode())
    for relative in meta.meta_files:
        digest.update(relative.encode() + b"\0" + (meta.root / relative).read_bytes())
    for relative in meta.data_files():
        digest.update(f"{relative}\0".encode() + _parquet_footer(meta.root / relative) + b"\0")
    for camera in meta.video_sizes:  # (none in an image dataset: its key is as it was)
        for relative in dict.fromkeys(meta.video_file(e.index, camera)[0] for e in meta.episodes):
            path = meta.root / relative
            size = path.stat().st_size if path.is_file() else -1
            digest.update(f"{relative}\0{size}\0".encode())
    return digest.hexdigest()[:32]


def _parquet_footer(path: Path) -> bytes:
    """The file's size and its footer's bytes; b"missing" or b"unreadable" when it has none."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            if size < 12:
                return b"unreadable"
            file.seek(size - 8)
            tail = file.read(8)
            length = int.from_bytes(tail[:4], "little")
            if tail[4:] != b"PAR1" or length > size - 12:
                return b"unreadable"
            file.seek(size - 8 - length)
            return str(size).encode() + b"\0" + file.read(length)
    except FileNotFoundError:
        return b"missing"


def ensure_frame_index(meta: DatasetMeta, name: str, cache: Path, fit: ImageFit | None = None) -> Path:
    """The index directory of the dataset `meta` describes, validating and building it if needed,
    and decoding its video cameras into it, at `fit`'s size (as recorded without one), where they
    fit (relay_engine.datasets.decoded_frames).

    Raises DatasetError with every problem found if the dataset cannot be trained on.
    """
    target = cache / "frames" / fingerprint(meta)
    if not (target / SUMMARY).is_file():
        _build(meta, name, target, cache)
    if meta.video_sizes and not (target / decoded_frames.directory_name(fit)).is_dir():
        _decode_videos(target, meta.root, name, fit)
    return target


def _build(meta: DatasetMeta, name: str, target: Path, cache: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{target}.lock"):
        if (target / SUMMARY).is_file():
            return
        # Left by a build that was killed; nobody else builds this index while we hold the lock.
        for stale in target.parent.glob(f".{target.name}.*"):
            shutil.rmtree(stale, ignore_errors=True)
        inspection = inspect_dataset(meta.root, name)
        inspection.problems.raise_if_any()
        assert inspection.summary is not None and inspection.columns is not None and inspection.meta
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            _write(staging, inspection.meta, inspection.summary, inspection.columns, name)
            (staging / SOURCE).write_text(json.dumps({"dataset": name, "root": str(meta.root.resolve())}))
            staging.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    # A new index of a dataset replaces the old ones (of its earlier content), and the cache keeps
    # to its size limit.
    frame_cache.remove_older_copies(cache, target)
    frame_cache.prune(cache, frame_cache.limit_bytes(), keep=target)


def _decode_videos(target: Path, root: Path, name: str, fit: ImageFit | None) -> None:
    """Decode the index's video cameras into it once, at `fit`'s size, if their frames at that size
    fit (else they are decoded per sample). Under the index's build lock, so that workers opening
    the dataset at once decode it once."""
    summary = DatasetSummary.from_dict(json.loads((target / SUMMARY).read_text()))
    files: dict[str, list[str]] = json.loads((target / VIDEOS).read_text())
    sizes = {camera: summary.cameras[camera] for camera in files}
    if not decoded_frames.fits(target, summary.frames, decoded_frames.cached_sizes(sizes, fit)):
        return
    with FileLock(f"{target}.lock"):
        if (target / decoded_frames.directory_name(fit)).is_dir():
            return
        cameras = {
            camera: decoded_frames.CameraFrames(
                files=files[camera],
                file_of=np.load(target / "videos" / f"{camera}.file.npy"),
                time=np.load(target / "videos" / f"{camera}.time.npy"),
                size=sizes[camera],
            )
            for camera in files
        }
        decoded_frames.build(
            target,
            root,
            cameras,
            np.load(target / "episode_start.npy"),
            np.load(target / "episode_index.npy"),
            name,
            fit,
        )


def _write(
    directory: Path, meta: DatasetMeta, summary: DatasetSummary, columns: FrameColumns, name: str
) -> None:
    np.save(directory / "state.npy", columns.state)
    np.save(directory / "actions.npy", columns.actions)
    np.save(directory / "task_index.npy", columns.task_index)
    np.save(directory / "episode_index.npy", columns.episode_index)
    np.save(directory / "episode_start.npy", columns.episode_start)
    (directory / NORM_STATS).write_text(compute_norm_stats(columns.state, columns.actions).to_json())
    _copy_images(directory / "images", meta, list(meta.image_sizes), name)
    if meta.video_sizes:
        _write_video_times(directory, meta, columns)
    # Written last: its presence marks a complete index, should a rename ever be replaced by a copy.
    (directory / SUMMARY).write_text(json.dumps(summary.to_dict(), indent=2))


def _copy_images(directory: Path, meta: DatasetMeta, cameras: list[str], name: str) -> None:
    """Append every frame's encoded bytes, episode by episode, to one file per camera."""
    directory.mkdir()
    outputs = {camera: open(directory / f"{camera}.bin", "wb") for camera in cameras}  # noqa: SIM115
    offsets = {camera: [np.zeros(1, dtype=np.int64)] for camera in cameras}
    ends = dict.fromkeys(cameras, 0)
    try:
        for episode in meta.episodes:
            relative = meta.data_file(episode.index)
            if not cameras:
                break
            try:
                # Streamed page by page (no pre-buffering of whole column chunks): less memory.
                batches = episode_batches(
                    meta, episode.index, cameras, batch_size=COPY_BATCH_ROWS, buffer_size=STREAM_BUFFER
                )
                row = 0
                for batch in batches:
                    for camera in cameras:
                        encoded = image_bytes(batch.column(camera))
                        if encoded.null_count:
                            frame = row + int(np.argmax(np.asarray(encoded.is_null())))
                            raise DatasetError(
                                name, f"{relative}: frame {frame} of {camera} has no image bytes"
                            )
                        data, sizes = _buffer_and_sizes(encoded)
                        outputs[camera].write(data)
                        offsets[camera].append(ends[camera] + np.cumsum(sizes))
                        ends[camera] += int(sizes.sum())
                    row += batch.num_rows
            except (OSError, pa.ArrowException) as error:
                raise DatasetError(name, f"{relative} cannot be read: {error}") from None
    finally:
        for output in outputs.values():
            output.close()
    for camera in cameras:
        np.save(directory / f"{camera}.offsets.npy", np.concatenate(offsets[camera]))


def _write_video_times(directory: Path, meta: DatasetMeta, columns: FrameColumns) -> None:
    """Per video camera, each frame's mp4 (a position in videos.json) and its time in that file:
    the episode's start in the file plus the frame's timestamp, as lerobot queries it."""
    (directory / "videos").mkdir()
    listing: dict[str, list[str]] = {}
    assert columns.timestamp is not None
    for camera in meta.video_sizes:
        files: dict[str, int] = {}
        file_of = np.empty(len(columns.timestamp), dtype=np.int32)
        time = np.empty(len(columns.timestamp), dtype=np.float64)
        for position, episode in enumerate(columns.episode_index.tolist()):
            relative, start = meta.video_file(int(episode), camera)
            rows = slice(columns.episode_start[position], columns.episode_start[position + 1])
            file_of[rows] = files.setdefault(relative, len(files))
            time[rows] = start + columns.timestamp[rows]
        np.save(directory / "videos" / f"{camera}.file.npy", file_of)
        np.save(directory / "videos" / f"{camera}.time.npy", time)
        listing[camera] = list(files)
    (directory / VIDEOS).write_text(json.dumps(listing, indent=2))


def _buffer_and_sizes(encoded: pa.Array) -> tuple[memoryview, np.ndarray]:
    """The contiguous bytes of a (large_)binary array's values, and each value's length, without copies."""
    _, offsets_buffer, data_buffer = encoded.buffers()
    assert offsets_buffer is not None  # a binary array always has its offsets
    offset_type = np.int64 if pa.types.is_large_binary(encoded.type) else np.int32
    offsets = np.frombuffer(memoryview(offsets_buffer), dtype=offset_type)[
        encoded.offset : encoded.offset + len(encoded) + 1
    ]
    data = memoryview(data_buffer)[int(offsets[0]) : int(offsets[-1])] if data_buffer else memoryview(b"")
    return data, np.diff(offsets).astype(np.int64)


class _NpyFile:
    """Rows of a 1- or 2-D .npy file, read with os.pread from a lazily opened descriptor."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(file)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(file)
            self.data_offset = file.tell()
        self.shape: tuple[int, ...] = shape
        self.dtype = np.dtype(dtype)
        self.row_bytes = self.dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))


class FrameIndex:
    """Reads single frames of a built index. Picklable: file descriptors are opened per process."""

    def __init__(self, directory: Path, fit: ImageFit | None = None) -> None:
        self._descriptors: dict[Path, int] = {}
        self.directory = directory
        # Held while open (and by forked readers, which share it): pruning leaves an index in use alone.
        self._in_use = frame_cache.hold(directory)
        self.summary = DatasetSummary.from_dict(json.loads((directory / SUMMARY).read_text()))
        self.norm_stats = NormStats.from_json((directory / NORM_STATS).read_text())
        # Per-episode arrays are small (one entry per episode) and kept in memory.
        self.episode_index: np.ndarray = np.load(directory / "episode_index.npy")
        self.episode_start: np.ndarray = np.load(directory / "episode_start.npy")
        self._state = _NpyFile(directory / "state.npy")
        self._actions = _NpyFile(directory / "actions.npy")
        self._task_index = _NpyFile(directory / "task_index.npy")
        videos = directory / VIDEOS
        # Video camera -> its mp4 files, relative to the dataset's root.
        self.video_files: dict[str, list[str]] = json.loads(videos.read_text()) if videos.is_file() else {}
        self._offsets = {
            camera: _NpyFile(directory / "images" / f"{camera}.offsets.npy")
            for camera in self.summary.cameras
            if camera not in self.video_files
        }
        self._video_file = {c: _NpyFile(directory / "videos" / f"{c}.file.npy") for c in self.video_files}
        # Video camera -> its frames decoded into the index at `fit`'s size, where they were (else
        # decoded per sample, at their recorded size).
        self.decoded = decoded_frames.open_decoded(directory, fit)
        self._video_time = {c: _NpyFile(directory / "videos" / f"{c}.time.npy") for c in self.video_files}

    def __len__(self) -> int:
        return int(self.episode_start[-1])

    def state(self, frame: int) -> np.ndarray:
        return self._rows(self._state, frame, frame + 1)[0]

    def actions(self, start: int, stop: int) -> np.ndarray:
        return self._rows(self._actions, start, stop)

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """Every frame's state (frames, state_dim) and action (frames, action_dim), memory-mapped:
        what a mixture's statistics are computed over (relay_engine.datasets.mixture)."""
        return (
            np.load(self.directory / "state.npy", mmap_mode="r"),
            np.load(self.directory / "actions.npy", mmap_mode="r"),
        )

    def task_index(self, frame: int) -> int:
        return int(self._rows(self._task_index, frame, frame + 1)[0])

    def image(self, camera: str, frame: int) -> bytes:
        start, stop = self._rows(self._offsets[camera], frame, frame + 2)
        return self._pread(self.directory / "images" / f"{camera}.bin", int(stop - start), int(start))

    def video_frame(self, camera: str, frame: int) -> tuple[str, float]:
        """A video camera's frame: its mp4 (relative to the dataset's root) and its time in it."""
        file = int(self._rows(self._video_file[camera], frame, frame + 1)[0])
        return self.video_files[camera][file], float(
            self._rows(self._video_time[camera], frame, frame + 1)[0]
        )

    def _rows(self, array: _NpyFile, start: int, stop: int) -> np.ndarray:
        data = self._pread(
            array.path, (stop - start) * array.row_bytes, array.data_offset + start * array.row_bytes
        )
        return np.frombuffer(data, dtype=array.dtype).reshape((stop - start, *array.shape[1:]))

    def _pread(self, path: Path, size: int, offset: int) -> bytes:
        # pread has no shared file position, so descriptors inherited by forked workers are safe.
        descriptor = self._descriptors.get(path)
        if descriptor is None:
            descriptor = self._descriptors[path] = os.open(path, os.O_RDONLY)
        data = os.pread(descriptor, size, offset)
        if len(data) != size:
            raise DatasetError(
                self.summary.name, f"the frame index at {self.directory} is truncated ({path.name})"
            )
        return data

    def close(self) -> None:
        for descriptor in self._descriptors.values():
            os.close(descriptor)
        self._descriptors = {}
        for frames in getattr(self, "decoded", {}).values():
            frames.close()
        in_use = getattr(self, "_in_use", None)
        if in_use is not None:
            os.close(in_use)
            self._in_use = None

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_descriptors"] = {}
        state["_in_use"] = None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._in_use = frame_cache.hold(self.directory)  # an unpickled copy holds its own

    def __del__(self) -> None:
        self.close()
