"""`relay/Dot-v0` is the synthetic dataset's task: same frames, states and actions, and an expert
that succeeds."""

from __future__ import annotations

import io
from pathlib import Path

import gymnasium
import numpy as np
import pyarrow.parquet as pq
import pytest
from gymnasium.utils.env_checker import check_env
from PIL import Image

from relay_engine.datasets import dataset_norm_stats, write_synthetic_dataset
from relay_engine.envs import DOT_ENV_ID, DOT_MAX_EPISODE_STEPS
from relay_engine.envs.dot_world import DotTask, episode_seed
from relay_engine.errors import ConfigError

CAMERAS = {"observation.images.top": (24, 32), "observation.images.wrist": (16, 16)}
VARIANT = {"colours": ["red", "blue"], "distractors": 1, "state_dim": 3, "noise": 6}


def _frames(path: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for file in sorted(path.rglob("*.parquet")):
        rows.extend(pq.read_table(file).to_pylist())
    return rows


def test_an_episode_written_by_synth_is_the_envs_rollout_of_the_expert(tmp_path: Path) -> None:
    seed = 7
    path = write_synthetic_dataset(
        tmp_path / "dots",
        episodes=3,
        episode_length=(6, 9),
        cameras=CAMERAS,
        action_dim=4,
        seed=seed,
        **VARIANT,
    )
    rows = _frames(path)
    env = gymnasium.make(DOT_ENV_ID, cameras=CAMERAS, mix_seed=seed, **VARIANT)
    mix = DotTask(colours=("red", "blue"), state_dim=3, action_dim=4, mix_seed=seed).mixes[1]
    for episode in range(3):
        frames = [row for row in rows if row["episode_index"] == episode]
        observation, info = env.reset(seed=episode_seed(seed, episode), options={"task_index": episode % 2})
        assert info["task"] == ["move to the red dot", "move to the blue dot"][frames[0]["task_index"]]
        for row in frames:
            for feature in CAMERAS:
                written = np.asarray(Image.open(io.BytesIO(row[feature]["bytes"])))
                assert np.array_equal(observation["pixels"][feature.split(".")[-1]], written)
            assert np.array_equal(observation["agent_pos"], np.asarray(row["observation.state"], np.float32))
            step = env.unwrapped.expert_action()  # type: ignore[attr-defined]
            action = np.asarray(row["action"], dtype=np.float32)
            assert np.array_equal(step.astype(np.float32), action[:2])
            assert np.allclose(mix @ step, action[2:], atol=1e-6)  # the wider columns: fixed mixes
            observation, *_ = env.step(step)


def test_the_expert_succeeds_and_standing_still_does_not() -> None:
    env = gymnasium.make(
        DOT_ENV_ID, colours="orange,green", distractors=2, cameras={"observation.images.top": (16, 16)}
    )
    for seed in range(12):
        _, info = env.reset(seed=seed)
        assert not info["is_success"]
        steps = 0
        while True:
            _, reward, terminated, truncated, info = env.step(env.unwrapped.expert_action())  # type: ignore[attr-defined]
            steps += 1
            if terminated or truncated:
                break
        assert terminated and info["is_success"] and reward == 1.0, seed
        assert steps <= 15
    # Every episode starts with the gripper outside the target dot: doing nothing never succeeds.
    for seed in range(12):
        env.reset(seed=seed)
        rewards = []
        for _ in range(DOT_MAX_EPISODE_STEPS):
            _, reward, terminated, truncated, info = env.step(np.zeros(2, dtype=np.float32))
            rewards.append(reward)
            if terminated or truncated:
                break
        assert truncated and not terminated and not info["is_success"] and sum(rewards) == 0.0


def test_it_is_a_deterministic_gymnasium_env() -> None:
    env = gymnasium.make(DOT_ENV_ID, noise=4)
    check_env(env.unwrapped)  # the spaces, seeding and determinism Gymnasium checks
    first, _ = env.reset(seed=3)
    again, _ = env.reset(seed=3)
    other, _ = env.reset(seed=4)
    assert np.array_equal(first["pixels"]["top"], again["pixels"]["top"])
    assert not np.array_equal(first["pixels"]["top"], other["pixels"]["top"])
    assert env.action_space.contains(np.array([0.5, -0.5], dtype=np.float32))
    moved, *_ = env.step(np.array([9.0, 0.0]))  # a step is clipped to 0.5 along each axis
    assert moved["agent_pos"][0] == pytest.approx(min(1.0, other["agent_pos"][0] + 0.5), abs=1e-6)


def test_a_bad_variant_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError, match="colours must be distinct names"):
        gymnasium.make(DOT_ENV_ID, colours=["purple"])
    with pytest.raises(ConfigError, match="state_dim must be 2 to 32"):
        gymnasium.make(DOT_ENV_ID, state_dim=1)
    env = gymnasium.make(DOT_ENV_ID)
    with pytest.raises(ConfigError, match="task_index must be 0 to 0"):
        env.reset(seed=0, options={"task_index": 1})


def test_expert_norm_stats_are_the_synth_datasets(tmp_path: Path) -> None:
    path = write_synthetic_dataset(
        tmp_path / "dots",
        episodes=5,
        episode_length=(4, 7),
        cameras={"observation.images.top": (8, 8)},
        seed=2,
    )
    written, _ = dataset_norm_stats(str(path), cache_dir=tmp_path / "cache")
    expected = DotTask(colours=("red",), mix_seed=2).expert_norm_stats(episodes=5, length=(4, 7))
    for field in ("mean", "std", "q01", "q99"):
        assert np.allclose(getattr(written.actions, field), getattr(expected.actions, field), atol=1e-6)
        assert np.allclose(getattr(written.state, field), getattr(expected.state, field), atol=1e-6)
