"""`evaluate_in_env` and `relay eval` on relay/Dot-v0 with the pi05-tiny base: batched environments,
chunks reused, the model's own stats, videos, and clear refusals."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay.env_evaluation import EnvEvalReport
from relay_engine.datasets import open_dataset, write_synthetic_dataset
from relay_engine.datasets.video import probe
from relay_engine.envs import DOT_ENV_ID, evaluate_in_env
from relay_engine.envs.dot import DotEnv
from relay_engine.envs.dot_world import DotTask
from relay_engine.errors import ConfigError
from relay_engine.families.robot_scores import BlindPolicy
from relay_engine.models import load_policy
from relay_engine.models.lerobot_files import RobotFeatures

runner = CliRunner()


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> Iterator[None]:
    yield


@pytest.fixture(scope="module")
def tiny() -> object:
    return load_policy("pi05-tiny")


def test_it_runs_episodes_in_batched_envs_and_writes_videos(tiny: object, tmp_path: Path) -> None:
    seen = []
    report = evaluate_in_env(
        tiny,  # type: ignore[arg-type]
        DOT_ENV_ID,
        episodes=3,
        max_steps=7,
        num_envs=2,
        actions_per_chunk=3,
        seed=10,
        videos=tmp_path / "videos",
        video_episodes=2,
        on_episode=seen.append,
    )
    assert isinstance(report, EnvEvalReport)
    assert [r.episode for r in report.episodes] == [0, 1, 2]
    assert [r.seed for r in report.episodes] == [10, 11, 12]
    assert sorted(r.episode for r in seen) == [0, 1, 2]
    assert report.num_envs == 2 and report.actions_per_chunk == 3 and report.max_steps == 7
    assert all(1 <= r.length <= 7 for r in report.episodes)
    assert report.steps == sum(r.length for r in report.episodes)
    assert report.success_rate == pytest.approx(np.mean([r.success for r in report.episodes]))
    assert report.mean_length == pytest.approx(np.mean([r.length for r in report.episodes]))
    # Sparse reward: 1 on the step that succeeds, so an episode's reward says whether it did.
    assert all(r.reward == float(r.success) for r in report.episodes)
    # A chunk serves 3 steps; the two environments ask in one forward pass when both run out.
    per_episode = sum(math.ceil(r.length / 3) for r in report.episodes)
    assert max(math.ceil(r.length / 3) for r in report.episodes) <= report.forward_passes <= per_episode
    assert report.forward_passes < per_episode or report.num_envs == 1
    for record in report.episodes[:2]:
        assert record.video is not None
        video = probe(Path(record.video))
        assert (video.codec, video.height, video.width) == ("h264", 64, 64)
        with av.open(record.video) as container:
            frames = sum(1 for _ in container.decode(video=0))
        assert frames == record.length + 1  # the reset's frame, then one per step
    assert report.episodes[2].video is None


def test_an_episode_does_not_depend_on_how_many_envs_run_it(tiny: object) -> None:
    options = {"episodes": 3, "max_steps": 12, "seed": 4, "actions_per_chunk": 4}
    alone = evaluate_in_env(tiny, DOT_ENV_ID, num_envs=1, **options)  # type: ignore[arg-type]
    batched = evaluate_in_env(tiny, DOT_ENV_ID, num_envs=3, **options)  # type: ignore[arg-type]
    assert [(r.success, r.length) for r in alone.episodes] == [
        (r.success, r.length) for r in batched.episodes
    ]
    assert batched.forward_passes < alone.forward_passes
    # Each environment in a spawned process of its own: the same episodes again.
    spawned = evaluate_in_env(tiny, DOT_ENV_ID, num_envs=3, asynchronous=True, **options)  # type: ignore[arg-type]
    assert [(r.success, r.length) for r in spawned.episodes] == [
        (r.success, r.length) for r in batched.episodes
    ]


def test_a_model_directory_brings_its_cameras_and_stats(tiny: object, tmp_path: Path) -> None:
    """A fine-tune's output names the cameras it reads and holds its norm_stats.json; a work
    directory's output/ is found too. A camera the environment lacks is refused by name."""
    model = tmp_path / "job" / "output"
    stats = DotTask(colours=("orange",)).expert_norm_stats(episodes=8)
    features = RobotFeatures(
        {"observation.images.wrist": (64, 64), "observation.images.top": (64, 64)}, state_dim=2, action_dim=2
    )
    tiny.save_pretrained(model, features)  # type: ignore[attr-defined]
    (model / "norm_stats.json").write_text(stats.to_json())
    report = evaluate_in_env(
        tmp_path / "job", DOT_ENV_ID, episodes=1, max_steps=3, env_options={"colours": ["orange"]}
    )
    assert report.model == str(tmp_path / "job") and report.episodes[0].length <= 3
    with pytest.raises(ConfigError, match=r"reads camera observation.images.wrist, which .* not give"):
        evaluate_in_env(
            model,
            DOT_ENV_ID,
            episodes=1,
            max_steps=3,
            env_options={"cameras": {"observation.images.top": [64, 64]}},
        )
    with pytest.raises(ConfigError, match=r"state .* is 3 wide; the model's stats are 2 wide"):
        evaluate_in_env(model, DOT_ENV_ID, episodes=1, max_steps=3, env_options={"state_dim": 3})


def test_bad_options_are_refused_naming_the_option(tiny: object) -> None:
    with pytest.raises(ConfigError, match=r"bad episodes: 0 \(must be an integer from 1"):
        evaluate_in_env(tiny, DOT_ENV_ID, episodes=0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="actions_per_chunk must be 1 to the model's action horizon"):
        evaluate_in_env(tiny, DOT_ENV_ID, episodes=1, actions_per_chunk=11)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no Gymnasium environment 'nope/Nothing-v0'"):
        evaluate_in_env(tiny, "nope/Nothing-v0", episodes=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="bad option"):
        evaluate_in_env(tiny, DOT_ENV_ID, episodes=1, env_options={"colour": "red"})  # type: ignore[arg-type]


def test_relay_eval_prints_a_table_and_json(tmp_path: Path) -> None:
    args = ["eval", "pi05-tiny", "--env", DOT_ENV_ID, "--episodes", "2", "--max-steps", "4", "--seed", "3"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report) >= {"success_rate", "mean_reward", "mean_length", "episodes", "seconds"}
    assert [e["seed"] for e in report["episodes"]] == [3, 4]
    result = runner.invoke(
        app, [*args, "--videos", str(tmp_path / "v"), "--env-option", 'colours=["orange"]']
    )
    assert result.exit_code == 0, result.output
    assert "success rate" in result.stdout and "episode_0000.mp4" in result.stdout.replace("\n", "")
    result = runner.invoke(app, ["eval", "pi05-tiny", "--env", "nope/Nothing-v0", "--episodes", "1"])
    assert result.exit_code == 1 and "no Gymnasium environment 'nope/Nothing-v0'" in result.output
    result = runner.invoke(app, ["eval", "rt-j-tiny", "--env", DOT_ENV_ID, "--episodes", "1"])
    assert result.exit_code == 1 and "only robot policies act on observations" in result.output


def test_the_policy_reads_each_episodes_prompt_from_the_env(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts: list[str] = []
    collate = tiny.collate

    def seen(samples: list[dict[str, Any]], **kwargs: Any) -> Any:
        prompts.extend(sample["prompt"] for sample in samples)
        return collate(samples, **kwargs)

    monkeypatch.setattr(tiny, "collate", seen)
    options: dict[str, Any] = {
        "episodes": 6,
        "max_steps": 2,
        "num_envs": 3,
        "env_options": {"colours": "orange,red"},
    }
    evaluate_in_env(tiny, DOT_ENV_ID, **options)
    assert set(prompts) == {"move to the orange dot", "move to the red dot"}
    prompts.clear()
    evaluate_in_env(tiny, DOT_ENV_ID, prompt="move to the blue dot", **options)  # the caller's wins
    assert set(prompts) == {"move to the blue dot"}


def test_the_blind_policy_acts_out_the_training_frames_mean_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = open_dataset(
        str(write_synthetic_dataset(tmp_path / "dots", episodes=4, episode_length=(6, 9), seed=3))
    )
    blind = BlindPolicy.from_dataset(dataset)
    # The mean over every frame's chunk, step by step, of the steps before its episode's end.
    chunks = [dataset.action_chunk(frame) for frame in range(len(dataset))]
    actions = np.stack([chunk for chunk, _ in chunks])
    real = np.stack([~is_pad for _, is_pad in chunks]).astype(np.float64)[..., None]
    expected = (actions * real).sum(0) / np.maximum(real.sum(0), 1)  # steps no episode reaches: 0
    np.testing.assert_allclose(blind.chunk.numpy(), expected, atol=1e-6)
    first_two = BlindPolicy.from_dataset(dataset, episodes=[0, 1]).chunk.numpy()
    assert not np.allclose(first_two, blind.chunk.numpy())

    executed: list[np.ndarray] = []
    step = DotEnv.step

    def recording(env: DotEnv, action: np.ndarray) -> Any:
        executed.append(np.asarray(action, dtype=np.float64).copy())
        return step(env, action)

    monkeypatch.setattr(DotEnv, "step", recording)
    report = evaluate_in_env(
        blind, DOT_ENV_ID, episodes=3, max_steps=6, actions_per_chunk=3, num_envs=1, seed=20
    )
    assert report.model == "blind"
    # Whatever each episode shows it, it is given the chunk's first 3 steps in raw units, again and again.
    raw = dataset.norm_stats.unnormalize_actions(blind.chunk.numpy()[None])[0, :3, :2]
    for episode in report.episodes:
        assert episode.length >= 1
    per_step = np.concatenate([raw] * 2)
    offset = 0
    for episode in report.episodes:
        np.testing.assert_allclose(
            np.stack(executed[offset : offset + episode.length]), per_step[: episode.length], atol=1e-5
        )
        offset += episode.length


def test_a_stop_ends_an_evaluation_between_two_steps(tiny: object, tmp_path: Path) -> None:
    """A job's cancel reaches its evaluation within a step, however many episodes it has left."""
    from relay_engine.envs import EvaluationStopped

    asked = 0

    def stop_on_the_fifth_question() -> bool:
        nonlocal asked
        asked += 1
        return asked >= 5

    videos = tmp_path / "videos"
    # Four steps of the default 8 environments, then the fifth question stops it.
    with pytest.raises(EvaluationStopped, match="stopped after 32 environment steps"):
        evaluate_in_env(
            tiny,  # type: ignore[arg-type]
            DOT_ENV_ID,
            episodes=1000,
            max_steps=100,
            videos=videos,
            video_episodes=1,
            should_stop=stop_on_the_fifth_question,
        )
    assert asked == 5
    assert [p.name for p in videos.iterdir()] == ["episode_0000.mp4"]  # closed, readable
    assert probe(videos / "episode_0000.mp4") is not None


def test_the_job_envs_limits_are_their_registrations() -> None:
    """The SDK budgets an eval block whose max_steps is null with these."""
    import gymnasium

    from relay.env_evaluation import JOB_ENV_STEP_LIMITS, JOB_ENVS

    assert set(JOB_ENV_STEP_LIMITS) == set(JOB_ENVS)
    pytest.importorskip("gym_pusht")  # registers gym_pusht/PushT-v0 (the dev extras install it)
    for env_id, limit in JOB_ENV_STEP_LIMITS.items():
        assert gymnasium.spec(env_id).max_episode_steps == limit, env_id


def test_a_seed_past_its_bound_is_refused(tiny: object) -> None:
    with pytest.raises(ConfigError, match=r"bad seed: 2147483648 \(must be an integer from 0 to 2147483647"):
        evaluate_in_env(tiny, DOT_ENV_ID, episodes=1, seed=2**31)  # type: ignore[arg-type]
