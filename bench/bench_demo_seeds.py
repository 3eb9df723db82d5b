"""The demo's fine-tune at several training seeds: how much of a change in the demo's figures is the
change, and how much is the seed.

Not a test. `examples/demo.py` trains one job at the engine's default seed (0), so its held-out
figure is one draw from a spread: the same recipe at another seed learns the same task well or less
well (the batch order, the flow-matching noise and times, and the validation split all follow the
seed). A change that moves the demo's figure is worth a look only if it moves this spread.

For each training seed, this writes the demo's datasets (its task, cameras, episodes and layout,
read from examples/demo.py; `--dataset-seed` picks other episodes of the same task), trains the
demo's recipe in this process through the engine's recipe runner (the seed is the recipe's engine
setting; the API does not offer it), and scores the tuned model as the demo does:

- held-out: the error of the mean of 4 sampled chunks a frame on the held-out episodes, and the
  blind baseline's (the training frames' mean chunk) over it, "x blind";
- closed loop: success and mean steps in relay/Dot-v0 on the demo's 40 new episodes (seed 1000),
  unless --no-closed-loop.

At seed 0 the held-out figure is the demo's own (the same run). Then the median and the range over
the seeds. Runs are sequential on this machine's threads; seeded runs repeat at the same thread
count on the same CPU (another instruction set's kernels round differently, and move a run as a
seed does: compare code on one machine).

    python bench/bench_demo_seeds.py                    # seeds 0-3, about 2 minutes each on 2 cores
    python bench/bench_demo_seeds.py --seeds 0 1 --steps 300 --no-closed-loop

To compare with older code, run this file with that code's packages first on the path (a git
worktree at the commit: PYTHONPATH=WT/sdk:WT/engine:WT/api:WT/worker), on the same machine.
JSON in bench/out/bench_demo_seeds.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def demo_module() -> ModuleType:
    """examples/demo.py, imported for its settings (nothing runs: its main() is behind __main__)."""
    spec = importlib.util.spec_from_file_location("relay_demo", ROOT / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_datasets(demo: ModuleType, work: Path, dataset_seed: int, episodes: int) -> tuple[Path, Path]:
    """The demo's training and held-out datasets (its seeds are 0 and 1; here dataset_seed and
    dataset_seed + 1), written once under `work`."""
    from relay_engine.datasets import write_synthetic_dataset

    task: dict[str, Any] = {
        "colours": ["orange"],
        "cameras": demo.CAMERAS,
        "episode_length": (20, 30),
        **demo.LAYOUT,
    }
    paths = []
    for name, count, seed in (
        ("train", episodes, dataset_seed),
        ("held-out", demo.HELD_OUT_EPISODES, dataset_seed + 1),
    ):
        path = work / f"{name}-{count}-s{seed}"
        if not (path / "meta" / "info.json").is_file():
            write_synthetic_dataset(path, episodes=count, seed=seed, overwrite=True, **task)
        paths.append(path)
    return paths[0], paths[1]


def run_one(
    demo: ModuleType, seed: int, train_dir: Path, held_out_dir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Train the demo's recipe at training seed `seed` and score it as the demo does."""
    from relay.events import CHUNKS_PER_FRAME
    from relay.sft.config import SFTConfig
    from relay_engine.acting import read_norm_stats
    from relay_engine.datasets import open_dataset
    from relay_engine.envs import evaluate_in_env
    from relay_engine.families import family_named
    from relay_engine.families.base import EvaluationRequest
    from relay_engine.families.robot_scores import ActionChunks, blind_baseline, with_norm_stats
    from relay_engine.recipe import Recipe, run_recipe

    config = SFTConfig(
        model="pi05-tiny", dataset_name=str(train_dir), steps=args.steps, name="demo-seeds",
        **demo.RECIPE["pi05-tiny"],
    )  # fmt: skip
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="relay-demo-seeds-") as tmp:
        output = Path(tmp) / "output"
        run_recipe(
            Recipe.from_config(config, seed=seed),
            Path(tmp) / "run",
            on_event=lambda event: None,
            should_stop=lambda: False,
            dataset_cache_dir=args.work / "cache",
            output_dir=output,
        )
        trained = time.monotonic() - started
        method = read_norm_stats(output).method
        train_set = open_dataset(str(train_dir), normalization=method, cache_dir=args.work / "cache")
        held_out = with_norm_stats(
            open_dataset(str(held_out_dir), normalization=method, cache_dir=args.work / "cache"), output
        )
        frames = range(len(held_out))
        blind = blind_baseline(
            ActionChunks(train_set), range(len(train_set)), ActionChunks(held_out), frames
        ).mse
        request = EvaluationRequest(
            model=str(output), dataset=str(held_out_dir), chunks=CHUNKS_PER_FRAME, norm_stats_from=str(output)
        )
        tuned = family_named("pi05").evaluate(request)
        run: dict[str, Any] = {
            "seed": seed,
            "blind": blind,
            "tuned": tuned["mean_action_mse"],
            "x_blind": blind / tuned["mean_action_mse"],
            "train_s": trained,
        }
        if args.closed_loop:
            acted = evaluate_in_env(
                str(output), "relay/Dot-v0", episodes=demo.CLOSED_LOOP_EPISODES, seed=demo.CLOSED_LOOP_SEED,
                env_options={"colours": ["orange"], "cameras": demo.CAMERAS},
            )  # fmt: skip
            run.update(success=acted.success_rate, mean_steps=acted.mean_length)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="training seeds")
    parser.add_argument("--dataset-seed", type=int, default=0, help="the demo's is 0 (held-out: +1)")
    parser.add_argument("--steps", type=int, default=None, help="[the demo's, 1,500]")
    parser.add_argument("--episodes", type=int, default=None, help="training episodes [the demo's, 400]")
    parser.add_argument("--no-closed-loop", dest="closed_loop", action="store_false")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "relay-bench-demo-seeds")
    args = parser.parse_args()
    demo = demo_module()
    args.steps = args.steps or demo.STEPS
    args.work.mkdir(parents=True, exist_ok=True)
    import relay_engine

    print("$ python " + shlex.join(sys.argv), flush=True)
    print(
        f"engine: {Path(relay_engine.__file__).parent}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s); load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    train_dir, held_out_dir = write_datasets(
        demo, args.work, args.dataset_seed, args.episodes or demo.EPISODES
    )
    print(f"{'seed':>4} {'blind':>7} {'tuned':>7} {'x blind':>8} {'success':>8} {'steps':>6} {'train':>6}")
    runs = []
    for seed in args.seeds:
        run = run_one(demo, seed, train_dir, held_out_dir, args)
        runs.append(run)
        acted = (
            f"{run['success']:8.0%} {run['mean_steps']:6.1f}" if args.closed_loop else f"{'-':>8} {'-':>6}"
        )
        print(
            f"{seed:4d} {run['blind']:7.4f} {run['tuned']:7.4f} {run['x_blind']:7.2f}x {acted} "
            f"{run['train_s']:5.0f}s",
            flush=True,
        )
    ratios = [run["x_blind"] for run in runs]
    print(
        f"x blind over {len(runs)} seeds: median {statistics.median(ratios):.2f}x, "
        f"range {min(ratios):.2f}x to {max(ratios):.2f}x; load average {os.getloadavg()[0]:.1f} at the end"
    )
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_demo_seeds.json").write_text(json.dumps({"argv": sys.argv, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
