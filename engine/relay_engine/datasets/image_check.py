"""Decode every image of a dataset, as training will, and name each one that cannot be read.

A video camera's frames are decoded from its mp4 over the episode's span, and each frame the
episode asks for must be there within lerobot's tolerance (1e-4 s).

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
from relay_engine.datasets.video import TOLERANCE_S, VideoError, decoded_times

# Problems named one by one before the rest are only counted.
NAMED_MAX = 50


@dataclass(frozen=True)
class BadImage:
    episode: int
    frame: int
    camera: str
    why: str

    def __str__(self) -> str:
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
    """One line per bad image, the first NAMED_MAX of them, then how many more."""
    lines = [f"{item} (the frame cannot be trained on)" for item in bad[:NAMED_MAX]]
    if len(bad) > NAMED_MAX:
        lines.append(f"... and {len(bad) - NAMED_MAX} more unreadable images")
    return lines


def _check_videos(meta: DatasetMeta, episode: int) -> list[BadImage]:
    bad: list[BadImage] = []
    length = next(e.length for e in meta.episodes if e.index == episode)
    for camera in meta.video_sizes:
        relative, start = meta.video_file(episode, camera)
        wanted = start + np.arange(length) / meta.fps
        try:
            times = decoded_times(meta.root / relative, float(wanted[0]), float(wanted[-1]))
        except VideoError as error:
            bad.append(BadImage(episode, 0, camera, f"{relative}: {error}"))
            continue
        for frame, time in enumerate(wanted):
            gap = float(np.min(np.abs(times - time))) if len(times) else float("inf")
            if gap > TOLERANCE_S:
                bad.append(
                    BadImage(
                        episode,
                        frame,
                        camera,
                        f"{relative} has no frame at {time:.6g} s (nearest {gap:.3g} s away)",
                    )
                )
    return bad


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
