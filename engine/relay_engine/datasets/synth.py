"""A synthetic LeRobot dataset (v2.1 or v3.0, images or video) whose correct actions can only be
learned by looking: the expert of `relay_engine.envs.dot_world`'s task, recorded.

The task, its cameras and its dynamics are `dot_world`'s, shared with the Gymnasium environment
`relay/Dot-v0`: episode i of a dataset written with `seed` is the environment's episode reset with
`episode_seed(seed, i)` (and task i modulo the number of tasks), the expert acting, frame for
frame. So a model's offline error on these datasets and its success rate in the environment
describe the same task.

- variants: which colours are the tasks (`colours`), `distractors` (extra dots of colours no task
  names), camera placement (`top_view`, `wrist_zoom`) and the widths make a family of related
  tasks; the pi05-tiny base is pretrained on many of them (scripts/pretrain_tiny.py), and the
  demo fine-tunes it on one it never saw. A dataset's `seed` also fixes its extra state and
  action columns (`DotTask.mix_seed`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from relay_engine.datasets.video import ENCODERS, VideoSettings, encoder_available
from relay_engine.datasets.writer import FORMATS, DatasetWriter, Episode
from relay_engine.envs.dot_world import COLOURS, DEFAULT_CAMERAS, WRIST_ZOOM, DotTask, episode_seed
from relay_engine.errors import ConfigError


def write_synthetic_dataset(
    out_dir: str | os.PathLike[str],
    *,
    episodes: int = 40,
    episode_length: int | tuple[int, int] = (30, 60),
    cameras: Mapping[str, tuple[int, int]] | None = None,
    state_dim: int = 2,
    action_dim: int = 2,
    num_tasks: int = 1,
    fps: int = 10,
    seed: int = 0,
    noise: int = 0,
    overwrite: bool = False,
    colours: Sequence[str] | None = None,
    distractors: int = 0,
    top_view: tuple[float, float, float] = (0.0, 0.0, 1.0),
    wrist_zoom: float = WRIST_ZOOM,
    format: str = "v2.1",
    video: bool | VideoSettings = False,
    video_codec: str = "h264",
    episodes_per_file: int = 1000,
) -> Path:
    """Write the dataset into `out_dir` (which must be empty or absent, unless `overwrite`); returns it.

    `episode_length` is a fixed length or an inclusive range (low, high) drawn per episode;
    `cameras` maps feature names (`observation.images.<name>`) to (height, width). `noise` adds
    uniform pixel noise of that amplitude, which makes the PNGs as large and as slow to decode as
    camera frames (the benchmarks use it; the default keeps the dataset small and quick to write).
    `colours` names the tasks' colours (default: the first `num_tasks` of COLOURS); `distractors`
    adds that many dots of other colours; `top_view` is the first camera's (centre x, centre y,
    zoom) and `wrist_zoom` the other cameras' zoom. `format` is "v2.1" or "v3.0"; `video` stores the
    cameras as mp4 (True: `video_codec`, h264 or av1, yuv420p; or the given VideoSettings);
    `episodes_per_file` is v3.0's episodes per data and video file.
    """
    cameras = dict(DEFAULT_CAMERAS if cameras is None else cameras)
    low, high = (episode_length, episode_length) if isinstance(episode_length, int) else episode_length
    colours = list(COLOURS)[:num_tasks] if colours is None else list(colours)
    _check_options(episodes, low, high, len(colours), fps)
    task = DotTask(
        colours=tuple(colours),
        cameras=cameras,
        distractors=distractors,
        state_dim=state_dim,
        action_dim=action_dim,
        top_view=top_view,
        wrist_zoom=wrist_zoom,
        noise=noise,
        mix_seed=seed,
    )
    settings = _video_settings(format, video, video_codec)
    lengths = np.random.default_rng(seed)
    writer = DatasetWriter(
        out_dir,
        fps=fps,
        cameras=cameras,
        state_dim=state_dim,
        action_dim=action_dim,
        tasks=task.prompts,
        robot_type="relay-synthetic",
        overwrite=overwrite,
        format=format,
        video=settings,
        episodes_per_file=episodes_per_file,
    )
    try:
        for episode_index in range(episodes):
            length = int(lengths.integers(low, high + 1))
            writer.add_episode(expert_episode(task, seed, episode_index, length))
        return writer.finish()
    except BaseException:
        writer.abort()
        raise


def expert_episode(task: DotTask, dataset_seed: int, episode_index: int, length: int) -> Episode:
    """Episode `episode_index` of a dataset written with `dataset_seed`: `length` frames of the
    expert, each frame's cameras and state before its action (the tasks take turns)."""
    rng = np.random.default_rng(episode_seed(dataset_seed, episode_index))
    world = task.start(rng, episode_index % len(task.colours))
    states, actions = [], []
    images: dict[str, list[np.ndarray]] = {camera: [] for camera in task.cameras}
    for _ in range(length):
        for camera, image in world.images().items():
            images[camera].append(image)
        step = world.expert_step()
        states.append(world.state())
        actions.append(task.action_columns(step))
        world.move(step)
    return Episode(
        task_index=world.task_index, state=np.array(states), actions=np.array(actions), images=images
    )


def _video_settings(format: str, video: bool | VideoSettings, codec: str) -> VideoSettings | None:
    if format not in FORMATS:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if isinstance(video, VideoSettings):
        settings = video
    elif not video:
        return None
    elif codec not in ENCODERS:
        raise ConfigError(f"video codec must be one of {', '.join(ENCODERS)}, got {codec!r}")
    else:
        settings = VideoSettings(
            codec=codec, options=(("crf", "30"), ("preset", "12")) if codec == "av1" else (("crf", "23"),)
        )
    if not encoder_available(settings.encoder):
        raise ConfigError(
            f"this PyAV's FFmpeg has no {settings.encoder} encoder (for {settings.codec} video)"
        )
    return settings


def _check_options(episodes: int, low: int, high: int, num_tasks: int, fps: int) -> None:
    """The dataset's own options; the task's (cameras, widths, colours, views, noise) DotTask checks."""
    if episodes < 1:
        raise ConfigError(f"episodes must be at least 1, got {episodes}")
    if not 1 <= low <= high:
        raise ConfigError(
            f"episode_length must be at least 1 (a range must be low <= high), got {low}-{high}"
        )
    if not 1 <= num_tasks <= len(COLOURS):
        raise ConfigError(f"num_tasks must be 1 to {len(COLOURS)}, got {num_tasks}")
    if fps < 1:
        raise ConfigError(f"fps must be at least 1, got {fps}")
