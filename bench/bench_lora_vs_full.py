"""LoRA on the action expert vs full fine-tuning of the same model: step time and peak memory.

Not a test. The mid-size pi0.5 of bench_model.py at batch 8, trained through the engine's step:

- time: both methods in this process, their steps alternating, so that a shared, busy machine
  slows both alike; the medians and their ratio;
- memory: each method in a fresh process of its own (so that one's memory cannot hide the
  other's), the peak it reached above what it held after importing torch: weights, gradients,
  optimizer state and activations (on a CPU the process's peak resident set, on CUDA the
  allocator's peak);
- FLOPs per step, counted, as a machine-independent figure.

    python bench/bench_lora_vs_full.py [--steps 5] [--device cpu] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import MID, make_samples, make_step, step_flops

from relay_engine.models import build_policy
from relay_engine.tuning import apply_tuning

METHODS = ("lora", "full")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_memory(finetune: str, device: str) -> int:
    """Runs in a worker process: the peak bytes above the baseline over two steps."""
    cuda = device.startswith("cuda")
    if cuda:
        baseline = torch.cuda.memory_allocated()
    else:
        # Start the process's peak resident set (VmHWM) afresh from here.
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        baseline = _status_bytes("VmRSS")
    policy = apply_tuning(build_policy(MID, device=device), finetune)
    step = make_step(policy, policy.collate(make_samples(8)), device)
    step()
    step()
    if cuda:
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - baseline
    return _status_bytes("VmHWM") - baseline


def alternating_step_times(
    steps: int, device: str
) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    runs, flops, trainable = {}, {}, {}
    for method in METHODS:
        policy = apply_tuning(build_policy(MID, device=device), method)
        runs[method] = make_step(policy, policy.collate(make_samples(8)), device)
        flops[method] = step_flops(runs[method])  # also the warm-up step
        trainable[method] = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    times: dict[str, list[float]] = {method: [] for method in METHODS}
    for _ in range(steps):
        for method in METHODS:
            sync()
            start = time.perf_counter()
            runs[method]()
            sync()
            times[method].append(time.perf_counter() - start)
    return {m: statistics.median(t) for m, t in times.items()}, flops, trainable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads [default: torch's]")
    parser.add_argument("--memory-worker", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_worker:
        print(json.dumps({"peak_bytes": peak_memory(args.memory_worker, args.device)}))
        return

    seconds, flops, trainable = alternating_step_times(args.steps, args.device)
    peak = {}
    for method in METHODS:
        command = [sys.executable, __file__, "--memory-worker", method, "--device", args.device]
        if args.threads:
            command += ["--threads", str(args.threads)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        peak[method] = json.loads(output.strip().splitlines()[-1])["peak_bytes"]

    print(
        f"mid-size pi0.5, batch 8, {args.device} ({torch.get_num_threads()} threads), "
        f"median of {args.steps} alternating steps; memory of each method in its own process"
    )
    for method in METHODS:
        print(
            f"  {method}: {trainable[method]:>11,} trainable, {flops[method] / 1e9:6.1f} GFLOP/step, "
            f"step {seconds[method] * 1e3:8.1f} ms, peak memory {peak[method] / 2**20:7.1f} MiB"
        )
    print(f"  LoRA / full step time:   {seconds['lora'] / seconds['full']:.2f}x   (goal <= 0.5x)")
    print(f"  LoRA / full peak memory: {peak['lora'] / peak['full']:.2f}x   (goal <= 0.6x)")
    print(f"  LoRA / full FLOPs:       {flops['lora'] / flops['full']:.2f}x")


if __name__ == "__main__":
    main()
