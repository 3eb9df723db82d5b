"""The harness in an environment no one here wrote: gym-pusht's PushT (pixels, headless) with the
pi05-tiny base. Not a success rate: that observations reach the model as the mapping says, that
the model's actions reach the environment scaled into its action space, that success and reward
are the environment's own (`info`, `reward`), and that videos are written."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import av
import gymnasium
import numpy as np
import pytest

from relay_engine.datasets.norm_stats import NormStats, Stats
from relay_engine.envs import evaluate_in_env
from relay_engine.envs.evaluate import PolicyAdapter
from relay_engine.envs.mapping import MAPPINGS, bounds_stats
from relay_engine.models import load_policy

PUSHT = "gym_pusht/PushT-v0"
RECORDED = "relay_tests/RecordedPushT-v0"


class Recorder(gymnasium.Wrapper[Any, Any, Any, Any]):
    """PushT, keeping what each seeded episode was sent and what it answered."""

    episodes: ClassVar[list[dict[str, Any]]] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        observation, info = super().reset(seed=seed, options=options)
        self.current: dict[str, Any] = {"seed": seed, "actions": [], "rewards": [], "success": []}
        if seed is not None:
            Recorder.episodes.append(self.current)
        return observation, info

    def step(self, action: Any) -> Any:
        observation, reward, terminated, truncated, info = super().step(action)
        self.current["actions"].append(np.array(action))
        self.current["rewards"].append(float(reward))
        self.current["success"].append(bool(info["is_success"]))
        return observation, reward, terminated, truncated, info


def _recorded_pusht(**kwargs: Any) -> Recorder:
    from gym_pusht.envs import PushTEnv

    return Recorder(PushTEnv(**kwargs))


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> Iterator[None]:
    yield


@pytest.fixture(scope="module")
def tiny() -> Any:
    return load_policy("pi05-tiny")


def test_pusht_episodes_run_end_to_end(tiny: Any, tmp_path: Path) -> None:
    if RECORDED not in gymnasium.registry:
        gymnasium.register(id=RECORDED, entry_point=_recorded_pusht, max_episode_steps=300)
    Recorder.episodes.clear()
    report = evaluate_in_env(
        tiny,
        RECORDED,
        episodes=2,
        max_steps=10,
        num_envs=2,
        seed=5,
        videos=tmp_path / "videos",
        mapping=MAPPINGS[PUSHT],
    )
    assert [r.seed for r in report.episodes] == [5, 6]
    assert [r.length for r in report.episodes] == [10, 10] and report.steps == 20
    assert report.forward_passes == 2  # both environments' chunks in one pass, 5 actions each
    sent = {episode["seed"]: episode for episode in Recorder.episodes}
    for record in report.episodes:
        episode = sent[record.seed]
        # Reward and success are what the environment said.
        assert record.reward == pytest.approx(sum(episode["rewards"]))
        assert record.max_reward == pytest.approx(max(episode["rewards"]))
        assert record.success == any(episode["success"])
        # The base model has no stats of its own: its [-1, 1] spans PushT's action space [0, 512].
        actions = np.stack(episode["actions"])
        assert actions.shape == (10, 2) and actions.dtype == np.float32
        assert (actions >= 0).all() and (actions <= 512).all()
        assert np.unique(actions, axis=0).shape[0] > 1  # the policy acts, it does not idle
        assert record.video is not None
        with av.open(record.video) as container:
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        assert len(frames) == 11 and frames[0].shape == (96, 96, 3)
    assert report.mean_reward == pytest.approx(np.mean([sum(e["rewards"]) for e in sent.values()]))


def test_pusht_observations_and_actions_map_as_the_mapping_says(tiny: Any) -> None:
    env = gymnasium.make(PUSHT, obs_type="pixels_agent_pos")
    try:
        observation, _ = env.reset(seed=0)
        mapping = MAPPINGS[PUSHT]
        stats = bounds_stats(env.observation_space, mapping.state, env.action_space)
        adapter = PolicyAdapter.build(tiny, None, mapping, env, stats, None)
        # lerobot's convention: a single `pixels` image is the dataset's observation.image, in the
        # model's first camera slot; agent_pos is the state.
        assert adapter.cameras == {"pixels": "base_0_rgb"} and adapter.state == "agent_pos"
        batched = {key: value[None] for key, value in observation.items()}
        sample = adapter.sample(batched, 0, None)
        assert np.array_equal(sample["image"]["base_0_rgb"], observation["pixels"])
        expected_state = observation["agent_pos"] / (512 + 1e-6) * 2 - 1
        assert np.allclose(sample["state"][:2], expected_state, atol=1e-5) and sample["state_dim"] == 2
        assert sample["prompt"] == "Push the T-shaped block onto the T-shaped target."
        # Normalized -1, 0, 1, 2 -> PushT's 0, 256, 512 and, clipped, 512.
        chunk = np.zeros((1, 4, 32), dtype=np.float32)
        chunk[0, :, :2] = np.array([-1.0, 0.0, 1.0, 2.0])[:, None]
        assert np.allclose(
            adapter.env_actions(chunk)[0], [[0, 0], [256, 256], [512, 512], [512, 512]], atol=1e-3
        )
        # A fine-tune's own stats (dataset units) rule where it has them.
        trained = NormStats(
            state=stats.state,
            actions=Stats(
                mean=np.zeros(2), std=np.ones(2), q01=np.array([100.0, 50.0]), q99=np.array([300.0, 450.0])
            ),
        )
        adapter = PolicyAdapter.build(
            tiny, None, dataclasses.replace(mapping, clip_actions=False), env, trained, None
        )
        assert np.allclose(adapter.env_actions(chunk)[0][:2], [[100, 50], [200, 250]], atol=1e-3)
        assert np.allclose(adapter.env_actions(chunk)[0][3], [400, 650], atol=1e-3)  # not clipped
    finally:
        env.close()


def test_a_smolvla_output_acts_in_pusht_by_its_camera_s_name(tmp_path: Path) -> None:
    """SmolVLA reads an environment's cameras by the names it was trained with: a smolvla-tiny
    job trained on a dataset shaped as lerobot's pusht (one camera, `observation.image`; state and
    action 2 wide) acts in PushT, its actions inside the action space."""
    from relay.sft.config import SFTConfig
    from relay_engine.datasets import write_synthetic_dataset
    from relay_engine.recipe import Recipe, run_recipe

    data = write_synthetic_dataset(
        tmp_path / "pusht-shaped", episodes=4, episode_length=12, cameras={"observation.image": (96, 96)}
    )
    config = SFTConfig(model="smolvla-tiny", dataset_name=str(data), steps=2, batch_size=2)
    result = run_recipe(Recipe(config), tmp_path / "run", on_event=lambda e: None, should_stop=lambda: False)
    if RECORDED not in gymnasium.registry:
        gymnasium.register(id=RECORDED, entry_point=_recorded_pusht, max_episode_steps=300)
    Recorder.episodes.clear()
    report = evaluate_in_env(
        str(result.output_dir),
        RECORDED,
        episodes=1,
        max_steps=6,
        seed=3,
        videos=tmp_path / "videos",
        mapping=MAPPINGS[PUSHT],
    )
    (episode,) = report.episodes
    assert episode.length == 6 and episode.video is not None
    (sent,) = Recorder.episodes
    actions = np.stack(sent["actions"])
    assert actions.shape == (6, 2) and actions.dtype == np.float32
    assert (actions >= 0).all() and (actions <= 512).all()
