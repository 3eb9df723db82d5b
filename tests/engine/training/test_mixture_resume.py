"""A mixture recipe stopped after a checkpoint and resumed reads exactly what an uninterrupted one
would (docs/datasets.md, "Training on a mixture"): the same samples of each dataset in the same
order, hence the same loss at every step, the same validation figures of each dataset and the same
output weights. The method is test_recipe.py's single-dataset resume test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from relay.events import DatasetEvent, RecipeResult, ResumedEvent, ValidationEvent
from relay.sft.config import SFTConfig
from relay_engine.datasets import write_synthetic_dataset
from relay_engine.datasets.mixture import WeightedFrames
from relay_engine.recipe import Recipe, run_recipe

STEPS = 8
BATCH = 4
CHECKPOINT_EVERY = 3
CAMERAS = {"observation.images.top": (32, 32), "observation.images.wrist": (32, 32)}

# Tiny tensors on a shared 2-core machine: one torch thread is faster (tests/engine/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("mixture-resume")
    image = write_synthetic_dataset(root / "image", episodes=3, episode_length=6, cameras=CAMERAS, seed=4)
    other = write_synthetic_dataset(
        root / "other", episodes=3, episode_length=6, cameras=CAMERAS, format="v3.0", seed=5
    )
    return image, other


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """Every training sample the mixture gives, as (dataset, frame), in the order it is read."""
    seen: list[tuple[int, int]] = []
    original = WeightedFrames.__getitem__

    def spy(self: WeightedFrames, index: int) -> Any:
        seen.append((int(self.part_of[index]), int(self.frame_of[index])))
        return original(self, index)

    monkeypatch.setattr(WeightedFrames, "__getitem__", spy)
    yield seen


def recipe_for(image: Path, other: Path) -> Recipe:
    config = SFTConfig.parse(
        {
            "model": "pi05-tiny",
            "datasets": [
                {"name": str(image), "weight": 3},
                {"name": str(other), "cameras": {"base_0_rgb": "observation.images.wrist"}},
            ],
            "batch_size": BATCH,
            "learning_rate": 1e-3,
            "steps": STEPS,
            "finetune": "lora",
            "validation_episodes": [0],
        }
    )
    return Recipe.from_config(config, checkpoint_every=CHECKPOINT_EVERY, log_every=1, num_workers=0)


def run(
    recipe: Recipe,
    work_dir: Path,
    cache: Path,
    stop_after: int | None = None,
    checkpoint_on_stop: bool = False,
) -> tuple[RecipeResult, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    metrics = lambda: sum(1 for e in events if "loss" in e)  # noqa: E731
    result = run_recipe(
        recipe,
        work_dir,
        on_event=events.append,
        should_stop=lambda: stop_after is not None and metrics() >= stop_after,
        dataset_cache_dir=cache,
        checkpoint_on_stop=checkpoint_on_stop,
    )
    return result, events


def losses(events: list[dict[str, Any]]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events if "loss" in e}


def validations(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {e["step"]: e for e in events if isinstance(e, ValidationEvent)}


@pytest.mark.parametrize(
    ("stop_after", "checkpoint_on_stop", "resumed_from"),
    [
        # The last checkpoint before the stop is step 3: steps 4 and 5 are trained again.
        (5, False, CHECKPOINT_EVERY),
        # A local run's Ctrl-C checkpoints where it stopped, in the middle of an epoch.
        (4, True, 4),
    ],
)
def test_a_stopped_and_resumed_mixture_run_matches_an_uninterrupted_one(
    datasets: tuple[Path, Path],
    reads: list[tuple[int, int]],
    tmp_path: Path,
    stop_after: int,
    checkpoint_on_stop: bool,
    resumed_from: int,
) -> None:
    image, other = datasets
    recipe = recipe_for(image, other)
    cache = tmp_path / "cache"

    straight, straight_events = run(recipe, tmp_path / "straight", cache)
    assert straight.status == "completed" and straight.step == STEPS
    straight_reads = list(reads)
    # More than one epoch (2 x 12 training frames, 6 steps an epoch), both datasets in it.
    assert len(straight_reads) >= STEPS * BATCH > 24
    assert {part for part, _ in straight_reads} == {0, 1}

    reads.clear()
    first, first_events = run(recipe, tmp_path / "interrupted", cache, stop_after, checkpoint_on_stop)
    assert first.status == "stopped" and first.step == stop_after
    assert not (tmp_path / "interrupted" / "output").exists()
    # Until the stop, the interrupted run read what the straight one did.
    assert reads[: stop_after * BATCH] == straight_reads[: stop_after * BATCH]

    reads.clear()
    second, second_events = run(recipe, tmp_path / "interrupted", cache)
    assert second.status == "completed" and second.step == STEPS
    assert second.resumed_from == resumed_from
    assert any(isinstance(e, ResumedEvent) and e["step"] == resumed_from for e in second_events)
    # The resumed run reads on from the checkpoint's place in the seeded, weighted order.
    assert reads == straight_reads[resumed_from * BATCH :]

    # It reports the same mixture read (at the step it starts from).
    read_straight = [e for e in straight_events if isinstance(e, DatasetEvent)]
    read_resumed = [e for e in second_events if isinstance(e, DatasetEvent)]
    assert len(read_straight) == len(read_resumed) == 1
    assert read_resumed[0]["step"] == resumed_from
    assert read_resumed[0]["mixture"] == read_straight[0]["mixture"]
    assert [part["share"] for part in read_resumed[0]["mixture"]] == [0.75, 0.25]

    expected = losses(straight_events)
    assert sorted(expected) == list(range(1, STEPS + 1))
    resumed = {**losses(first_events), **losses(second_events)}
    assert min(losses(second_events)) == resumed_from + 1
    for step, loss in expected.items():
        assert resumed[step] == pytest.approx(loss, abs=1e-6), f"step {step}"

    # Each dataset's held-out figures at the steps both runs scored (a checkpoint's and the end's).
    scored_straight = validations(straight_events)
    scored_resumed = {**validations(first_events), **validations(second_events)}
    assert sorted(scored_straight) == [3, 6, 8]
    for step, event in scored_straight.items():
        again = scored_resumed[step]
        assert [p["dataset"] for p in again["datasets"]] == [str(image), str(other)]
        assert again["mean_action_mse"] == pytest.approx(event["mean_action_mse"], abs=1e-6), step
        for ours, theirs in zip(again["datasets"], event["datasets"], strict=True):
            assert ours["frames"] == theirs["frames"]
            assert ours["mean_action_mse"] == pytest.approx(theirs["mean_action_mse"], abs=1e-6), step

    assert straight.output_dir is not None and second.output_dir is not None
    straight_weights = load_file(str(straight.output_dir / "model.safetensors"))
    resumed_weights = load_file(str(second.output_dir / "model.safetensors"))
    assert straight_weights.keys() == resumed_weights.keys()
    for name, tensor in straight_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, atol=1e-6, rtol=0, msg=name)
    assert (straight.output_dir / "norm_stats.json").read_text() == (
        second.output_dir / "norm_stats.json"
    ).read_text()
