"""`relay/Dot-v0`: the synthetic task of `relay datasets synth` as a Gymnasium environment.

The same scene, cameras and dynamics as the datasets (`relay_engine.envs.dot_world`), with a
policy acting instead of the expert:

- observation: `{"pixels": {camera: uint8 (H, W, 3)}, "agent_pos": float32 (state_dim,)}`, the
  cameras named as the dataset's features without `observation.images.` ("top", "wrist"), the
  state as the dataset's `observation.state`; gym-pusht's and gym-aloha's `pixels_agent_pos` layout.
- action: the gripper's step (dx, dy), each clipped to +-MAX_STEP (0.5); a dataset's first two
  action columns.
- reward 1 and `terminated` on the step the gripper's ring comes to lie wholly inside the target
  dot (`info["is_success"]`); episodes are cut at 50 steps (`max_episode_steps`) otherwise.
- `info["task"]`: the episode's prompt ("move to the red dot"), which the policy reads.

Options (keyword arguments of `gymnasium.make`) choose the variant, as `relay datasets synth`'s
do: `colours` (the tasks; a list, or a comma-separated string; or `num_tasks`, the first N of
red, blue, green, ...; default red), `cameras` (feature name ->
(height, width)), `distractors`, `state_dim`, `top_view`, `wrist_zoom`, `noise`, and `mix_seed`
(the synth `seed` of the dataset whose extra state columns to reproduce; it matters only for
`state_dim` > 2). `reset(options={"task_index": i})` picks the task; otherwise it is drawn.
`expert_action()` is the expert's next action, what the datasets record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from relay_engine.envs.dot_world import (
    COLOURS,
    DEFAULT_CAMERAS,
    MAX_STEP,
    WRIST_ZOOM,
    DotTask,
    DotWorld,
    camera_key,
)
from relay_engine.errors import ConfigError

Observation = dict[str, Any]


class DotEnv(gymnasium.Env[Observation, np.ndarray]):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}  # noqa: RUF012 (Gymnasium's layout)

    def __init__(
        self,
        *,
        colours: Sequence[str] | str | None = None,
        num_tasks: int = 1,
        cameras: Mapping[str, Sequence[int]] | None = None,
        distractors: int = 0,
        state_dim: int = 2,
        top_view: Sequence[float] = (0.0, 0.0, 1.0),
        wrist_zoom: float = WRIST_ZOOM,
        noise: int = 0,
        mix_seed: int = 0,
        render_mode: str | None = None,
    ) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ConfigError(f"render_mode must be 'rgb_array' or None, got {render_mode!r}")
        if isinstance(colours, str):
            colours = [colour.strip() for colour in colours.split(",") if colour.strip()]
        elif colours is None:  # as `relay datasets synth --tasks N`: the first N colours
            if not 1 <= num_tasks <= len(COLOURS):
                raise ConfigError(f"num_tasks must be 1 to {len(COLOURS)}, got {num_tasks}")
            colours = list(COLOURS)[:num_tasks]
        self.task = DotTask(
            colours=tuple(colours),
            cameras={
                name: (int(size[0]), int(size[1]))
                for name, size in (DEFAULT_CAMERAS if cameras is None else cameras).items()
            },
            distractors=int(distractors),
            state_dim=int(state_dim),
            top_view=(float(top_view[0]), float(top_view[1]), float(top_view[2])),
            wrist_zoom=float(wrist_zoom),
            noise=int(noise),
            mix_seed=int(mix_seed),
        )
        self.render_mode = render_mode
        self.observation_space = spaces.Dict(
            {
                "pixels": spaces.Dict(
                    {
                        camera_key(name): spaces.Box(0, 255, (height, width, 3), dtype=np.uint8)
                        for name, (height, width) in self.task.cameras.items()
                    }
                ),
                "agent_pos": spaces.Box(-1.0, 1.0, (self.task.state_dim,), dtype=np.float32),
            }
        )
        self.action_space = spaces.Box(-MAX_STEP, MAX_STEP, (2,), dtype=np.float32)
        self._world: DotWorld | None = None
        self._images: dict[str, np.ndarray] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        task_index = (options or {}).get("task_index")
        self._world = self.task.start(self.np_random, None if task_index is None else int(task_index))
        return self._observe(), self._info()

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        world = self._started()
        world.move(np.asarray(action, dtype=np.float64))
        observation, success = self._observe(), world.succeeded
        return observation, 1.0 if success else 0.0, success, False, self._info()

    def render(self) -> np.ndarray | None:
        """The first camera's view of the last observation."""
        if self.render_mode is None or not self._images:
            return None
        return next(iter(self._images.values()))

    def expert_action(self) -> np.ndarray:
        """The expert's action from here: what a dataset of this task records."""
        return self._started().expert_step()

    def _started(self) -> DotWorld:
        if self._world is None:
            raise gymnasium.error.ResetNeeded("call reset() before step()")
        return self._world

    def _observe(self) -> Observation:
        world = self._started()
        self._images = world.images()
        return {
            "pixels": {camera_key(name): image for name, image in self._images.items()},
            "agent_pos": world.state(),
        }

    def _info(self) -> dict[str, Any]:
        world = self._started()
        return {
            "task": world.prompt,
            "task_index": world.task_index,
            "is_success": world.succeeded,
            "distance": world.distance,
        }
