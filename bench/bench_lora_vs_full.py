"""LoRA on the action expert vs full fine-tuning of the same model: step time and peak memory.

Not a test. Each method runs in its own fresh process (so that one's memory cannot hide the
other's) on the mid-size pi0.5 of bench_model.py, batch 8: a few training steps through the
engine's step, the median step time, and the peak memory the process reached above what it
held after importing torch (weights, gradients, optimizer state and activations: on a CPU the
process's peak resident set; on CUDA the allocator's peak).

    python bench/bench_lora_vs_full.py [--steps 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def measure(finetune: str, steps: int, device: str) -> dict[str, float]:
    """Runs in the worker process."""
    sys.path.insert(0, str(HERE))
    from bench_model import MID, make_samples, make_step, median_seconds

    from relay_engine.models import build_policy
    from relay_engine.tuning import apply_tuning

    cuda = device.startswith("cuda")
    baseline = torch.cuda.memory_allocated() if cuda else _resident_bytes()
    policy = apply_tuning(build_policy(MID, device=device), finetune)
    batch = policy.collate(make_samples(8))
    step = make_step(policy, batch, device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    seconds = median_seconds(step, steps, warmup=1, sync=sync)
    if cuda:
        peak = torch.cuda.max_memory_allocated() - baseline
    else:
        # ru_maxrss is in KiB on Linux.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    return {"seconds": seconds, "peak_bytes": peak, "trainable": trainable}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--worker", choices=["lora", "full"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker, args.steps, args.device)))
        return
    results = {}
    for finetune in ("lora", "full"):
        command = [
            sys.executable,
            __file__,
            "--worker",
            finetune,
            "--steps",
            str(args.steps),
            "--device",
            args.device,
        ]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[finetune] = json.loads(output.strip().splitlines()[-1])
    lora, full = results["lora"], results["full"]
    print(
        f"mid-size pi0.5, batch 8, {args.device}, median of {args.steps} steps, "
        "each method in its own process"
    )
    for name, result in results.items():
        print(
            f"  {name:4s}: {result['trainable']:>11,} trainable, step {result['seconds'] * 1e3:8.1f} ms, "
            f"peak memory {result['peak_bytes'] / 2**20:8.1f} MiB"
        )
    print(f"  LoRA / full step time:   {lora['seconds'] / full['seconds']:.2f}x   (goal <= 0.5x)")
    print(f"  LoRA / full peak memory: {lora['peak_bytes'] / full['peak_bytes']:.2f}x   (goal <= 0.6x)")


if __name__ == "__main__":
    main()
