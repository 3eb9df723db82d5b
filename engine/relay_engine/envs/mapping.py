"""How a Gymnasium environment meets a policy trained on a LeRobot dataset: `EnvMapping`.

A policy reads a dataset's image features, its `observation.state` and writes its `action`
columns; an environment speaks in its own observation keys and action space. By default a
mapping follows lerobot's convention for `pixels_agent_pos` environments (gym-pusht, gym-aloha
and `relay/Dot-v0` alike): `obs["pixels"][name]` is the feature `observation.images.<name>`, a
single `obs["pixels"]` image is `observation.image`, and `obs["agent_pos"]` is the state. The
environment's action is the dataset's first action columns (as many as the action space has),
in dataset units: the model's output is un-normalized with its stats first.

`MAPPINGS` holds the ready ones, by environment id; `mapping_for` looks one up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from relay_engine.errors import ConfigError

if TYPE_CHECKING:
    import gymnasium

    from relay_engine.datasets.norm_stats import NormStats

# lerobot's names for an environment's images and state, as its datasets' features.
IMAGE_PREFIX = "observation.images."
SINGLE_IMAGE = "observation.image"
PIXELS_KEY = "pixels"
STATE_KEY = "agent_pos"


@dataclass(frozen=True)
class EnvMapping:
    """One environment's observations and actions, as a policy's dataset names them.

    - `cameras`: observation path ("pixels/top"; "/" between nested keys) -> the dataset's image
      feature; None: every image under `pixels`, by lerobot's convention (see the module).
    - `state`: the observation path of the state (None: the policy gets no state).
    - `action_columns`: which of the dataset's action columns make the environment's action, in
      the action space's order; None: the first N, N the action space's width.
    - `clip_actions`: clip each action into the action space's bounds. gym-aloha's space says
      [-1, 1] but takes joint positions beyond it, as its datasets record them, so its mappings
      do not clip.
    - `prompt`: the task the policy is given, unless the environment says its own in
      `info["task"]` at reset (relay/Dot-v0 does); the ready mappings use the task text of the
      environment's lerobot dataset.
    - `make_kwargs`: keyword arguments of `gymnasium.make` (pixels_agent_pos observations);
      an evaluation's own options are added to them.
    - `module`, `package`: the module that registers the environment (imported first) and the
      pip package that holds it, for the error when it is missing.
    - `environment`: variables set (unless already set) before the environment is made:
      MuJoCo's `MUJOCO_GL=egl` renders without a display.
    - `default_stats`: the normalization of a model that brings none (a base model): given the
      environment, the stats its datasets would have. None: the observation and action spaces'
      bounds are taken as the 1st and 99th percentiles.
    - `video`: the observation path of the image recorded in videos (default: the first camera).
    """

    cameras: Mapping[str, str] | None = None
    state: str | None = STATE_KEY
    action_columns: tuple[int, ...] | None = None
    clip_actions: bool = True
    prompt: str = ""
    make_kwargs: Mapping[str, Any] = field(default_factory=dict)
    module: str | None = None
    package: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    default_stats: Callable[[gymnasium.Env[Any, Any]], NormStats] | None = None
    video: str | None = None

    def camera_paths(self, observation_space: Any) -> dict[str, str]:
        """Observation path -> dataset image feature, for an environment with this observation space."""
        if self.cameras is not None:
            for path in self.cameras:
                subspace(observation_space, path)  # it must exist
            return dict(self.cameras)
        pixels = _child(observation_space, PIXELS_KEY)
        if pixels is None:
            raise ConfigError(
                f"the observation has no {PIXELS_KEY!r}; give the mapping's cameras "
                "(observation path -> the dataset's image feature)"
            )
        if hasattr(pixels, "spaces") and isinstance(pixels.spaces, Mapping):
            return {f"{PIXELS_KEY}/{name}": IMAGE_PREFIX + name for name in pixels.spaces}
        return {PIXELS_KEY: SINGLE_IMAGE}


def subspace(space: Any, path: str) -> Any:
    """The part of a (Dict) observation space at `path`, or a ConfigError naming what is there."""
    current = space
    for key in path.split("/"):
        child = _child(current, key)
        if child is None:
            keys = list(current.spaces) if hasattr(current, "spaces") else []
            raise ConfigError(
                f"observation has no {path!r} (at {key!r} it has: {', '.join(map(str, keys)) or 'no keys'})"
            )
        current = child
    return current


def observation_at(observations: Mapping[str, Any], path: str) -> Any:
    """A (batched) observation's value at `path`."""
    value: Any = observations
    for key in path.split("/"):
        value = value[key]
    return value


def _child(space: Any, key: str) -> Any:
    spaces = getattr(space, "spaces", None)
    if isinstance(spaces, Mapping):
        return spaces.get(key)
    return None


def bounds_stats(observation_space: Any, state_path: str | None, action_space: Any) -> NormStats:
    """Stats that map the state's and the action's space bounds to -1 and +1 (quantile
    normalization with q01 = low, q99 = high): a model without stats of its own then spans the
    environment's whole action space."""
    from relay_engine.datasets.norm_stats import NormStats, Stats

    def of(space: Any, what: str) -> Stats:
        low = np.asarray(space.low, dtype=np.float64).reshape(-1)
        high = np.asarray(space.high, dtype=np.float64).reshape(-1)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ConfigError(
                f"the environment's {what} space is unbounded, so the model needs normalization stats: "
                "pass norm_stats (a norm_stats.json, or the training dataset's directory)"
            )
        return Stats(mean=(low + high) / 2, std=(high - low) / 2, q01=low, q99=high)

    state = (
        of(subspace(observation_space, state_path), "state")
        if state_path is not None
        else Stats(*(np.zeros(0) for _ in range(4)))
    )
    return NormStats(state=state, actions=of(action_space, "action"))


def _dot_stats(env: gymnasium.Env[Any, Any]) -> NormStats:
    """What a `relay datasets synth` dataset of the environment's variant is normalized with."""
    from relay_engine.envs.dot import DotEnv

    unwrapped = env.unwrapped
    assert isinstance(unwrapped, DotEnv)
    return unwrapped.task.expert_norm_stats()


PUSHT_PROMPT = "Push the T-shaped block onto the T-shaped target."


def _aloha(prompt: str) -> EnvMapping:
    """A gym-aloha task: MuJoCo rendering through EGL (headless), actions unclipped (see
    `EnvMapping.clip_actions`)."""
    return EnvMapping(
        prompt=prompt,
        clip_actions=False,
        make_kwargs={"obs_type": "pixels_agent_pos"},
        module="gym_aloha",
        package="gym-aloha",
        environment={"MUJOCO_GL": "egl"},
    )


MAPPINGS: dict[str, EnvMapping] = {
    "relay/Dot-v0": EnvMapping(
        action_columns=(0, 1),
        module="relay_engine.envs",
        package="relay-intelligence[engine]",
        default_stats=_dot_stats,
    ),
    "gym_pusht/PushT-v0": EnvMapping(
        prompt=PUSHT_PROMPT,
        make_kwargs={"obs_type": "pixels_agent_pos"},
        module="gym_pusht",
        package="gym-pusht",
    ),
    "gym_aloha/AlohaInsertion-v0": _aloha("Insert the peg into the socket."),
    "gym_aloha/AlohaTransferCube-v0": _aloha(
        "Pick up the cube with the right arm and transfer it to the left arm."
    ),
}


def mapping_for(env_id: str) -> EnvMapping:
    """The ready mapping of `env_id`; for another environment, lerobot's `pixels`/`agent_pos`
    convention (which says what it misses when the environment does not follow it)."""
    return MAPPINGS.get(env_id.rpartition(":")[2], EnvMapping())
