"""A recipe's validation split on pi05-tiny: held-out frames never reach the training sampler, they
are scored after each checkpoint with figures that repeat, the scoring leaves training as it was,
and the figures are `relay local eval`'s on the output."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from relay.events import CHUNKS_PER_FRAME, CheckpointEvent, MetricsEvent, ValidationEvent
from relay.sft.config import SFTConfig
from relay_engine import Trainer, TrainingArguments
from relay_engine.datasets import LeRobotDataset, open_dataset, write_synthetic_dataset
from relay_engine.errors import ConfigError
from relay_engine.families import family_named
from relay_engine.families import robot_validation as validation
from relay_engine.families.base import EvaluationRequest
from relay_engine.families.pi05.evaluate import flow_loss
from relay_engine.models import load_policy
from relay_engine.recipe import Recipe, run_recipe

# A dataset of its own, small enough that two runs of more than an epoch take seconds: 5 episodes of
# 6 to 8 frames; episode 2 is held out.
HELD_OUT = [2]
BATCH_SIZE = 8


@dataclass
class FrameReads:
    """Every frame LeRobotDataset.__getitem__ reads, split by whether the validator was scoring."""

    training: list[int] = field(default_factory=list)
    scoring: list[int] = field(default_factory=list)
    in_validator: bool = False


@dataclass(frozen=True)
class Runs:
    """One run with the split (its frame reads recorded) and one that trains on the other episodes."""

    dataset: LeRobotDataset
    steps: int
    scored: list[Any]
    plain: list[Any]
    reads: FrameReads
    output: Path


def recipe_for(dataset: Path, **changes: Any) -> Recipe:
    config: dict[str, Any] = dict(
        model="pi05-tiny", dataset_name=str(dataset), batch_size=BATCH_SIZE, learning_rate=1e-3, steps=4
    )
    engine: dict[str, Any] = dict(checkpoint_every=2, log_every=1, num_workers=0)
    for name, value in changes.items():
        (config if name in SFTConfig.model_fields else engine)[name] = value
    return Recipe.from_config(SFTConfig(**config), **engine)


def run(recipe: Recipe, work_dir: Path, cache: Path) -> list[Any]:
    events: list[Any] = []
    run_recipe(recipe, work_dir, on_event=events.append, should_stop=lambda: False, dataset_cache_dir=cache)
    return events


def held_out_frames(dataset: LeRobotDataset, episodes: list[int]) -> set[int]:
    return {int(i) for i in dataset.indices_of_episodes(episodes)}


@pytest.fixture(scope="module")
def small_dataset_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("small") / "dataset", episodes=5, episode_length=(6, 8), seed=4
    )


@pytest.fixture(scope="module")
def runs(small_dataset_path: Path, dataset_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("validation")
    dataset = open_dataset(str(small_dataset_path), cache_dir=dataset_cache)
    others = sorted(set(dataset.episodes.tolist()) - set(HELD_OUT))
    training = len(dataset) - len(held_out_frames(dataset, HELD_OUT))
    # More than an epoch of the training frames (so every one is read), checkpoints halfway and at the end.
    steps = 2 * math.ceil((math.ceil(training / BATCH_SIZE) + 1) / 2)
    reads = FrameReads()
    read, score = LeRobotDataset.__getitem__, validation.Validator.__call__

    def recorded_read(self: LeRobotDataset, frame: int) -> Any:
        (reads.scoring if reads.in_validator else reads.training).append(int(frame))
        return read(self, frame)

    def recorded_score(self: validation.Validator, step: int) -> ValidationEvent:
        reads.in_validator = True
        try:
            return score(self, step)
        finally:
            reads.in_validator = False

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LeRobotDataset, "__getitem__", recorded_read)
        patch.setattr(validation.Validator, "__call__", recorded_score)
        recipe = recipe_for(
            small_dataset_path, validation_episodes=HELD_OUT, steps=steps, checkpoint_every=steps // 2
        )
        scored = run(recipe, root / "scored", dataset_cache)
    plain_recipe = recipe_for(small_dataset_path, episodes=others, steps=steps, checkpoint_every=steps // 2)
    plain = run(plain_recipe, root / "plain", dataset_cache)
    return Runs(dataset, steps, scored, plain, reads, root / "scored" / "output")


def test_the_training_sampler_never_reads_a_held_out_frame(runs: Runs) -> None:
    held = held_out_frames(runs.dataset, HELD_OUT)
    training = set(range(len(runs.dataset))) - held
    assert runs.reads.training and not held & set(runs.reads.training)
    assert set(runs.reads.training) == training  # more than an epoch: every training frame
    # The validator read the held-out frames, all of them (fewer than 256), and nothing else.
    assert set(runs.reads.scoring) == held


def test_each_checkpoint_is_followed_by_scores_that_local_eval_gives_again(
    runs: Runs, small_dataset_path: Path
) -> None:
    half = runs.steps // 2
    kinds = [(e.step, e.kind) for e in runs.scored if e.kind in ("checkpoint", "validation")]
    assert kinds == [
        (half, "checkpoint"),
        (half, "validation"),
        (runs.steps, "checkpoint"),
        (runs.steps, "validation"),
    ]
    # Each wait between steps is announced first (progress lines say it while it lasts).
    stages = [(e.step, e.stage) for e in runs.scored if e.kind == "stage"]
    assert stages == [(half, "validating"), (runs.steps, "validating"), (runs.steps, "writing")]
    scores = [e for e in runs.scored if isinstance(e, ValidationEvent)]
    frames = len(held_out_frames(runs.dataset, HELD_OUT))
    for event in scores:
        assert event.frames == frames and event.episodes == 1 and event.seconds > 0
        figures = (event.validation_loss, event.mean_action_mse, event.action_spread, event.action_mse)
        assert all(math.isfinite(v) and v > 0 for v in (*figures, event.blind_mse))
        # The headline is the mean of the chunks; one chunk's error is the mean's plus the spread.
        assert event.chunks == CHUNKS_PER_FRAME
        assert event.action_mse == pytest.approx(event.mean_action_mse + event.action_spread, rel=1e-6)
        assert event.mean_action_mse < event.action_mse
    # The blind baseline does not train: one figure for the run. The policy does: its scores move.
    assert scores[0].blind_mse == scores[1].blind_mse
    assert scores[0].mean_action_mse != scores[1].mean_action_mse
    assert scores[0].validation_loss != scores[1].validation_loss

    # The end's scores, again from the output with the same seed: `relay local eval` on the held-out
    # episodes against the blind baseline of the others (pi05-tiny trains every weight: nothing to
    # merge), and the validation loss. The same weights and seed give the same figures.
    others = sorted(set(runs.dataset.episodes.tolist()) - set(HELD_OUT))
    request = EvaluationRequest(
        model=str(runs.output),
        dataset=str(small_dataset_path),
        episodes=HELD_OUT,
        blind_from=others,
        device="cpu",
    )
    report = family_named("pi05").evaluate(request)
    assert report["frames"] == frames and report["chunks"] == CHUNKS_PER_FRAME
    assert report["mean_action_mse"] == pytest.approx(scores[-1].mean_action_mse, rel=1e-4)
    assert report["action_spread"] == pytest.approx(scores[-1].action_spread, rel=1e-4)
    assert report["mse"] == pytest.approx(scores[-1].action_mse, rel=1e-4)
    assert report["blind_mse"] == pytest.approx(scores[-1].blind_mse, rel=1e-6)
    held = sorted(held_out_frames(runs.dataset, HELD_OUT))
    loss = flow_loss(load_policy(str(runs.output)), runs.dataset, held, seed=0)
    assert loss == pytest.approx(scores[-1].validation_loss, rel=1e-4)


def test_scoring_leaves_training_as_it_was(runs: Runs) -> None:
    # Holding episode 2 out trains on the same frames as training on the others only; the scoring
    # between steps (eval mode, its own noise) must not change a single training loss.
    losses = lambda events: [e.loss for e in events if isinstance(e, MetricsEvent)]  # noqa: E731
    assert len(losses(runs.plain)) == runs.steps
    assert losses(runs.scored) == pytest.approx(losses(runs.plain), abs=1e-6)
    assert not any(isinstance(e, ValidationEvent) for e in runs.plain)
    assert [e.step for e in runs.scored if isinstance(e, CheckpointEvent)] == [runs.steps // 2, runs.steps]


def test_a_fraction_holds_out_episodes_chosen_from_the_seed(synthetic_dataset: LeRobotDataset) -> None:
    split = validation.split_frames(synthetic_dataset, None, 0.25, seed=0)
    again = validation.split_frames(synthetic_dataset, None, 0.25, seed=0)
    assert split.held_out_episodes == again.held_out_episodes
    assert len(split.held_out_episodes) == 2  # a quarter of 8
    held = held_out_frames(synthetic_dataset, split.held_out_episodes)
    assert set(split.training.tolist()) == set(range(len(synthetic_dataset))) - held
    assert set(split.scored.tolist()) == held
    # With --episodes, the fraction is of those episodes.
    limited = validation.split_frames(synthetic_dataset, [0, 1, 2, 3], 0.5, seed=0)
    assert set(limited.held_out_episodes) < {0, 1, 2, 3} and len(limited.held_out_episodes) == 2


def test_at_most_256_frames_are_scored_evenly_spaced() -> None:
    frames = np.arange(1000, 2000)
    chosen = validation.evenly_spaced(frames, 256)
    assert len(chosen) == 256 == len(set(chosen.tolist()))
    assert chosen[0] == 1000 and chosen[-1] == 1999
    gaps = np.diff(chosen)
    assert gaps.min() >= 3 and gaps.max() <= 4
    assert validation.evenly_spaced(frames[:10], 256).tolist() == frames[:10].tolist()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([99], "bad validation_episodes: [99] (the dataset has no episode 99; its episodes are 0 to 7)"),
        ("0-7", 'bad validation_episodes: "0-7" (it holds out every one of the 8 training episodes'),
    ],
)
def test_episodes_the_dataset_cannot_give_are_refused_before_training_naming_the_field(
    synthetic_dataset_path: Path, dataset_cache: Path, tmp_path: Path, spec: object, message: str
) -> None:
    events: list[Any] = []
    with pytest.raises(ConfigError) as caught:
        run_recipe(
            recipe_for(synthetic_dataset_path, validation_episodes=spec),
            tmp_path,
            on_event=events.append,
            should_stop=lambda: False,
            dataset_cache_dir=dataset_cache,
        )
    assert str(caught.value).startswith(message) and caught.value.param == "validation_episodes"
    assert not any(isinstance(e, MetricsEvent) for e in events)


def test_the_local_trainer_scores_after_each_epoch_and_returns_the_ends_scores(
    small_dataset_path: Path, dataset_cache: Path, tmp_path: Path
) -> None:
    dataset = open_dataset(str(small_dataset_path), cache_dir=dataset_cache)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=2,
        per_device_train_batch_size=BATCH_SIZE,
        learning_rate=1e-3,
        validation_episodes="1-3",  # two episodes left to train on: two short epochs
        disable_tqdm=True,
    )
    trainer = Trainer(model=load_policy("pi05-tiny"), args=args, train_dataset=dataset)
    held = held_out_frames(dataset, [1, 2, 3])
    assert len(trainer.training_data) == len(dataset) - len(held)
    result = trainer.train()
    scores = [e for e in trainer.events if isinstance(e, ValidationEvent)]
    per_epoch = math.ceil(len(trainer.training_data) / BATCH_SIZE)
    assert [e.step for e in scores] == [per_epoch, 2 * per_epoch] == [per_epoch, result["steps"]]
    assert result["validation_mean_action_mse"] == scores[-1].mean_action_mse
    assert result["validation_action_spread"] == scores[-1].action_spread
    assert result["validation_action_mse"] == scores[-1].action_mse
    assert result["validation_blind_mse"] == scores[-1].blind_mse
    assert result["validation_loss"] == scores[-1].validation_loss

    with pytest.raises(ConfigError, match=r"bad validation_episodes: 1\.5"):
        TrainingArguments(output_dir=str(tmp_path), max_steps=1, validation_episodes=1.5)
    subset = torch.utils.data.Subset(dataset, range(10))
    with pytest.raises(ConfigError, match="must then be a whole LeRobot dataset"):
        Trainer(model=load_policy("pi05-tiny"), args=args, train_dataset=subset)


def relay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay.cli", *args], capture_output=True, text=True, timeout=600
    )


def test_relay_local_train_takes_validation_episodes_and_shows_the_scores(
    small_dataset_path: Path, tmp_path: Path
) -> None:
    common = ["local", "train", "--model", "pi05-tiny", "--dataset", str(small_dataset_path)]
    common += ["--output-dir", str(tmp_path), "--steps", "2", "--batch-size", "4", "--checkpoint-every", "1"]
    done = relay(*common, "--validation-episodes", "0.2", "--json")  # a fifth of 5: one episode
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    scored = [line for line in lines if line.get("event") == "validation"]
    assert [line["step"] for line in scored] == [1, 2] and all(line["episodes"] == 1 for line in scored)
    assert lines[-1]["status"] == "completed" and lines[-1]["validation"] == scored[-1]

    refused = relay(*common, "--validation-episodes", "9-0")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert 'bad validation_episodes: "9-0" (the range 9-0 runs backwards' in refused.stderr
