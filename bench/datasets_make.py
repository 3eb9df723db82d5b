"""Datasets for bench_datasets.py, written with Relay's v2.1 writer.

- `write_image_dataset`: camera-like frames (a smooth background, a moving block, pixel noise)
  as PNGs at 224x224, every frame unique, encoded in worker processes, until the parquet files
  reach a size or a frame count. PNG level 1 by default (about 80 KB a frame; level 6 on noisy
  frames is about 5x slower to write and decodes no faster); the memory benchmark uses level 0
  (stored, about 150 KB a frame), which writes gigabytes about 3x faster.
- `write_numeric_dataset`: many frames of 14-wide state and action with a tiny constant image,
  for the statistics benchmark, which reads only the numeric columns.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np

from relay_engine.datasets.writer import DatasetWriter, Episode, encode_png

CAMERAS = ("observation.images.top", "observation.images.wrist")


def _episode(args: tuple[int, int, tuple[int, int], int, int]) -> Episode:
    seed, length, (height, width), width_dims, png_level = args
    rng = np.random.default_rng(seed)
    state = np.cumsum(rng.normal(0, 0.05, size=(length, width_dims)), axis=0).astype(np.float32)
    actions = np.diff(state, axis=0, append=state[-1:]).astype(np.float32)
    rows = np.linspace(0, 1, height)[:, None, None]
    background = (rng.uniform(60, 190, size=3) + 40 * rows * rng.uniform(-1, 1, size=3)).astype(np.int16)
    images: dict[str, list[bytes]] = {camera: [] for camera in CAMERAS}
    for t in range(length):
        for c, camera in enumerate(CAMERAS):
            frame = np.broadcast_to(background, (height, width, 3)).copy()
            top = (t * 3 + c * 40) % (height - 40)
            frame[top : top + 40, 50 + 30 * c : 110 + 30 * c] = (220, 60, 40)
            frame += rng.integers(-3, 4, size=frame.shape, dtype=np.int16)
            images[camera].append(
                encode_png(np.clip(frame, 0, 255).astype(np.uint8), compress_level=png_level)
            )
    return Episode(task_index=0, state=state, actions=actions, images=images)


def write_image_dataset(
    out: Path,
    *,
    target_bytes: int | None = None,
    frames: int | None = None,
    episode_length: int = 200,
    size: tuple[int, int] = (224, 224),
    png_level: int = 1,
    workers: int = 2,
) -> Path:
    """2 cameras of `size`, 14-wide state and action; episodes are added until the parquet files
    reach `target_bytes` or the dataset has `frames` frames."""
    writer = DatasetWriter(
        out,
        fps=30,
        cameras=dict.fromkeys(CAMERAS, size),
        state_dim=14,
        action_dim=14,
        tasks=["bench"],
        overwrite=True,
    )
    written, count, seed = 0, 0, 0

    def done() -> bool:
        return (target_bytes is not None and written >= target_bytes) or (
            frames is not None and count >= frames
        )

    with multiprocessing.get_context("fork").Pool(workers) as pool:
        while not done():
            batch = [(seed + i, episode_length, size, 14, png_level) for i in range(workers * 2)]
            seed += len(batch)
            for episode in pool.imap(_episode, batch):
                if not done():
                    written += writer.add_episode(episode).stat().st_size
                    count += len(episode.state)
    return writer.finish()


def write_numeric_dataset(out: Path, *, frames: int, episode_length: int = 500, width: int = 14) -> Path:
    png = encode_png(np.zeros((8, 8, 3), dtype=np.uint8))
    writer = DatasetWriter(
        out, fps=30, cameras={"observation.images.top": (8, 8)}, state_dim=width, action_dim=width,
        tasks=["bench"], overwrite=True,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    for start in range(0, frames, episode_length):
        length = min(episode_length, frames - start)
        writer.add_episode(
            Episode(
                task_index=0,
                state=rng.normal(size=(length, width)).astype(np.float32),
                actions=rng.standard_t(4, size=(length, width)).astype(np.float32),
                images={"observation.images.top": [png] * length},
            )
        )
    return writer.finish()
