"""Describe a dataset from its meta files alone: `describe_dataset(name) -> DatasetDescription`.

What `relay datasets inspect` prints and `GET /v1/datasets/{name}` answers: the cameras (image or
video, the size, and a video camera's codec, pixel format and rate as meta/info.json states them),
the state and action widths, fps, episodes, frames, tasks, the format, what was read, and the
camera map a job would use. It reads meta/info.json, the episode table and the tasks, nothing else:
no data file is opened and no frame decoded, and of a Hub repo only `meta/` is fetched.

The API never imports the engine: it asks `relay_engine.datasets.describe_server`, a process of its
own, which calls this.
"""

from __future__ import annotations

import os

from relay.dataset_description import DatasetCamera, DatasetDescription, DatasetTask
from relay_engine.datasets.dataset import map_cameras
from relay_engine.datasets.hub import DatasetSource, locate_dataset
from relay_engine.datasets.meta import DatasetMeta, read_meta
from relay_engine.datasets.problems import Problems
from relay_engine.datasets.summary import DatasetSummary


def describe_dataset(
    name_or_path: str,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
) -> DatasetDescription:
    """The dataset as a job would read it (the Hub revision chosen as `open_dataset` chooses it),
    from its meta files. Raises DatasetError (its `reason` says which kind) for a dataset that
    cannot be found or fetched, or that Relay refuses: every problem the meta files show."""
    source = locate_dataset(name_or_path, revision=revision, cache_dir=cache_dir, token=token, meta_only=True)
    problems = Problems(name_or_path)
    meta = read_meta(source.root, problems)
    problems.raise_if_any()
    assert meta is not None  # read_meta records why when it gives None
    return describe_meta(name_or_path, source, meta)


def describe_meta(name: str, source: DatasetSource, meta: DatasetMeta) -> DatasetDescription:
    """The description of meta files already read."""
    sizes = meta.camera_sizes
    summary = DatasetSummary(
        name=name,
        episodes=len(meta.episodes),
        frames=sum(episode.length for episode in meta.episodes),
        fps=meta.fps,
        cameras=sizes,
        state_dim=meta.state_dim,
        action_dim=meta.action_dim,
        tasks=dict(sorted(meta.tasks.items())),
        robot_type=meta.robot_type,
    )
    return DatasetDescription(
        name=name,
        format=meta.version,
        repo=source.repo,
        revision=source.revision,
        sha=source.sha,
        path=source.path,
        robot_type=meta.robot_type,
        fps=meta.fps,
        episodes=summary.episodes,
        frames=summary.frames,
        state_dim=meta.state_dim,
        action_dim=meta.action_dim,
        cameras=[_camera(meta, feature, size) for feature, size in sizes.items()],
        camera_map=map_cameras(name, summary, None),
        tasks=[DatasetTask(task_index=index, task=task) for index, task in summary.tasks.items()],
    )


def _camera(meta: DatasetMeta, feature: str, size: tuple[int, int]) -> DatasetCamera:
    height, width = size
    if feature not in meta.video_sizes:
        return DatasetCamera(feature=feature, stored="image", height=height, width=width)
    info = meta.features[feature].get("info")
    info = info if isinstance(info, dict) else {}
    codec, pix_fmt, fps = info.get("video.codec"), info.get("video.pix_fmt"), info.get("video.fps")
    return DatasetCamera(
        feature=feature,
        stored="video",
        height=height,
        width=width,
        codec=codec if isinstance(codec, str) else None,
        pix_fmt=pix_fmt if isinstance(pix_fmt, str) else None,
        fps=float(fps) if isinstance(fps, int | float) and not isinstance(fps, bool) else None,
    )
