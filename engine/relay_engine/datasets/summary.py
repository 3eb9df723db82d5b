"""What a dataset holds, as `relay datasets check` prints it and the frame index stores it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class DatasetSummary:
    name: str
    episodes: int
    frames: int
    fps: float
    # Image feature -> (height, width) of its frames, in info.json's order.
    cameras: dict[str, tuple[int, int]]
    state_dim: int
    action_dim: int
    # task_index -> task (the prompt).
    tasks: dict[int, str]
    robot_type: str = "unknown"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cameras"] = {camera: list(size) for camera, size in self.cameras.items()}
        data["tasks"] = {str(index): task for index, task in self.tasks.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DatasetSummary:
        return cls(
            name=data["name"],
            episodes=data["episodes"],
            frames=data["frames"],
            fps=data["fps"],
            cameras={camera: (int(size[0]), int(size[1])) for camera, size in data["cameras"].items()},
            state_dim=data["state_dim"],
            action_dim=data["action_dim"],
            tasks={int(index): task for index, task in data["tasks"].items()},
            robot_type=data.get("robot_type", "unknown"),
        )
