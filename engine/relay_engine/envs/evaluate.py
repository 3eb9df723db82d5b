"""Closed-loop evaluation: a policy acts in a Gymnasium environment for N episodes.

`evaluate_in_env(model, env_id, episodes=N)` runs `num_envs` copies of the environment at once
(a Gymnasium vector env) and asks the model for action chunks in ONE batched forward pass per
step, for every environment whose chunk has run out. As openpi's clients do, it executes the first
`actions_per_chunk` actions of each chunk (by default half the chunk: 5 of pi05's 10) and then
asks again from what the environment shows then. Episode k is reset with seed `seed + k`,
whichever environment runs it, and its sampler noise comes from the same number, so a report
does not depend on `num_envs` beyond floating-point rounding.

Observations reach the model through an `EnvMapping` (cameras, state; `relay_engine.envs.mapping`)
and the model's normalization stats, and its chunks go back un-normalized, in the dataset's
action columns, clipped into the action space. Success is the environment's
`info["is_success"]` at any step of the episode; reward is summed over the episode.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relay.catalog import MODEL_CAMERAS
from relay.env_evaluation import JOB_EVAL_SEED_MAX, EnvEvalReport, EpisodeRecord
from relay_engine.acting import (
    ActingPolicy,
    load_acting_policy,
    observation_sample,
    read_norm_stats,
    sample_chunks,
    seeded_noise,
)
from relay_engine.datasets.norm_stats import NormStats
from relay_engine.envs.mapping import (
    MAPPINGS,
    EnvMapping,
    bounds_stats,
    mapping_for,
    observation_at,
    subspace,
)
from relay_engine.errors import ConfigError
from relay_engine.families.robot_scores import BlindPolicy
from relay_engine.samples import Sample

# Environments stepped side by side (one batched forward pass serves them all).
DEFAULT_NUM_ENVS = 8
# Episodes whose videos are written, the first ones.
DEFAULT_VIDEO_EPISODES = 4
EPISODES_MAX = 100_000
NUM_ENVS_MAX = 256
VIDEO_FPS = 10  # when the environment's metadata has no render_fps


class EvaluationStopped(Exception):
    """`should_stop()` turned true between two environment steps: the evaluation ended early, with
    no report (a job's cancel reaches an evaluation of thousands of episodes within a step)."""


def evaluate_in_env(
    policy_or_model: ActingPolicy | str | os.PathLike[str],
    env_id: str,
    *,
    episodes: int = 10,
    max_steps: int | None = None,
    seed: int = 0,
    videos: str | os.PathLike[str] | None = None,
    video_episodes: int = DEFAULT_VIDEO_EPISODES,
    num_envs: int | None = None,
    asynchronous: bool = False,
    actions_per_chunk: int | None = None,
    mapping: EnvMapping | None = None,
    norm_stats: NormStats | str | os.PathLike[str] | None = None,
    env_options: Mapping[str, Any] | None = None,
    prompt: str | None = None,
    num_steps: int = 10,
    device: str = "auto",
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> EnvEvalReport:
    """Run a policy in `env_id` for `episodes` episodes and report how it did.

    - `policy_or_model`: a loaded `Pi05Policy`, a base model's name (`pi05-tiny`), a model
      directory (a job's downloaded output, a local run's directory, or a work directory whose
      `output/` holds the model), or `BlindPolicy.from_dataset(...)`: the blind baseline, which
      acts out the training frames' mean chunk in the dataset's units.
    - `max_steps`: an episode's limit in environment steps (default: the environment's
      registered `max_episode_steps`). `seed`: episode k is reset with `seed + k`.
    - `videos`: a directory for mp4s (H.264, PyAV) of the first `video_episodes` episodes, one
      camera each (`EnvMapping.video`); `episode_0000.mp4`, ...
    - `num_envs`: environments stepped at once (default min(episodes, 8)); `asynchronous`: each in
      a process of its own (Gymnasium's AsyncVectorEnv), for simulators whose step costs more
      than passing the observation between processes (rendering gym-pusht, MuJoCo).
    - `actions_per_chunk`: actions executed from each sampled chunk before the next forward pass
      (1 to the model's action horizon; default half the horizon).
    - `mapping`: the environment's observations and actions as the model's dataset names them
      (default: the ready one for `env_id`, else lerobot's `pixels`/`agent_pos` convention).
    - `norm_stats`: what the model's inputs and outputs are normalized with: NormStats, a
      norm_stats.json, a model directory or a dataset directory (default: the model directory's
      norm_stats.json; for a model without one, the mapping's default_stats, else the
      environment's space bounds).
    - `env_options`: keyword arguments of `gymnasium.make` (a variant of relay/Dot-v0:
      `{"colours": ["orange"]}`). `prompt`: the task given to the policy in every episode
      (default: the episode's own, `info["task"]` at reset, else the mapping's).
    - `num_steps`: the sampler's Euler steps; `device`: auto, cpu or cuda (a loaded policy stays
      where it is).
    - `on_episode(record)`: called as each episode ends, in the order they end.
    - `should_stop()`: asked before each step of the environments; once true, the evaluation
      ends at once with EvaluationStopped (its open videos closed, no report).

    Returns an `EnvEvalReport` (relay.env_evaluation): success_rate, mean_reward (of each
    episode's summed reward), mean_max_reward, mean_length, seconds, steps, forward_passes and
    one EpisodeRecord per episode, in episode order. Raises ConfigError for a bad option, an
    unknown environment or a mapping that does not fit the environment or the model.
    """
    _check_counts(episodes, video_episodes, num_envs, num_steps, max_steps, seed)
    mapping = mapping if mapping is not None else mapping_for(env_id)
    maker = EnvMaker(env_id, mapping, max_steps, env_options or {})
    probe = maker.make()
    try:
        limit = max_steps if max_steps is not None else _registered_limit(env_id, probe)
        policy, model_name, model_dir = load_acting_policy(policy_or_model, device)
        own_stats = policy.norm_stats if isinstance(policy, BlindPolicy) else None
        stats = _choose_stats(norm_stats or own_stats, model_dir, mapping, probe)
        adapter = PolicyAdapter.build(policy, model_dir, mapping, probe, stats, prompt)
        fps = int(probe.metadata.get("render_fps") or VIDEO_FPS)
    finally:
        probe.close()
    horizon = policy.config.action_horizon
    per_chunk = max(1, horizon // 2) if actions_per_chunk is None else actions_per_chunk
    if not 1 <= per_chunk <= horizon:
        raise ConfigError(
            f"actions_per_chunk must be 1 to the model's action horizon ({horizon}), got {per_chunk}"
        )
    rollouts = _Rollouts(
        maker=maker,
        adapter=adapter,
        policy=policy,
        episodes=episodes,
        num_envs=min(num_envs or DEFAULT_NUM_ENVS, episodes),
        asynchronous=asynchronous,
        seed=seed,
        per_chunk=per_chunk,
        num_steps=num_steps,
        videos=_Videos(Path(videos), video_episodes, fps) if videos is not None else None,
        on_episode=on_episode,
        should_stop=should_stop or _never,
    )
    started = time.perf_counter()
    records = rollouts.run()
    seconds = time.perf_counter() - started
    return EnvEvalReport(
        env_id=env_id,
        env_options=dict(env_options or {}),
        model=model_name,
        success_rate=float(np.mean([r.success for r in records])),
        mean_reward=float(np.mean([r.reward for r in records])),
        mean_max_reward=float(np.mean([r.max_reward for r in records])),
        mean_length=float(np.mean([r.length for r in records])),
        seconds=seconds,
        steps=rollouts.steps,
        forward_passes=rollouts.forward_passes,
        seed=seed,
        max_steps=limit,
        num_envs=rollouts.num_envs,
        actions_per_chunk=per_chunk,
        episodes=records,
    )


def _never() -> bool:
    return False


def _check_counts(
    episodes: int, video_episodes: int, num_envs: int | None, num_steps: int, max_steps: int | None, seed: int
) -> None:
    rules: list[tuple[str, int | None, int, int]] = [
        ("seed", seed, 0, JOB_EVAL_SEED_MAX),
        ("episodes", episodes, 1, EPISODES_MAX),
        ("video_episodes", video_episodes, 0, EPISODES_MAX),
        ("num_envs", num_envs, 1, NUM_ENVS_MAX),
        ("num_steps", num_steps, 1, 1000),
        ("max_steps", max_steps, 1, 1_000_000),
    ]
    for name, value, low, high in rules:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(f"bad {name}: {value!r} (must be an integer from {low} to {high})")


class EnvMaker:
    """Makes the environment as the mapping says: its module imported, its variables set, its
    options and step limit applied; Gymnasium's errors become ConfigErrors naming the id."""

    def __init__(
        self, env_id: str, mapping: EnvMapping, max_steps: int | None, options: Mapping[str, Any]
    ) -> None:
        self.env_id = env_id
        self.mapping = mapping
        self.max_steps = max_steps
        self.kwargs = {**mapping.make_kwargs, **options}
        self._register()

    def _register(self) -> None:
        """Import the module that registers the environment (again in a spawned process, where
        the maker arrives pickled and Gymnasium's registry is empty)."""
        for name, value in self.mapping.environment.items():
            os.environ.setdefault(name, value)
        # pygame (gym-pusht's renderer) greets on stdout at import, which would spoil --json.
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        mapping = self.mapping
        if mapping.module is not None:
            try:
                __import__(mapping.module)
            except ImportError as error:
                raise ConfigError(
                    f"environment {self.env_id!r} needs {mapping.package or mapping.module} "
                    f"({error.name or error} is missing): pip install {mapping.package or mapping.module}"
                ) from None

    def make(self) -> Any:
        import gymnasium

        self._register()

        try:
            return gymnasium.make(self.env_id, max_episode_steps=self.max_steps, **self.kwargs)
        except gymnasium.error.UnregisteredEnv as error:
            raise ConfigError(
                f"no Gymnasium environment {self.env_id!r} ({error}); ready: {', '.join(MAPPINGS)}; "
                "another package's environment: install it and name its module, as 'module:id'"
            ) from None
        except gymnasium.error.Error as error:
            raise ConfigError(f"environment {self.env_id!r}: {error}") from None
        except TypeError as error:  # an option the environment does not take
            raise ConfigError(f"environment {self.env_id!r}: bad option ({error})") from None

    def vector(self, count: int, asynchronous: bool = False) -> Any:
        """`count` environments, stepped in this process or each in its own; an environment whose
        episode ended waits for our reset (which seeds the next episode)."""
        from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

        makers = [self.make for _ in range(count)]
        if asynchronous:
            # Spawned, not forked: a process that has rendered with MuJoCo's EGL (an earlier
            # evaluation, or the probe) hands a forked child a GL context it cannot use, and the
            # child hangs at its first reset. Spawning costs each a second or two of imports.
            return AsyncVectorEnv(makers, autoreset_mode=AutoresetMode.DISABLED, context="spawn")
        return SyncVectorEnv(makers, autoreset_mode=AutoresetMode.DISABLED)


def _registered_limit(env_id: str, env: Any) -> int:
    limit = env.spec.max_episode_steps if env.spec is not None else None
    if limit is None:
        raise ConfigError(f"environment {env_id!r} registers no max_episode_steps; give max_steps")
    return int(limit)


def _choose_stats(
    given: NormStats | str | os.PathLike[str] | None, model_dir: Path | None, mapping: EnvMapping, env: Any
) -> NormStats:
    if isinstance(given, NormStats):
        return given
    if given is not None:
        return read_norm_stats(Path(given).expanduser())
    if model_dir is not None and (model_dir / "norm_stats.json").is_file():
        return read_norm_stats(model_dir / "norm_stats.json")
    if mapping.default_stats is not None:
        return mapping.default_stats(env)
    return bounds_stats(env.observation_space, mapping.state, env.action_space)


@dataclass
class PolicyAdapter:
    """Between one environment and one model: observations in, env actions out."""

    cameras: dict[str, str]  # observation path -> model camera
    state: str | None
    stats: NormStats
    columns: list[int]  # the dataset's action columns, in the env action's order
    low: np.ndarray | None  # the action space's bounds, when actions are clipped into them
    high: np.ndarray | None
    prompt: str  # when the environment says no task of its own
    prompt_override: str | None  # the caller's, over the environment's
    video: str
    action_dtype: np.dtype[Any]
    idle_action: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))

    @classmethod
    def build(
        cls,
        policy: ActingPolicy,
        model_dir: Path | None,
        mapping: EnvMapping,
        env: Any,
        stats: NormStats,
        prompt: str | None,
    ) -> PolicyAdapter:
        from relay_engine.models.lerobot_files import RobotFeatures

        features = mapping.camera_paths(env.observation_space)
        if policy.reads_cameras is not None:  # by the names it was trained with
            cameras = _named_cameras(features, policy.reads_cameras)
        else:
            saved = RobotFeatures.read(model_dir) if model_dir is not None else None
            cameras = _camera_slots(
                features, list(saved.cameras) if saved is not None and saved.cameras else None
            )
        if mapping.state is not None:
            width = int(np.prod(subspace(env.observation_space, mapping.state).shape))
            if width != stats.state_dim:
                raise ConfigError(
                    f"the environment's state ({mapping.state}) is {width} wide; "
                    f"the model's stats are {stats.state_dim} wide"
                )
        space = env.action_space
        if len(space.shape) != 1:
            raise ConfigError(f"the environment's action space must be a vector (Box), got {space}")
        columns = (
            list(mapping.action_columns)
            if mapping.action_columns is not None
            else list(range(space.shape[0]))
        )
        if len(columns) != space.shape[0] or max(columns) >= stats.action_dim or min(columns) < 0:
            raise ConfigError(
                f"action_columns {columns} must name {space.shape[0]} of the model's "
                f"{stats.action_dim} action columns (0 to {stats.action_dim - 1}), one per env action"
            )
        low, high = np.asarray(space.low, dtype=np.float64), np.asarray(space.high, dtype=np.float64)
        finite = np.isfinite(low).all() and np.isfinite(high).all()
        return cls(
            cameras=cameras,
            state=mapping.state,
            stats=stats,
            columns=columns,
            low=low if mapping.clip_actions and finite else None,
            high=high if mapping.clip_actions and finite else None,
            prompt=mapping.prompt,
            prompt_override=prompt,
            video=mapping.video or next(iter(features)),
            action_dtype=np.dtype(space.dtype),
            idle_action=np.clip(np.zeros(space.shape), low, high).astype(space.dtype),
        )

    def sample(self, observations: Mapping[str, Any], row: int, prompt: str | None) -> Sample:
        """Environment `row`'s observation as the model's input (normalized state, no actions);
        `prompt` is the episode's task as the environment said it, if it did."""
        images = {
            camera: np.asarray(observation_at(observations, path)[row], dtype=np.uint8)
            for path, camera in self.cameras.items()
        }
        state = (
            np.asarray(observation_at(observations, self.state)[row], dtype=np.float32).reshape(-1)
            if self.state is not None
            else None
        )
        return observation_sample(images, state, self.prompt_override or prompt or self.prompt, self.stats)

    def env_actions(self, chunks: np.ndarray) -> np.ndarray:
        """Normalized chunks (B, H, 32) -> the environment's actions (B, H, env width)."""
        actions = self.stats.unnormalize_actions(chunks)[..., self.columns].astype(np.float64)
        if self.low is not None and self.high is not None:
            actions = np.clip(actions, self.low, self.high)
        return actions.astype(self.action_dtype)


def _named_cameras(features: dict[str, str], names: Sequence[str]) -> dict[str, str]:
    """Observation path -> the camera's own name, for a model that reads cameras by name."""
    by_feature = {feature: path for path, feature in features.items()}
    missing = [name for name in names if name not in by_feature]
    if missing:
        raise ConfigError(
            f"the model reads camera {', '.join(missing)}, which the environment's observation does "
            f"not give (it gives: {', '.join(features.values())}); map them with the mapping's cameras"
        )
    return {by_feature[name]: name for name in names}


def _camera_slots(features: dict[str, str], model_features: list[str] | None) -> dict[str, str]:
    """Observation path -> model camera: the model's saved features in its slot order, each found
    in the environment; a model that saved none takes the environment's cameras in order."""
    if model_features is None:
        if len(features) > len(MODEL_CAMERAS):
            raise ConfigError(
                f"the environment gives {len(features)} cameras; the model has {len(MODEL_CAMERAS)} slots: "
                "give the mapping's cameras"
            )
        return dict(zip(features, MODEL_CAMERAS, strict=False))
    by_feature = {feature: path for path, feature in features.items()}
    missing = [feature for feature in model_features if feature not in by_feature]
    if missing:
        raise ConfigError(
            f"the model reads camera {', '.join(missing)}, which the environment's observation does "
            f"not give (it gives: {', '.join(features.values())}); map them with the mapping's cameras"
        )
    return {by_feature[feature]: MODEL_CAMERAS[slot] for slot, feature in enumerate(model_features)}


@dataclass
class _Episode:
    """An episode in progress in one environment."""

    index: int
    seed: int
    prompt: str | None
    generator: torch.Generator
    queue: deque[np.ndarray] = field(default_factory=deque)
    reward: float = 0.0
    max_reward: float = -np.inf
    length: int = 0
    success: bool = False
    video: _Video | None = None  # the first episodes' mp4, written as frames arrive


class _Rollouts:
    """The loop: step every environment, refill the chunks of those that ran out in one batched
    forward pass, reset finished environments into the next episode."""

    def __init__(
        self,
        *,
        maker: EnvMaker,
        adapter: PolicyAdapter,
        policy: ActingPolicy,
        episodes: int,
        num_envs: int,
        asynchronous: bool,
        seed: int,
        per_chunk: int,
        num_steps: int,
        videos: _Videos | None,
        on_episode: Callable[[EpisodeRecord], None] | None,
        should_stop: Callable[[], bool],
    ) -> None:
        self.maker, self.adapter, self.policy = maker, adapter, policy
        self.should_stop = should_stop
        self.episodes, self.num_envs, self.seed = episodes, num_envs, seed
        self.asynchronous = asynchronous
        self.per_chunk, self.num_steps = per_chunk, num_steps
        self.videos, self.on_episode = videos, on_episode
        self.steps = 0
        self.forward_passes = 0
        self._next = 0
        self._records: dict[int, EpisodeRecord] = {}

    def run(self) -> list[EpisodeRecord]:
        self.policy.eval()
        envs = self.maker.vector(self.num_envs, self.asynchronous)
        running: list[_Episode | None] = [self._start() for _ in range(self.num_envs)]
        try:
            observations, infos = envs.reset(seed=[e.seed for e in running if e is not None])
            self._note_reset(running, observations, infos, np.ones(self.num_envs, dtype=bool))
            while any(e is not None for e in running):
                if self.should_stop():
                    raise EvaluationStopped(f"stopped after {self.steps} environment steps")
                self._refill(running, observations)
                actions = np.stack(
                    [e.queue.popleft() if e is not None else self.adapter.idle_action for e in running]
                )
                observations, rewards, terminated, truncated, infos = envs.step(actions)
                done = np.logical_or(terminated, truncated)
                self._note_step(running, observations, rewards, infos)
                if done.any():
                    observations, infos = self._reset_done(envs, running, done)
        finally:
            envs.close()
            for episode in running:  # stopped early: close the videos begun
                if episode is not None and episode.video is not None:
                    with contextlib.suppress(Exception):
                        episode.video.close()
        return [self._records[i] for i in range(self.episodes)]

    def _start(self) -> _Episode | None:
        if self._next >= self.episodes:
            return None
        index, self._next = self._next, self._next + 1
        seed = self.seed + index
        return _Episode(
            index=index,
            seed=seed,
            prompt=None,
            generator=torch.Generator().manual_seed(seed),
            video=self.videos.open(index) if self.videos is not None and index < self.videos.count else None,
        )

    def _refill(self, running: Sequence[_Episode | None], observations: Mapping[str, Any]) -> None:
        waiting = [row for row, e in enumerate(running) if e is not None and not e.queue]
        if not waiting:
            return
        samples, noise = [], []
        for row in waiting:
            episode = running[row]
            assert episode is not None
            samples.append(self.adapter.sample(observations, row, episode.prompt))
            noise.append(seeded_noise(self.policy, episode.generator))
        chunks = sample_chunks(self.policy, samples, noise, self.num_steps)
        self.forward_passes += 1
        actions = self.adapter.env_actions(chunks)
        for row, chunk in zip(waiting, actions, strict=True):
            episode = running[row]
            assert episode is not None
            episode.queue.extend(chunk[: self.per_chunk])

    def _note_step(
        self,
        running: Sequence[_Episode | None],
        observations: Mapping[str, Any],
        rewards: np.ndarray,
        infos: Mapping[str, Any],
    ) -> None:
        succeeded = _info_values(infos, "is_success", len(running))
        for row, episode in enumerate(running):
            if episode is None:
                continue
            self.steps += 1
            episode.length += 1
            episode.reward += float(rewards[row])
            episode.max_reward = max(episode.max_reward, float(rewards[row]))
            episode.success = episode.success or bool(succeeded[row])
            if episode.video is not None:
                episode.video.add(observation_at(observations, self.adapter.video)[row])

    def _note_reset(
        self,
        running: Sequence[_Episode | None],
        observations: Mapping[str, Any],
        infos: Mapping[str, Any],
        rows: np.ndarray,
    ) -> None:
        """Read what a reset gave the episodes that start now: their prompt and first frame."""
        tasks = _info_values(infos, "task", len(running))
        for row in map(int, np.flatnonzero(rows)):
            episode = running[row]
            if episode is None:
                continue
            if isinstance(tasks[row], str):
                episode.prompt = tasks[row]
            if episode.video is not None:
                episode.video.add(observation_at(observations, self.adapter.video)[row])

    def _reset_done(
        self, envs: Any, running: list[_Episode | None], done: np.ndarray
    ) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        seeds: list[int | None] = [None] * len(running)
        for row in map(int, np.flatnonzero(done)):
            finished = running[row]
            if finished is not None:
                self._finish(finished)
            running[row] = self._start()
            started = running[row]
            seeds[row] = started.seed if started is not None else None
        observations, infos = envs.reset(seed=seeds, options={"reset_mask": done.copy()})
        self._note_reset(running, observations, infos, done)
        return observations, infos

    def _finish(self, episode: _Episode) -> None:
        video = None
        if episode.video is not None:
            video = str(episode.video.close())
        record = EpisodeRecord(
            episode=episode.index,
            seed=episode.seed,
            success=episode.success,
            reward=episode.reward,
            max_reward=episode.max_reward if episode.length else 0.0,
            length=episode.length,
            video=video,
        )
        self._records[episode.index] = record
        if self.on_episode is not None:
            self.on_episode(record)


def _info_values(infos: Mapping[str, Any], key: str, count: int) -> list[Any]:
    """A vector env's info values of `key`, one per environment (None where it gave none)."""
    values, present = infos.get(key), infos.get(f"_{key}")
    if values is None:
        return [None] * count
    return [values[row] if present is None or present[row] else None for row in range(count)]


@dataclass(frozen=True)
class _Videos:
    """Where the first `count` episodes' videos go, and their frame rate."""

    directory: Path
    count: int
    fps: int

    def open(self, episode: int) -> _Video:
        return _Video(self.directory / f"episode_{episode:04d}.mp4", self.fps)


class _Video:
    """One episode's H.264 mp4, encoded frame by frame as the episode runs (so a long episode of
    large frames is never held in memory), padded to even sizes as yuv420p needs."""

    def __init__(self, path: Path, fps: int) -> None:
        self.path = path
        self.fps = fps
        self._encoder: Any = None
        self._frame = np.zeros(0, dtype=np.uint8)

    def add(self, image: np.ndarray) -> None:
        from relay_engine.datasets.video import VideoEncoder, VideoSettings

        image = np.asarray(image, dtype=np.uint8)[..., :3]
        height, width = image.shape[:2]
        if self._encoder is None:
            size = (height + height % 2, width + width % 2)
            self._encoder = VideoEncoder(self.path, self.fps, size, VideoSettings(g=self.fps))
            self._frame = np.zeros((*size, 3), dtype=np.uint8)
        self._frame[:height, :width] = image
        self._encoder.add(self._frame)

    def close(self) -> Path:
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None
        return self.path
