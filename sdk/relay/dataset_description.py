"""What a LeRobot dataset holds, read from its meta files alone: one shape for the engine that builds
it (`relay_engine.datasets.describe_dataset`), `relay datasets inspect` that prints it, the API's
`GET /v1/datasets/{name}` that answers with it and the console that offers its cameras. Pure
pydantic: every package may import it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class DatasetCamera(BaseModel):
    """One camera of the dataset: an image feature (PNG bytes in the data files) or a video one
    (mp4 files), its size, and for a video camera the codec, pixel format and rate that
    meta/info.json states (null where it states none)."""

    model_config = ConfigDict(extra="forbid")

    feature: str = Field(description="The dataset's feature name, such as observation.images.top.")
    stored: Literal["image", "video"]
    height: int
    width: int
    codec: str | None = None
    pix_fmt: str | None = None
    fps: float | None = None

    def size(self) -> str:
        return f"{self.height} x {self.width}"

    def video(self) -> str:
        """`h264, yuv420p, 10 fps` for a video camera; empty for an image one."""
        if self.stored != "video":
            return ""
        parts = [self.codec or "codec not stated", self.pix_fmt or "pix_fmt not stated"]
        parts.append(f"{self.fps:g} fps" if self.fps is not None else "fps not stated")
        return ", ".join(parts)


class DatasetTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_index: int
    task: str


class DatasetDescription(BaseModel):
    """A dataset as a job would read it, from meta/info.json, the episode table and the tasks: no
    data file is read and no frame decoded. A Hub dataset's `repo`, the `revision` read and its
    commit `sha`; a local one's `path`. `camera_map` is the mapping a job uses when it names no
    `cameras`: model camera -> the dataset's camera features, in meta/info.json's order."""

    model_config = ConfigDict(extra="forbid")

    object: Literal["dataset"] = "dataset"
    name: str
    format: str = Field(description="The LeRobot format (meta/info.json's codebase_version): v2.1 or v3.0.")
    repo: str | None = None
    revision: str | None = None
    sha: str | None = None
    path: str | None = None
    robot_type: str
    fps: float
    episodes: int
    frames: int
    state_dim: int
    action_dim: int
    cameras: list[DatasetCamera]
    camera_map: dict[str, str]
    tasks: list[DatasetTask]

    def read(self) -> str:
        """Where it was read: `lerobot/pusht at v2.1 (commit 1a2b3c4d)`, or the directory."""
        if self.repo:
            return f"{self.repo} at {self.revision} (commit {(self.sha or '?')[:8]})"
        return str(self.path)

    def line(self) -> str:
        """One line: `LeRobot v3.0, 5 episodes, 52 frames, 10 fps, video h264` (the console's too)."""
        codecs = sorted({camera.codec or "?" for camera in self.cameras if camera.stored == "video"})
        stored = f"video {', '.join(codecs)}" if codecs else "images"
        return (
            f"LeRobot {self.format}, {self.episodes:,} episodes, {self.frames:,} frames, "
            f"{self.fps:g} fps, {stored}"
        )
