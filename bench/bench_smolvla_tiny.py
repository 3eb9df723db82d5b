"""Does fine-tuning smolvla-tiny work? The demo's task, measured as the demo measures pi05-tiny.

Not a test. It writes the demo's datasets (examples/demo.py: move to the orange dot, 400 episodes
of a top and a wrist camera at 64x64 as H.264 video, and 40 held-out episodes of their own seed),
fine-tunes the shipped smolvla-tiny base at its own defaults (lerobot's default training: the
action expert and the projections over the frozen, random tiny backbone; 1e-3, 16 a step) through
the engine's recipe runner, once per seed, and scores the held-out episodes in SmolVLA's units
(mean and std, the training episodes', as each tuned model's norm_stats.json holds them): the
error of the mean of 4 chunks sampled per frame, one chunk's error, their spread, beside the blind
baseline (always the training frames' mean chunk) and the base before
tuning; then, as the demo does, each tuned policy in closed loop in relay/Dot-v0 (40 new
episodes, seed 1000: success is reaching the orange dot within 50 steps) beside the blind baseline.

    python bench/bench_smolvla_tiny.py                 # seeds 0 1 2, 1,500 steps
    python bench/bench_smolvla_tiny.py --steps 500 --seeds 0
    python bench/bench_smolvla_tiny.py --finetune lora  # LoRA where lerobot puts it, rank 32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from demo import CAMERAS, CLOSED_LOOP_EPISODES, CLOSED_LOOP_SEED, EPISODES, HELD_OUT_EPISODES, LAYOUT

from relay.events import CHUNKS_PER_FRAME
from relay.sft.config import SFTConfig
from relay_engine.datasets import open_dataset, write_synthetic_dataset
from relay_engine.envs import evaluate_in_env
from relay_engine.families import family_named
from relay_engine.families.base import EvaluationRequest
from relay_engine.families.robot_scores import ActionChunks, BlindPolicy, blind_baseline, with_norm_stats
from relay_engine.recipe import Recipe, run_recipe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--finetune", choices=["full", "lora"], default="full")
    parser.add_argument("--lora-rank", type=int, default=32)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-smolvla-"))
    task = {"colours": ["orange"], "cameras": CAMERAS, "episode_length": (20, 30), **LAYOUT}
    train_dir, held_dir = work / "orange-dot", work / "orange-dot-held-out"
    if not train_dir.exists():
        write_synthetic_dataset(train_dir, episodes=EPISODES, seed=0, **task)
        write_synthetic_dataset(held_dir, episodes=HELD_OUT_EPISODES, seed=1, **task)
    smolvla = family_named("smolvla")
    opened = {"normalization": "mean_std", "camera_names": "dataset"}
    train_set = open_dataset(str(train_dir), **opened)  # type: ignore[arg-type]
    # Every error in the tuned models' units: the training episodes' mean and std, which each job
    # writes as its norm_stats.json (the held-out episodes' own statistics differ a little).
    units = work / "training-units"
    units.mkdir(exist_ok=True)
    (units / "norm_stats.json").write_text(train_set.norm_stats.to_json())
    held_out = with_norm_stats(open_dataset(str(held_dir), **opened), units)  # type: ignore[arg-type]
    frames = range(len(held_out))
    blind = blind_baseline(ActionChunks(train_set), range(len(train_set)), ActionChunks(held_out), frames).mse

    def scores(model: str) -> dict[str, Any]:
        request = EvaluationRequest(
            model=model, dataset=str(held_dir), chunks=CHUNKS_PER_FRAME, norm_stats_from=str(units)
        )
        return smolvla.evaluate(request)

    base = scores("smolvla-tiny")
    print(
        f"held-out: {len(held_out)} frames; blind {blind:.4f}; base {base['mean_action_mse']:.4f}", flush=True
    )
    scene = {"colours": task["colours"], "cameras": CAMERAS}

    def closed_loop(model: Any) -> str:
        report = evaluate_in_env(
            model, "relay/Dot-v0", episodes=CLOSED_LOOP_EPISODES, seed=CLOSED_LOOP_SEED, env_options=scene
        )
        return f"{report.success_rate:7.0%}  {report.mean_length:6.1f}"

    print(f"blind in closed loop: {closed_loop(BlindPolicy.from_dataset(train_set))}", flush=True)
    header = f"{'seed':>4}  {'error':>7}  {'vs blind':>8}  {'one chunk':>9}  {'spread':>7}  {'train s':>7}"
    print(f"{header}  {'success':>7}  {'steps':>6}")
    ratios = []
    for seed in args.seeds:
        config = SFTConfig(
            model="smolvla-tiny",
            dataset_name=str(train_dir),
            steps=args.steps,
            finetune=args.finetune,
            lora_rank=args.lora_rank,
        )
        started = time.perf_counter()
        result = run_recipe(
            Recipe(config, seed=seed),
            work / f"run-{seed}",
            on_event=lambda e: None,
            should_stop=lambda: False,
        )
        seconds = time.perf_counter() - started
        tuned = scores(str(result.output_dir))
        ratio = blind / tuned["mean_action_mse"]
        ratios.append(ratio)
        print(
            f"{seed:>4}  {tuned['mean_action_mse']:7.4f}  {ratio:7.2f}x  {tuned['mse']:9.4f}  "
            f"{tuned['action_spread']:7.4f}  {seconds:7.1f}  {closed_loop(str(result.output_dir))}",
            flush=True,
        )
    print(
        f"vs blind: median {statistics.median(ratios):.2f}x, worst {min(ratios):.2f}x over seeds {args.seeds}"
    )
    base_ratio = blind / base["mean_action_mse"]
    print(f"base vs blind: {base_ratio:.2f}x; finetune {args.finetune}; work directory {work}")


if __name__ == "__main__":
    main()
