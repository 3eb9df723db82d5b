"""pi05-tiny at its own defaults on data nobody tuned them to: a sweep over seeds and dataset shapes.

Not a test. For each shape and seed it writes `relay datasets synth`'s dataset of that shape and
seed, fine-tunes pi05-tiny with a recipe that names only the model, the dataset and the steps (so
its finetune, learning rate and batch size are pi05-tiny's defaults, catalog/families'
model_defaults) on the first 90% of the episodes, through the engine's recipe runner, and scores the
last 10% (held out; the tasks take turns, so every task is held out alike):

- tuned: the held-out error of the mean of 4 sampled chunks per frame (`mean_mse`, the headline of
  `relay local eval --chunks 4`);
- blind: the error of the training frames' mean chunk (`relay local eval --blind-from`);
- blind/tuned: how many times better than blind the tuned model is (above 1 beats blind), and
  tuned/blind, the same as a fraction of the blind error.

Then, per shape, the median and the worst (lowest) blind/tuned over the seeds. Shapes:

- one:  `relay datasets synth D --episodes N --colour orange --seed S` (the colour the shipped base
        never saw);
- two:  `relay datasets synth D --episodes N --colour orange --colour blue --seed S` (two tasks:
        both dots in every frame, the prompt names the target).

    python bench/bench_tiny_defaults.py                       # seeds 101-105, both shapes, 1,000 steps
    python bench/bench_tiny_defaults.py --episodes 50 --steps 300
    python bench/bench_tiny_defaults.py --learning-rate 1e-3  # another setting than the defaults
    python bench/bench_tiny_defaults.py --base /tmp/tiny      # a pretrain_tiny.py --out base

Every run is on one torch thread by default (--threads): seeded runs repeat only at a fixed
thread count; --jobs N runs N of them at once, each in a process of its own (the same figures,
sooner where there are cores to spare). Datasets are kept under --work (a second sweep reuses
them).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from relay.sft.config import SFTConfig
from relay_engine.datasets import open_dataset, write_synthetic_dataset
from relay_engine.families.robot_scores import blind_baseline, evaluate_actions
from relay_engine.models import load_policy, weights
from relay_engine.recipe import Recipe, run_recipe

SHAPES = {"one": ["orange"], "two": ["orange", "blue"]}
CHUNKS = 4


def run_one(shape: str, seed: int, args: argparse.Namespace, work: Path) -> dict[str, float | int | str]:
    torch.set_num_threads(args.threads)
    if args.base is not None:
        # load_policy("pi05-tiny") reads the base from here; the recipe still names pi05-tiny, so
        # its defaults are pi05-tiny's.
        weights.TINY_BASE_DIR = args.base.resolve()
    dataset_path = work / f"synth-{shape}-{args.episodes}-s{seed}"
    if not (dataset_path / "meta/info.json").is_file():
        write_synthetic_dataset(
            dataset_path, episodes=args.episodes, colours=SHAPES[shape], seed=seed, overwrite=True
        )
    held = max(1, round(args.episodes * 0.1))
    train_episodes = list(range(args.episodes - held))
    held_out_episodes = list(range(args.episodes - held, args.episodes))
    overrides = {
        k: v
        for k, v in (("learning_rate", args.learning_rate), ("batch_size", args.batch_size))
        if v is not None
    }
    config = SFTConfig(model="pi05-tiny", dataset_name=str(dataset_path), steps=args.steps, **overrides)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="relay-tiny-run-") as tmp:
        root = Path(tmp)
        recipe = Recipe.from_config(config, episodes=train_episodes, num_workers=0)
        result = run_recipe(
            recipe,
            root / "run",
            on_event=lambda e: None,
            should_stop=lambda: False,
            dataset_cache_dir=work / "cache",
        )
        trained = time.monotonic() - started
        dataset = open_dataset(config.dataset_name, cache_dir=work / "cache")
        train = dataset.indices_of_episodes(train_episodes).tolist()
        held_out = dataset.indices_of_episodes(held_out_episodes).tolist()
        blind = blind_baseline(dataset, train, dataset, held_out).mse
        scores = evaluate_actions(load_policy(str(result.output_dir)), dataset, held_out, chunks=CHUNKS)
    return {
        "shape": shape,
        "seed": seed,
        "blind": blind,
        "tuned": scores.mean_mse,
        "spread": scores.spread,
        "ratio": blind / scores.mean_mse,
        "settings": f"{config.finetune} lr {config.learning_rate:g} batch {config.batch_size}",
        "train_s": trained,
        "total_s": time.monotonic() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--episodes", type=int, default=200, help="episodes per dataset (10%% held out)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[101, 102, 103, 104, 105])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    parser.add_argument("--learning-rate", type=float, default=None, help="[pi05-tiny's default]")
    parser.add_argument("--batch-size", type=int, default=None, help="[pi05-tiny's default]")
    parser.add_argument(
        "--base", type=Path, default=None, help="a pi05-tiny base directory [the shipped one]"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs at once, each in a process of its own (--threads each)"
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "relay-bench-tiny")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.base is not None:
        weights.TINY_BASE_DIR = args.base.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    print("$ python " + shlex.join(sys.argv), flush=True)
    print(f"base: {weights.TINY_BASE_DIR}; torch {torch.__version__}, {args.threads} thread(s)", flush=True)
    print(
        f"{'shape':5s} {'seed':>4s} {'blind':>7s} {'tuned':>7s} {'spread':>7s} {'blind/tuned':>11s} "
        f"{'tuned/blind':>11s} {'time':>6s}  settings",
        flush=True,
    )
    plan = [(shape, seed) for shape in args.shapes for seed in args.seeds]
    with concurrent.futures.ProcessPoolExecutor(
        args.jobs, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        futures = [pool.submit(run_one, shape, seed, args, args.work) for shape, seed in plan]
        runs = []
        for future in futures:  # in the plan's order, each printed when it and those before it end
            run = future.result()
            runs.append(run)
            print(
                f"{run['shape']:5s} {run['seed']:4d} {run['blind']:7.4f} {run['tuned']:7.4f} "
                f"{run['spread']:7.4f} {run['ratio']:10.2f}x {1 / float(run['ratio']):10.2f}x "
                f"{run['total_s']:5.0f}s  {run['settings']}",
                flush=True,
            )
    print(
        f"{'shape':5s} {'median blind/tuned':>18s} {'worst blind/tuned':>17s}  (tuned/blind: median, worst)"
    )
    for shape in args.shapes:
        ratios = [float(r["ratio"]) for r in runs if r["shape"] == shape]
        median, worst = statistics.median(ratios), min(ratios)
        print(f"{shape:5s} {median:17.2f}x {worst:16.2f}x  ({1 / median:.2f}x, {1 / worst:.2f}x)")


if __name__ == "__main__":
    main()
