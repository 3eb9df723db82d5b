"""The synthetic look-and-move task: its scene, rendering, dynamics and expert, in one place.

Two things run it: the dataset writer (`relay_engine.datasets.synth`), which rolls the expert out
and records every frame, and the Gymnasium environment `relay/Dot-v0` (`relay_engine.envs.dot`),
where a policy acts instead. Both step a `DotWorld`, so what a dataset shows is what the
environment does.

The task: a gripper (a white ring) moves on a plane towards a coloured target dot. Each episode
places one dot per task colour at random (plus `distractors`, dots of colours no task names); the
episode's task ("move to the red dot") says which one is the target. Neither the target nor its
colour is in the state, so a policy has to find the dot in the image (and read the prompt when
there are several tasks).

- state: the gripper's position (x, y) in [-1, 1]; wider states add fixed smooth functions of it.
- action: the step the gripper takes; the expert's is `GAIN * (target - position)`. Wider actions
  (a dataset's `action_dim` > 2) add fixed linear mixes of the step, so every action column needs
  the target too; the environment takes the step, the first two columns.
- cameras: the first camera sees the plane from `top_view` (centre and zoom; by default the whole
  plane); the others are "wrist" views centred on the gripper at `wrist_zoom`. The dot's radius is
  a fifth of the plane's width (0.4 in [-1, 1]), so it spans several patches once a policy
  resizes the image to a few dozen pixels.
- success: the gripper's ring lies wholly inside the target dot (its centre within
  `SUCCESS_DISTANCE` of the dot's). Episodes start with the gripper outside the target dot.

Randomness: an episode's draws (task, dots, start, background, pixel noise) come from one
generator, in a fixed order, so an episode is a function of its seed; the extra state and action
columns' mixes come from `DotTask.mix_seed`, fixed for a whole dataset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from relay_engine.errors import ConfigError

if TYPE_CHECKING:
    from relay_engine.datasets.norm_stats import NormStats

DEFAULT_CAMERAS: dict[str, tuple[int, int]] = {
    "observation.images.top": (64, 64),
    "observation.images.wrist": (64, 64),
}
# A dataset's image features are named observation.images.<camera>; the environment's
# observation names each camera by its <camera> part, as gym-pusht and gym-aloha do.
CAMERA_PREFIX = "observation.images."
# Fraction of the remaining offset covered per frame: about 95% of the way in 20 frames.
GAIN = 0.15
DOT_RADIUS = 0.4  # in plane units, the plane being [-1, 1]^2
RING_RADIUS = 0.16
# Success: the gripper's ring lies wholly inside the target dot.
SUCCESS_DISTANCE = DOT_RADIUS - RING_RADIUS
# The largest step the gripper takes per frame along each axis (the expert's is at most about 0.33).
MAX_STEP = 0.5
WRIST_ZOOM = 2.0

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "blue": (40, 80, 235),
    "green": (40, 190, 60),
    "yellow": (235, 215, 40),
    "magenta": (220, 50, 210),
    "cyan": (40, 215, 225),
    "orange": (245, 140, 20),
    "black": (15, 15, 15),
}


def camera_key(feature: str) -> str:
    """The environment's name of a camera whose dataset feature is `feature`."""
    return feature.removeprefix(CAMERA_PREFIX)


def task_prompt(colour: str) -> str:
    return f"move to the {colour} dot"


def episode_seed(dataset_seed: int, episode_index: int) -> int:
    """The seed of episode `episode_index` of a dataset written with `dataset_seed`: reset
    `relay/Dot-v0` with it (and `options={"task_index": episode_index % len(colours)}`) to replay
    that episode. Derived by hashing both numbers, so two datasets' episodes never coincide, nor
    do they with an evaluation's small seeds (0, 1, 2, ...)."""
    return int(np.random.SeedSequence([dataset_seed, episode_index]).generate_state(1)[0])


@dataclass(frozen=True)
class DotTask:
    """One variant of the task: what every episode shares. The defaults are `relay datasets synth`'s."""

    colours: tuple[str, ...] = ("red",)
    cameras: Mapping[str, tuple[int, int]] = field(default_factory=lambda: dict(DEFAULT_CAMERAS))
    distractors: int = 0
    state_dim: int = 2
    action_dim: int = 2
    top_view: tuple[float, float, float] = (0.0, 0.0, 1.0)
    wrist_zoom: float = WRIST_ZOOM
    noise: int = 0
    mix_seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "colours", tuple(self.colours))
        object.__setattr__(self, "cameras", {name: tuple(size) for name, size in self.cameras.items()})
        object.__setattr__(self, "top_view", tuple(float(v) for v in self.top_view))
        self._check()

    @property
    def prompts(self) -> list[str]:
        """The tasks' texts, task i's the i-th."""
        return [task_prompt(colour) for colour in self.colours]

    @cached_property
    def mixes(self) -> tuple[np.ndarray, np.ndarray]:
        """The extra state columns' (state_dim - 2, 2) and action columns' (action_dim - 2, 2)
        weights: fixed per `mix_seed`, so they are the same functions in every episode."""
        rng = np.random.default_rng(self.mix_seed)
        return rng.normal(size=(self.state_dim - 2, 2)), rng.normal(size=(self.action_dim - 2, 2)) * 0.5

    def state(self, position: np.ndarray) -> np.ndarray:
        """The state (state_dim,) float32 of a gripper at `position`."""
        state_mix, _ = self.mixes
        return np.concatenate([position, np.tanh(state_mix @ position)]).astype(np.float32)

    def action_columns(self, step: np.ndarray) -> np.ndarray:
        """The dataset's action (action_dim,) float32 of a gripper step (its first two columns)."""
        _, action_mix = self.mixes
        return np.concatenate([step, action_mix @ step]).astype(np.float32)

    def start(self, rng: np.random.Generator, task_index: int | None = None) -> DotWorld:
        """A new episode drawn from `rng`: its task (`task_index`, or drawn), dots, start and
        background. The task is drawn even when given, so an episode's other draws do not depend
        on whether it was."""
        drawn = int(rng.integers(len(self.colours)))
        if task_index is None:
            task_index = drawn
        elif not 0 <= task_index < len(self.colours):
            raise ConfigError(f"task_index must be 0 to {len(self.colours) - 1}, got {task_index}")
        others = [colour for colour in COLOURS if colour not in self.colours]
        shown = list(self.colours) + [str(c) for c in rng.permutation(others)[: self.distractors]]
        dots = _place_dots(rng, len(shown))
        target = dots[task_index]
        start = rng.uniform(-0.8, 0.8, size=2)
        for _ in range(200):  # out of the target dot, so that no episode begins as a success
            if np.linalg.norm(start - target) > DOT_RADIUS:
                break
            start = rng.uniform(-0.8, 0.8, size=2)
        background = rng.integers(90, 170, size=3)
        return DotWorld(self, rng, task_index, shown, dots, start, background)

    def expert_norm_stats(self, episodes: int = 64, length: tuple[int, int] = (30, 60)) -> NormStats:
        """The state and action statistics of a dataset of this variant (the expert's frames over
        episodes of `length`, exactly as `relay datasets synth --seed MIX_SEED` writes them), without
        rendering a frame: what a model trained on such a dataset was normalized with."""
        from relay_engine.datasets.norm_stats import compute_norm_stats

        rng = np.random.default_rng(self.mix_seed)
        states, actions = [], []
        for episode in range(episodes):
            world = self.start(
                np.random.default_rng(episode_seed(self.mix_seed, episode)), episode % len(self.colours)
            )
            for _ in range(int(rng.integers(length[0], length[1] + 1))):
                step = world.expert_step()
                states.append(world.state())
                actions.append(self.action_columns(step))
                world.move(step)
        return compute_norm_stats(np.array(states), np.array(actions))

    def _check(self) -> None:
        colours = list(self.colours)
        unknown = [colour for colour in colours if colour not in COLOURS]
        if not colours or unknown or len(set(colours)) != len(colours):
            raise ConfigError(
                f"colours must be distinct names from: {', '.join(COLOURS)}; got {', '.join(colours)}"
            )
        if not 0 <= self.distractors <= len(COLOURS) - len(colours):
            raise ConfigError(
                f"distractors must be 0 to {len(COLOURS) - len(colours)} (the colours no task names), "
                f"got {self.distractors}"
            )
        x, y, zoom = self.top_view if len(self.top_view) == 3 else (9.0, 9.0, 0.0)
        if not 0.5 <= zoom <= 4 or max(abs(x), abs(y)) > 1:
            raise ConfigError(
                f"top_view must be (x, y, zoom) with |x|, |y| <= 1 and zoom 0.5 to 4, got {self.top_view}"
            )
        if not 0.5 <= self.wrist_zoom <= 4:
            raise ConfigError(f"wrist_zoom must be 0.5 to 4, got {self.wrist_zoom}")
        if not self.cameras:
            raise ConfigError("cameras must name at least one camera")
        for camera, size in self.cameras.items():
            if len(size) != 2 or min(size) < 8:
                raise ConfigError(
                    f"camera {camera}: size must be (height, width), each at least 8, got {size}"
                )
        for name, width in (("state_dim", self.state_dim), ("action_dim", self.action_dim)):
            if not 2 <= width <= 32:
                raise ConfigError(f"{name} must be 2 to 32, got {width}")
        if not 0 <= self.noise <= 64:
            raise ConfigError(f"noise must be 0 to 64, got {self.noise}")


class DotWorld:
    """One episode in progress: the gripper's position and what the cameras see of it. The
    environment and the dataset writer both step it: `observe`, then `move`."""

    def __init__(
        self,
        task: DotTask,
        rng: np.random.Generator,
        task_index: int,
        shown: Sequence[str],
        dots: np.ndarray,
        start: np.ndarray,
        background: np.ndarray,
    ) -> None:
        self.task = task
        self.task_index = task_index
        self.shown = list(shown)  # the colours of `dots`, the tasks' first
        self.dots = dots
        self.background = background
        self.position = start.copy()
        self._rng = rng  # the pixel noise's

    @property
    def target(self) -> np.ndarray:
        return self.dots[self.task_index]

    @property
    def prompt(self) -> str:
        return task_prompt(self.task.colours[self.task_index])

    @property
    def distance(self) -> float:
        """From the gripper's centre to the target dot's."""
        return float(np.linalg.norm(self.position - self.target))

    @property
    def succeeded(self) -> bool:
        return self.distance <= SUCCESS_DISTANCE

    def expert_step(self) -> np.ndarray:
        """The expert's step (2,) from here: a fixed fraction of the way to the target."""
        return GAIN * (self.target - self.position)

    def move(self, step: np.ndarray) -> None:
        """Take a step (clipped to MAX_STEP per axis), staying on the plane."""
        step = np.clip(np.asarray(step, dtype=np.float64)[:2], -MAX_STEP, MAX_STEP)
        self.position = np.clip(self.position + step, -1.0, 1.0)

    def state(self) -> np.ndarray:
        return self.task.state(self.position)

    def images(self) -> dict[str, np.ndarray]:
        """Each camera's view now, by dataset feature name: the first camera the top view, the
        others wrist views (the noise drawn camera by camera)."""
        return {
            camera: render(
                size,
                self.position,
                self.dots,
                self.shown,
                self.background,
                wrist=i > 0,
                noise=self.task.noise,
                rng=self._rng,
                top_view=self.task.top_view,
                wrist_zoom=self.task.wrist_zoom,
            )
            for i, (camera, size) in enumerate(self.task.cameras.items())
        }


def _place_dots(rng: np.random.Generator, count: int) -> np.ndarray:
    """Dot centres (count, 2), kept apart so that no dot hides another (best effort for many)."""
    dots = rng.uniform(-0.75, 0.75, size=(count, 2))
    for _ in range(200):
        gaps = np.linalg.norm(dots[:, None] - dots[None, :], axis=-1) + np.eye(count) * 9
        if gaps.min() >= 2.2 * DOT_RADIUS:
            break
        dots = rng.uniform(-0.75, 0.75, size=(count, 2))
    return dots


def render(
    size: tuple[int, int],
    position: np.ndarray,
    dots: np.ndarray,
    colours: list[str],
    background: np.ndarray,
    *,
    wrist: bool,
    noise: int,
    rng: np.random.Generator,
    top_view: tuple[float, float, float] = (0.0, 0.0, 1.0),
    wrist_zoom: float = WRIST_ZOOM,
) -> np.ndarray:
    """One uint8 (H, W, 3) view of the plane: the dots, the gripper ring, and `noise`."""
    height, width = size
    if wrist:
        centre, zoom = position, wrist_zoom
    else:
        centre, zoom = np.asarray(top_view[:2], dtype=float), top_view[2]
    # Plane coordinates of each pixel centre; the shorter side spans the view.
    scale = 2.0 / (zoom * min(height, width))
    xs = (np.arange(width) + 0.5 - width / 2) * scale + centre[0]
    ys = (np.arange(height) + 0.5 - height / 2) * scale + centre[1]
    image = np.empty((height, width, 3), dtype=np.int16)
    image[:] = background
    for dot, colour in zip(dots, colours, strict=True):
        inside = (xs[None, :] - dot[0]) ** 2 + (ys[:, None] - dot[1]) ** 2 <= DOT_RADIUS**2
        image[inside] = COLOURS[colour]
    distance = np.sqrt((xs[None, :] - position[0]) ** 2 + (ys[:, None] - position[1]) ** 2)
    image[np.abs(distance - RING_RADIUS) <= max(0.04, 1.5 * scale)] = 255
    if noise:
        image += rng.integers(-noise, noise + 1, size=image.shape, dtype=np.int16)
    return np.clip(image, 0, 255).astype(np.uint8)
