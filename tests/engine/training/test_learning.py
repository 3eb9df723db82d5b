"""Proof that fine-tuning learns: the shipped pi05-tiny base, fine-tuned on a task variant it never
saw (the orange dot; orange is held out of its pretraining), against the blind baseline (always
the training frames' mean chunk) and the base before tuning, on held-out episodes.

The demo runs the full-size version (examples/demo.py: 1,500 steps on 400 episodes, 3.4x better
than blind); this one is shorter and seeded: 800 steps on 160 episodes, both cameras, every weight
at 2e-3 (named, not the default). It checks that the tuned model beats both the base and the blind
baseline on episodes it never trained on. Its dataset is what users bring: LeRobot v3.0 with the
cameras as H.264 video, written by `relay datasets synth --format v3.0 --video` (lossy, so the
pixels differ a little from the v2.1 PNGs of the same seed). Measured (one thread, torch 2.13.0
CPU; the same on main before issue 27's sweep, whose docstring still said tuned 0.0188): blind
0.0294, base 0.0352, tuned 0.0158 (1.86x better than blind; 0.0171 before issue 32 rounded the
resized images to uint8).

The second test is the bar for pi05-tiny's own defaults (relay.families' model_defaults): a recipe
that names nothing but the model, the dataset and 1,000 steps, on `relay datasets synth --episodes
200 --colour orange` at the natural seed, 0 (the last 20 episodes held out), must end at most
0.7x the blind baseline's held-out error, scored as validation's headline (the error of each
frame's mean of 4 sampled chunks). The bar is not set from seed 0 but from seeds nobody tuned to:
`python bench/bench_tiny_defaults.py --jobs 3` (its shape "one" is this dataset at seeds 101 to
105) measured 0.37x, 0.53x, 0.48x, 0.39x and 0.35x tuned/blind at the default, 1e-3 (0.45x, 0.56x,
0.47x, 0.33x and 0.37x at 2e-3, the default before that sweep); seed 0, this test, 0.43x (blind
0.0247, tuned 0.0107; the bench's `--shapes one --seeds 0` prints the same; 0.49x at 2e-3). The
bar, 0.7x, is above every seed measured. An earlier version ran at
`--seed 1` because its bar (0.6x, one chunk a frame, the red-dot dataset) failed at seed 0 (0.60x).

Both run on one torch thread: seeded runs repeat only at a fixed thread count (matmuls split
across threads round differently), and one thread is also the quickest on a shared 2-core machine.
Nothing here is timed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay.sft.config import SFTConfig
from relay_engine.datasets import open_dataset, write_synthetic_dataset
from relay_engine.families.robot_scores import blind_baseline, evaluate_actions
from relay_engine.models import load_policy
from relay_engine.recipe import Recipe, run_recipe

TRAIN_EPISODES = list(range(160))
HELD_OUT_EPISODES = list(range(160, 180))
STEPS = 800

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def train_and_score(
    config: SFTConfig,
    train_episodes: list[int],
    held_out_episodes: list[int],
    root: Path,
    *,
    chunks: int = 1,
    base: bool = True,
) -> dict[str, float]:
    """Held-out action MSE of the blind baseline, the base (unless not `base`) and the tuned model,
    as `relay local eval --blind-from --chunks N` computes them: the policies' is the error of
    each frame's mean of `chunks` sampled chunks (with one chunk, that chunk's error)."""
    recipe = Recipe.from_config(config, episodes=train_episodes, num_workers=0)
    result = run_recipe(
        recipe,
        root / "run",
        on_event=lambda e: None,
        should_stop=lambda: False,
        dataset_cache_dir=root / "cache",
    )
    dataset = open_dataset(config.dataset_name, cache_dir=root / "cache")
    train = dataset.indices_of_episodes(train_episodes).tolist()
    held_out = dataset.indices_of_episodes(held_out_episodes).tolist()
    scores = {"blind": blind_baseline(dataset, train, dataset, held_out).mse}
    if base:
        scores["base"] = evaluate_actions(
            load_policy(config.model), dataset, held_out, chunks=chunks
        ).mean_mse
    tuned = load_policy(str(result.output_dir))
    scores["tuned"] = evaluate_actions(tuned, dataset, held_out, chunks=chunks).mean_mse
    print("held-out action MSE: " + ", ".join(f"{name} {mse:.4f}" for name, mse in scores.items()))
    return scores


def test_fine_tuning_the_base_on_an_unseen_task_in_v30_video_beats_the_base_and_the_blind_baseline(
    tmp_path: Path,
) -> None:
    dataset_path = tmp_path / "orange"
    written = CliRunner().invoke(
        app,
        [
            *(
                "datasets",
                "synth",
                str(dataset_path),
                "--episodes",
                str(len(TRAIN_EPISODES) + len(HELD_OUT_EPISODES)),
            ),
            *("--length", "20-30", "--colour", "orange", "--seed", "0", "--format", "v3.0", "--video"),
        ],
    )
    assert written.exit_code == 0, written.output
    info = json.loads((dataset_path / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert [f["dtype"] for k, f in info["features"].items() if k.startswith("observation.images.")] == [
        "video",
        "video",
    ]
    config = SFTConfig(
        model="pi05-tiny",
        dataset_name=str(dataset_path),
        finetune="full",
        batch_size=16,
        learning_rate=2e-3,
        steps=STEPS,
    )
    # One chunk a frame, the sampling these bars and the figures above were measured with (the
    # mean of several chunks, validation's headline, reads lower: the bar would be easier).
    scores = train_and_score(config, TRAIN_EPISODES, HELD_OUT_EPISODES, tmp_path, chunks=1)
    tuned, base, blind = scores["tuned"], scores["base"], scores["blind"]
    assert tuned < base
    assert tuned < blind, f"tuned {tuned:.4f} does not beat the blind baseline {blind:.4f}"


def test_pi05_tiny_at_its_own_defaults_ends_at_most_0_7x_of_the_blind_error(tmp_path: Path) -> None:
    # `relay datasets synth ./d --episodes 200 --colour orange` at the natural seed, 0: the shape
    # "one" of bench/bench_tiny_defaults.py, whose last 20 episodes are held out. Only the model,
    # the dataset and the steps are given. Scored as validation's headline: the mean of 4 chunks.
    dataset_path = write_synthetic_dataset(tmp_path / "synth", episodes=200, colours=["orange"], seed=0)
    config = SFTConfig(model="pi05-tiny", dataset_name=str(dataset_path), steps=1000)
    assert (config.finetune, config.learning_rate, config.batch_size) == ("full", 1e-3, 16)
    scores = train_and_score(config, list(range(180)), list(range(180, 200)), tmp_path, chunks=4, base=False)
    # Measured (1 thread, torch 2.13.0 CPU; bench/bench_tiny_defaults.py at the same settings): see
    # the module's docstring. The bar holds on every seed measured, seed 0 included.
    assert scores["tuned"] <= 0.7 * scores["blind"], scores
