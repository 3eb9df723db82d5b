"""Video cameras decoded once, at a dataset's first open, into its frame index: then a training
sample reads each camera's frame with one `os.pread`, and no decoder runs during training.

Why: a random frame of an mp4 costs a seek, a decoder flush and the frames from the keyframe
before it (lerobot's default keyframe interval is 2, so two or three frames), about 3.5x the cost
of decoding the same frames in order. Training visits every frame once an epoch, in random
order, for many epochs. Decoding each file once, in order, with one decoder per file (files in
parallel threads: PyAV lets go of the GIL while FFmpeg decodes), pays the sequential rate once.

Frames are kept at the size the training model reads, where it is given (pi05's `ImageFit`,
relay_engine.image_fit): each decoded frame is resized with padding once, here, and the
collator's fit of a frame already at the model's size changes nothing, so a cached sample is the
same array as a sample decoded and fitted per frame. Opened without a fit (SmolVLA, whose policy
resizes in float on its device as lerobot's does; a bench, a tool), the frames are kept as
recorded.

The cost is disk: height x width x 3 bytes per frame and camera (pi05's 224x224: 147 KiB a frame,
12.6 GiB for 90,000 frame-cameras, where lerobot-record's 640x480 would be 77 GiB). So it is done
only while a dataset's frames at that size fit `RELAY_VIDEO_CACHE_MAX_BYTES` (default 32 GiB; 0
turns it off) and the disk keeps a margin free; a larger dataset is decoded per sample instead
(`relay_engine.datasets.video.VideoFrames`), and its index stays small. Memory: one decoded frame
per thread while building; reading goes through the page cache, not a process's RSS (pread, no
mmap, as the rest of the index).

Layout of `<index>/decoded-<fit>/` (`224x224-centre-aa`: pi05's; `decoded/` for recorded sizes),
one per size a dataset is trained at (complete once `complete.json` is there; built in a temporary
directory beside it and renamed into place under the index's build lock):
    <feature>.rgb    uint8 (frames, height, width, 3), in the dataset's frame order
    complete.json    each camera's cached (height, width) and recorded one, the fit, and how long
                     the decoding took
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relay_engine.datasets.video import TOLERANCE_S, VideoError, decode_in_order
from relay_engine.errors import DatasetError
from relay_engine.image_fit import ImageFit

DIRECTORY = "decoded"
COMPLETE = "complete.json"
LIMIT_VARIABLE = "RELAY_VIDEO_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 32 << 30
# Left free on the cache's disk after the decoded frames are written.
FREE_MARGIN_BYTES = 2 << 30


def directory_name(fit: ImageFit | None) -> str:
    """The index's directory of frames decoded at `fit`'s size (None: as recorded)."""
    return DIRECTORY if fit is None else f"{DIRECTORY}-{fit.key}"


def cached_sizes(sizes: dict[str, tuple[int, int]], fit: ImageFit | None) -> dict[str, tuple[int, int]]:
    """Each camera's (height, width) in the cache: `fit`'s, or as recorded (`sizes`) without one."""
    return dict(sizes) if fit is None else {camera: (fit.height, fit.width) for camera in sizes}


def limit_bytes() -> int:
    """RELAY_VIDEO_CACHE_MAX_BYTES (0: never decode into the cache), read at each call; default 32 GiB."""
    configured = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not configured:
        return DEFAULT_MAX_BYTES
    try:
        value = int(configured)
    except ValueError:
        raise ValueError(
            f"bad {LIMIT_VARIABLE}: {configured!r} (must be a whole number of bytes; 0: off)"
        ) from None
    if value < 0:
        raise ValueError(f"bad {LIMIT_VARIABLE}: {value} (must be 0 or more; 0: off)")
    return value


def decoded_size(frames: int, sizes: dict[str, tuple[int, int]]) -> int:
    """Bytes the decoded frames of these cameras ((height, width) each) take for `frames` frames."""
    return frames * sum(height * width * 3 for height, width in sizes.values())


def fits(directory: Path, frames: int, sizes: dict[str, tuple[int, int]]) -> bool:
    """Whether the decoded frames are within the limit and leave the disk its margin."""
    size = decoded_size(frames, sizes)
    limit = limit_bytes()
    if limit == 0 or size > limit:
        return False
    return size + FREE_MARGIN_BYTES <= shutil.disk_usage(directory).free


@dataclass(frozen=True)
class CameraFrames:
    """Where one video camera's frames are: each frame's file (a position in `files`) and time,
    and their recorded size."""

    files: list[str]
    file_of: np.ndarray  # int32 (frames,)
    time: np.ndarray  # float64 (frames,)
    size: tuple[int, int]


def build(
    index: Path,
    root: Path,
    cameras: dict[str, CameraFrames],
    episode_start: np.ndarray,
    episode_index: np.ndarray,
    name: str,
    fit: ImageFit | None = None,
) -> None:
    """Decode every frame of `cameras` into `index`/directory_name(fit), fitted to `fit`'s size (as
    recorded without one). The caller holds the index's build lock.

    Raises DatasetError naming the file, episode, frame and camera of a frame that is missing or
    off the tolerance, or a file that does not decode.
    """
    directory = directory_name(fit)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory}.", dir=index))
    started = time.perf_counter()
    try:
        frames = len(episode_start) and int(episode_start[-1])
        sizes = cached_sizes({camera: where.size for camera, where in cameras.items()}, fit)
        for camera, (height, width) in sizes.items():
            with open(staging / f"{camera}.rgb", "wb") as output:
                output.truncate(frames * height * width * 3)
        jobs = [
            (camera, where.files[file], rows)
            for camera, where in cameras.items()
            for file, rows in enumerate(_rows_by_file(where))
            if len(rows)
        ]
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), _cores()))) as pool:
            failures = [
                failure
                for failure in pool.map(
                    lambda job: _decode_file(staging, root, job[0], cameras[job[0]], job[1], job[2], fit),
                    jobs,
                )
                if failure is not None
            ]
        if failures:
            row, camera, relative, reason = failures[0]
            position = int(np.searchsorted(episode_start, row, side="right")) - 1
            raise DatasetError(
                name,
                f"episode {int(episode_index[position])}, frame {row - int(episode_start[position])}: "
                f"camera {camera}: {relative}: {reason}",
            )
        record = {
            "cameras": {camera: list(size) for camera, size in sizes.items()},
            "recorded": {camera: list(where.size) for camera, where in cameras.items()},
            "fit": None if fit is None else fit.key,
            "seconds": round(time.perf_counter() - started, 3),
        }
        (staging / COMPLETE).write_text(json.dumps(record, indent=2))
        staging.chmod(0o755)
        os.replace(staging, index / directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _rows_by_file(where: CameraFrames) -> list[np.ndarray]:
    """Per file (a position in `where.files`), the rows it holds, in time order: one sort."""
    order = np.lexsort((where.time, where.file_of))
    bounds = np.searchsorted(where.file_of[order], np.arange(len(where.files) + 1))
    return [order[bounds[i] : bounds[i + 1]] for i in range(len(where.files))]


def _decode_file(
    staging: Path,
    root: Path,
    camera: str,
    where: CameraFrames,
    relative: str,
    rows: np.ndarray,
    fit: ImageFit | None,
) -> tuple[int, str, str, str] | None:
    """Decode one mp4 in order, writing each frame the dataset asks of it (fitted to `fit`) to its
    rows (in time order). None when done, else (first failing row, camera, file, reason)."""
    wanted = where.time[rows]
    height, width = where.size
    frame_bytes = height * width * 3 if fit is None else fit.frame_bytes
    descriptor = os.open(staging / f"{camera}.rgb", os.O_WRONLY)
    next_row = 0
    try:
        for frame_time, image in decode_in_order(root / relative, float(wanted[0]) - TOLERANCE_S):
            # A wanted time earlier than this frame, by more than the tolerance, has no frame.
            if wanted[next_row] < frame_time - TOLERANCE_S:
                nearest = frame_time - float(wanted[next_row])
                return _failure(rows, next_row, camera, relative, wanted, nearest)
            cached: np.ndarray | None = None  # the frame fitted, once however many rows it fills
            while next_row < len(rows) and abs(wanted[next_row] - frame_time) <= TOLERANCE_S:
                if image.shape != (height, width, 3):
                    return (
                        int(rows[next_row]),
                        camera,
                        relative,
                        f"frames are {image.shape[0]}x{image.shape[1]}, not {height}x{width}",
                    )
                if cached is None:
                    cached = np.ascontiguousarray(image if fit is None else fit(image))
                os.pwrite(descriptor, cached.data, int(rows[next_row]) * frame_bytes)
                next_row += 1
            if next_row == len(rows):
                return None
        return _failure(rows, next_row, camera, relative, wanted, None)
    except VideoError as error:
        return int(rows[next_row]), camera, relative, str(error)
    finally:
        os.close(descriptor)


def _failure(
    rows: np.ndarray, at: int, camera: str, relative: str, wanted: np.ndarray, gap: float | None
) -> tuple[int, str, str, str]:
    found = "the video ends before it" if gap is None else f"the nearest frame is {gap:.6g} s away"
    return (
        int(rows[at]),
        camera,
        relative,
        f"no frame at {float(wanted[at]):.6g} s within {TOLERANCE_S:g} s ({found})",
    )


class DecodedFrames:
    """Reads one camera's decoded frames with os.pread. Picklable: the descriptor opens per process."""

    def __init__(self, path: Path, size: tuple[int, int]) -> None:
        self.path = path
        self.shape = (size[0], size[1], 3)
        self.frame_bytes = size[0] * size[1] * 3
        self._descriptor: int | None = None
        self._pid = os.getpid()

    def frame(self, frame: int) -> np.ndarray:
        if self._descriptor is None or self._pid != os.getpid():
            self._descriptor, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        image = np.empty(self.shape, dtype=np.uint8)  # read into it: one copy, and the caller may write
        if os.preadv(self._descriptor, [image.data], frame * self.frame_bytes) != self.frame_bytes:
            raise VideoError(f"the decoded frames at {self.path} are truncated")
        return image

    def close(self) -> None:
        if self._descriptor is not None and self._pid == os.getpid():
            os.close(self._descriptor)
        self._descriptor = None

    def __getstate__(self) -> dict[str, object]:
        return {"path": self.path, "shape": self.shape, "frame_bytes": self.frame_bytes}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._descriptor = None
        self._pid = os.getpid()


def open_decoded(index: Path, fit: ImageFit | None = None) -> dict[str, DecodedFrames]:
    """The cameras of a built index decoded at `fit`'s size (as recorded without one); none if it
    has no complete directory of them."""
    directory = index / directory_name(fit)
    complete = directory / COMPLETE
    if not complete.is_file():
        return {}
    cameras = json.loads(complete.read_text())["cameras"]
    return {
        camera: DecodedFrames(directory / f"{camera}.rgb", (int(size[0]), int(size[1])))
        for camera, size in cameras.items()
    }
