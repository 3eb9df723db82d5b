"""What a validation split costs a recipe job: the seconds of one scoring of the held-out frames
(at most 256) against the seconds of one training step, on pi05-tiny, and the share of a run's
time that scoring at every checkpoint adds.

    python bench/bench_validation.py [--episodes 40] [--held-out 8] [--batch-size 16]
                                     [--steps 40] [--checkpoint-every 20]

It writes a synthetic dataset (the demo's shape, smaller), runs the recipe once without a split
and once with one (the same training frames: the split's episodes are left out of the first run
with `episodes`), and prints the figures and ratios (and writes them to
bench/out/bench_validation.json). Figures depend on the machine: quote the ratios.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from relay.events import MetricsEvent, ValidationEvent
from relay.sft.config import SFTConfig
from relay_engine.datasets import write_synthetic_dataset
from relay_engine.recipe import Recipe, run_recipe

ROOT = Path(__file__).resolve().parents[1]


def timed_run(recipe: Recipe, work_dir: Path, cache: Path) -> tuple[float, list[Any]]:
    events: list[Any] = []
    started = time.perf_counter()
    run_recipe(recipe, work_dir, on_event=events.append, should_stop=lambda: False, dataset_cache_dir=cache)
    return time.perf_counter() - started, events


def _steps_per_second(events: list[Any]) -> float:
    rates = [e.steps_per_second for e in events if isinstance(e, MetricsEvent) and e.steps_per_second]
    return sum(rates) / len(rates)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--held-out", type=int, default=8, help="the last N episodes are held out")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    options = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        dataset = write_synthetic_dataset(
            root / "dots", episodes=options.episodes, episode_length=(40, 60), seed=0
        )
        held = list(range(options.episodes - options.held_out, options.episodes))
        training = list(range(options.episodes - options.held_out))
        config = {
            "model": "pi05-tiny",
            "dataset_name": str(dataset),
            "batch_size": options.batch_size,
            "steps": options.steps,
        }
        engine = {"checkpoint_every": options.checkpoint_every, "num_workers": 0}
        plain = Recipe.from_config(SFTConfig(**config), episodes=training, **engine)
        split = Recipe.from_config(SFTConfig(**config, validation_episodes=held), **engine)
        warm = Recipe.from_config(SFTConfig(**{**config, "steps": 2}), episodes=training, **engine)
        timed_run(warm, root / "warm", root / "cache")  # the frame index, and torch warmed up
        without, plain_events = timed_run(plain, root / "plain", root / "cache")
        with_split, events = timed_run(split, root / "split", root / "cache")

    scores = [e for e in events if isinstance(e, ValidationEvent)]
    scoring = sum(e.seconds or 0.0 for e in scores) / len(scores)
    step = without / options.steps
    print(f"torch threads: {torch.get_num_threads()}")
    print(f"held-out frames scored: {scores[0].frames} of {len(held)} episodes; scorings: {len(scores)}")
    print(f"one scoring: {scoring:.2f} s; one training step: {step:.3f} s; ratio {scoring / step:.1f} steps")
    ratio = with_split / without
    # The loop's own speed (its metrics events, scoring excluded): scoring must not slow training.
    speed = {name: _steps_per_second(found) for name, found in (("without", plain_events), ("with", events))}
    print(f"training steps/s without a split: {speed['without']:.3f}; with one: {speed['with']:.3f}")
    print(f"run without a split: {without:.1f} s; with one: {with_split:.1f} s; ratio {ratio:.2f}")
    last = scores[-1]
    print(
        f"last scores: mean_action_mse {last.mean_action_mse:.4f} (mean of {last.chunks} chunks), "
        f"action_spread {last.action_spread:.4f}, action_mse {last.action_mse:.4f} (one chunk), "
        f"blind_mse {last.blind_mse:.4f}, validation_loss {last.validation_loss:.4f}"
    )
    report = {
        "options": vars(options),
        "torch_threads": torch.get_num_threads(),
        "frames_scored": scores[0].frames,
        "scoring_seconds": scoring,
        "step_seconds": step,
        "scoring_in_steps": scoring / step,
        "run_seconds": {"without_split": without, "with_split": with_split},
        "run_ratio": ratio,
        "training_steps_per_second": speed,
        "last_scores": dict(last),
    }
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_validation.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
