"""Decode every image of a dataset, as training will, and name each one that cannot be read.

A video camera's frames are decoded from its mp4 over the episode's span, and each frame the
episode asks for must be there within lerobot's tolerance (1e-4 s). An episode whose span holds
fewer decodable frames than its rows, or runs past the video's last frame, or asks for frames off
the video's frame grid, is also reported once as a whole, naming the file, episode and camera.

`relay datasets check` runs this by default: a dataset with one truncated PNG in the middle of an
episode passed the checks of the columns and failed training at that frame, after the GPU was
paid for. Episode files are decoded in threads (Pillow's decoders and pyarrow's reads release the
GIL for most of their work); `progress` is called once per episode file done.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from PIL import Image

from relay_engine.datasets.meta import DatasetMeta
from relay_engine.datasets.validation import episode_batches, image_bytes
from relay_engine.datasets.video import TOLERANCE_S, DecodedSpan, VideoError, decoded_span

# Problems named one by one before the rest are only counted.
NAMED_MAX = 50


@dataclass(frozen=True)
class BadImage:
    """A frame that cannot be read, or (`frame` None) a video camera's span of a whole episode."""

    episode: int
    frame: int | None
    camera: str
    why: str

    def __str__(self) -> str:
        if self.frame is None:
            return f"episode {self.episode}, camera {self.camera}: {self.why}"
        return f"episode {self.episode}, frame {self.frame}, camera {self.camera}: {self.why}"


def decode_every_image(
    meta: DatasetMeta, progress: Callable[[int], None] | None = None, workers: int | None = None
) -> list[BadImage]:
    """Every frame's image, of every camera, that does not decode whole."""

    def episode_done(index: int) -> list[BadImage]:
        found = _check_episode(meta, index)
        if progress is not None:
            progress(1)
        return found

    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        per_episode = list(pool.map(episode_done, [episode.index for episode in meta.episodes]))
    return [bad for found in per_episode for bad in found]


def describe(bad: list[BadImage]) -> list[str]:
    """One line per bad episode span, then per bad image, the first NAMED_MAX of them, then how
    many more."""
    spans = [item for item in bad if item.frame is None]
    frames = [item for item in bad if item.frame is not None]
    lines = [f"{item} (its frames without a video frame cannot be trained on)" for item in spans]
    lines += [f"{item} (the frame cannot be trained on)" for item in frames[:NAMED_MAX]]
    if len(frames) > NAMED_MAX:
        lines.append(f"... and {len(frames) - NAMED_MAX} more unreadable images")
    return lines


def _check_videos(meta: DatasetMeta, episode: int) -> list[BadImage]:
    bad: list[BadImage] = []
    length = next(e.length for e in meta.episodes if e.index == episode)
    for camera in meta.video_sizes:
        relative, start = meta.video_file(episode, camera)
        wanted = start + np.arange(length) / meta.fps
        try:
            span = decoded_span(meta.root / relative, float(wanted[0]), float(wanted[-1]))
        except VideoError as error:
            bad.append(BadImage(episode, 0, camera, f"{relative}: {error}"))
            continue
        times = span.times
        gaps = np.array([np.min(np.abs(times - time)) if len(times) else np.inf for time in wanted])
        missing = gaps > TOLERANCE_S
        if not missing.any():
            continue
        # Frames past the video's last frame are named once, in the episode's line; the others
        # (off the frame grid, or in a gap of the video) one by one.
        past_end = (
            wanted > (span.last if span.last is not None else -np.inf) + TOLERANCE_S
            if span.ends_early
            else np.zeros(length, dtype=bool)
        )
        for frame in np.flatnonzero(missing & ~past_end):
            bad.append(
                BadImage(
                    episode,
                    int(frame),
                    camera,
                    f"{relative} has no frame at {wanted[frame]:.6g} s (nearest {gaps[frame]:.3g} s away)",
                )
            )
        bad.append(
            BadImage(episode, None, camera, _span_problem(relative, wanted, times, span, missing, past_end))
        )
    return bad


def _span_problem(
    relative: str,
    wanted: np.ndarray,
    times: np.ndarray,
    span: DecodedSpan,
    missing: np.ndarray,
    past_end: np.ndarray,
) -> str:
    """What is wrong with an episode's span of a video file, in one line."""
    parts = [
        f"{relative} holds {len(times)} decodable frames from {wanted[0]:.6g} s to {wanted[-1]:.6g} s, "
        f"where the episode has {len(wanted)} rows"
    ]
    if past_end.any():
        first, last = int(np.argmax(past_end)), len(wanted) - 1
        ends = (
            f"ends at {span.last:.6g} s"
            if span.last is not None
            else f"has no frame from {wanted[0]:.6g} s on"
        )
        frames = f"frame {first}" if first == last else f"frames {first} to {last}"
        parts.append(f"the video {ends}, before the episode's {frames} (at {wanted[first]:.6g} s)")
    off = missing & ~past_end
    if off.any():
        count = int(off.sum())
        parts.append(
            f"{count} of its frames {'has' if count == 1 else 'have'} no video frame within "
            f"{TOLERANCE_S:g} s of {'its' if count == 1 else 'their'} time"
        )
    return "; ".join(parts)


def _check_episode(meta: DatasetMeta, episode: int) -> list[BadImage]:
    bad_videos = _check_videos(meta, episode) if meta.video_sizes and meta.video_path else []
    return bad_videos + _check_image_episode(meta, episode)


def _check_image_episode(meta: DatasetMeta, episode: int) -> list[BadImage]:
    cameras = list(meta.image_sizes)
    if not cameras:
        return []
    try:
        batches = episode_batches(meta, episode, [*cameras, "frame_index"], batch_size=64)
        bad: list[BadImage] = []
        for batch in batches:
            frames = batch.column("frame_index").to_numpy()
            for camera in cameras:
                encoded = image_bytes(batch.column(camera))
                for frame, data in zip(frames, encoded.to_pylist(), strict=True):
                    why = _unreadable(data)
                    if why is not None:
                        bad.append(BadImage(episode, int(frame), camera, why))
        return bad
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return []  # an unreadable file is reported by the column checks, by file name


def _unreadable(data: bytes | None) -> str | None:
    if data is None:
        return "no image bytes"
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()  # decodes every pixel: a truncated PNG fails here, not at open
    except Exception as error:  # Pillow raises many kinds for broken data; each is a bad frame
        return f"not a readable image ({type(error).__name__}: {error})"
    return None
