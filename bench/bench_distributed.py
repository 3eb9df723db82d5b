"""2 processes against 1 at the same global batch, on the CPU (gloo): step time and communication.

Not a test. Runs the engine's step (Pi05Learner.forward_backward + optim_step) on pi05-tiny at a
global batch of --batch-size, first in this process alone, then as 2 processes started by
torch.distributed.run, each with half the batch:

- LoRA under DDP, and again with DDP's gradient all-reduce switched off (no_gradient_sync), so
  the difference is what averaging the gradients costs;
- full fine-tuning under FSDP (weights gathered per layer, gradients reduce-scattered).

It prints the median step times, the 2-process/1-process ratio and the communication share of
the DDP step ((synced - unsynced) / synced). On a 2-core machine 2 processes cannot be faster
(each gets one core, and one process alone already uses both); the point is to measure the
overhead. On GPUs each process has its own device, and the same code scales the batch.

    python bench/bench_distributed.py [--batch-size 8] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cuda_pi05 import synthetic_batch

from relay.optimizer import AdamParams
from relay_engine.core.group import batch_slice, join, launched, leave
from relay_engine.families.pi05.learner import Pi05Learner
from relay_engine.families.pi05.parallel import Parallel, choose_strategy
from relay_engine.models import build_policy
from relay_engine.tuning import apply_tuning

ADAM = AdamParams(learning_rate=1e-5)


def step_times(finetune: str, batch_size: int, steps: int, *, unsynced_too: bool = False) -> dict[str, float]:
    """Median seconds of a step after 2 warm-up steps, in this process (a rank of a group, or alone).

    With `unsynced_too` (DDP), steps with and without the gradient all-reduce alternate, so both
    see the same machine load.
    """
    world = join("cpu") if launched() else None
    policy = apply_tuning(build_policy("pi05-tiny"), finetune)
    batch = synthetic_batch(policy, batch_size, prompt_tokens=48, cameras=2)
    if world is not None:
        start, stop = batch_slice(batch_size, world.rank, world.size)
        batch = batch._map(lambda t: t[start:stop])
    parallel = Parallel(policy, world, choose_strategy("auto", finetune)) if world is not None else None
    learner = Pi05Learner(policy, seed=0, parallel=parallel)
    modes = ["synced", "unsynced"] if unsynced_too and parallel is not None else ["synced"]
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for index in range(steps + 2):
        for mode in modes:
            if parallel is not None:
                parallel.barrier()  # every rank starts the step together
            started = time.perf_counter()
            if parallel is not None and mode == "unsynced":
                with parallel.no_gradient_sync():
                    learner.forward_backward(batch)
            else:
                learner.forward_backward(batch)
            learner.optim_step(ADAM)
            if index >= 2:
                times[mode].append(time.perf_counter() - started)
    return {mode: statistics.median(values) for mode, values in times.items()}


def rank_main(args: argparse.Namespace) -> None:
    """Inside torch.distributed.run: each case in turn; rank 0 writes the medians."""
    lora = step_times("lora", args.batch_size, args.steps, unsynced_too=True)
    full = step_times("full", args.batch_size, args.steps)
    if int(os.environ["RANK"]) == 0:
        figures = {
            "lora_ddp": lora["synced"],
            "lora_ddp_unsynced": lora["unsynced"],
            "full_fsdp": full["synced"],
        }
        Path(args.out).write_text(json.dumps(figures))
    leave()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="cores for the 1-process run"
    )
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if launched():
        rank_main(args)
        return
    threads = args.threads
    # One process on all the cores, and on one core (what each of the 2 processes gets).
    alone: dict[int, dict[str, float]] = {}
    for count in sorted({threads, 1}, reverse=True):
        torch.set_num_threads(count)
        alone[count] = {
            kind: step_times(kind, args.batch_size, args.steps)["synced"] for kind in ("lora", "full")
        }
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "two.json"
        # Each of the 2 processes gets half the cores, as a launcher on a shared host would give.
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, threads // 2))}
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        own = ["--batch-size", str(args.batch_size), "--steps", str(args.steps), "--out", str(out)]
        subprocess.run([*launch, __file__, *own], env=env, check=True)
        two: dict[str, Any] = json.loads(out.read_text())

    print(f"pi05-tiny, global batch {args.batch_size}, median of {args.steps} steps")
    header = f"{'case':<14}" + "".join(f"{f'1 proc, {n} thr':>16}" for n in alone) + f"{'2 procs':>12}"
    print(header + "".join(f"{f'ratio vs {n} thr':>16}" for n in alone))
    for label, kind, key in (("LoRA, DDP", "lora", "lora_ddp"), ("full, FSDP", "full", "full_fsdp")):
        pair = two[key]
        row = (
            f"{label:<14}"
            + "".join(f"{alone[n][kind] * 1e3:>14.1f}ms" for n in alone)
            + f"{pair * 1e3:>10.1f}ms"
        )
        print(row + "".join(f"{pair / alone[n][kind]:>16.2f}" for n in alone))
    share = (two["lora_ddp"] - two["lora_ddp_unsynced"]) / two["lora_ddp"]
    print(
        f"DDP gradient all-reduce: {two['lora_ddp'] * 1e3:.1f} ms synced vs "
        f"{two['lora_ddp_unsynced'] * 1e3:.1f} ms unsynced (alternating): communication share {share:.1%}"
    )


if __name__ == "__main__":
    main()
