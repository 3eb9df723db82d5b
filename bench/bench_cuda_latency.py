"""pi05's serving latency on a CUDA GPU: one observation's action chunk (batch 1, 10 Euler steps) with
1, 2 and 3 cameras, eager against torch.compile of the denoising step (with CUDA graphs:
mode "reduce-overhead") and of the prefix.

Not a test; needs a CUDA machine. It has not been run: no GPU was at hand when it was written; its
code path was exercised with `--device cpu --model pi05-tiny` (both modes; on the CPU "compiled"
is torch.compile's default mode, without CUDA graphs). Builds pi05 at its real
sizes with random weights (latency does not depend on their values; no download), fp32 weights
under bf16 autocast as the engine runs on CUDA, a prompt of --prompt-tokens tokens, and times
`Pi05Policy.sample_actions` (the prefix pass and the denoising loop; no image decoding or
normalization, which the server adds and `bench/bench_serving.py` measures), medians of --repeats
after a warm-up that includes compilation.

The published figures issue 20 compares with: 22 / 29 / 39 ms for 1 / 2 / 3 cameras on an RTX
4090 with custom kernels; 28 ms on an A100.

    python bench/bench_cuda_latency.py [--repeats 20] [--prompt-tokens 48] [--modes eager,compiled]
    python bench/bench_cuda_latency.py --device cpu --model pi05-tiny --repeats 3   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cuda_pi05 import synthetic_batch
from bench_model import median_seconds

from relay_engine.models import Pi05Policy, build_policy

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED_4090_MS = {1: 22.0, 2: 29.0, 3: 39.0}
PUBLISHED_A100_MS = 28.0
MODES = ("eager", "compiled")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pi05")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--num-steps", type=int, default=10)
    parser.add_argument("--modes", default=",".join(MODES), help="eager, compiled or both")
    args = parser.parse_args()
    modes = [mode for mode in args.modes.split(",") if mode]
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    torch.manual_seed(0)
    policy = build_policy(args.model, device=args.device).eval()
    results: dict[str, dict[int, float]] = {}
    eager_chunk = one_chunk(policy, args)
    for mode in modes:
        if mode == "compiled":
            compile_sampler(policy)
            difference = (one_chunk(policy, args) - eager_chunk).abs().max().item()
            print(f"compiled: the same chunk as eager within {difference:.2e} (2 cameras, the same noise)")
        results[mode] = {}
        for cameras in (1, 2, 3):
            seconds = chunk_latency(policy, args, cameras)
            results[mode][cameras] = seconds * 1000
            print(f"{mode:8s} {cameras} camera(s): {seconds * 1000:7.1f} ms", flush=True)
    print_summary(results, args)
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    report = {"model": args.model, "device": device_name(args.device), "latency_ms": results}
    (out / "bench_cuda_latency.json").write_text(json.dumps(report, indent=2))


def compile_sampler(policy: Pi05Policy) -> None:
    """torch.compile the two parts `sample_actions` calls: the denoising step (`velocity`, called
    num_steps times with the same shapes: CUDA graphs replay it) and the prefix pass."""
    model = policy.model
    cuda = policy.device.type == "cuda"
    model.velocity = torch.compile(  # type: ignore[method-assign]
        model.velocity, mode="reduce-overhead" if cuda else "default", dynamic=False
    )
    model.prefix_cache = torch.compile(model.prefix_cache, dynamic=False)  # type: ignore[method-assign]


def one_chunk(policy: Pi05Policy, args: argparse.Namespace) -> torch.Tensor:
    batch = synthetic_batch(policy, 1, args.prompt_tokens, 2).to(policy.device)
    noise = torch.randn(
        1, policy.config.action_horizon, policy.config.action_dim, generator=torch.Generator().manual_seed(0)
    )
    with torch.inference_mode(), autocast(policy):
        return policy.sample_actions(batch, num_steps=args.num_steps, noise=noise).float().cpu()


def chunk_latency(policy: Pi05Policy, args: argparse.Namespace, cameras: int) -> float:
    batch = synthetic_batch(policy, 1, args.prompt_tokens, cameras).to(policy.device)
    noise = torch.randn(1, policy.config.action_horizon, policy.config.action_dim, device=policy.device)

    def sample() -> None:
        with torch.inference_mode(), autocast(policy):
            policy.sample_actions(batch, num_steps=args.num_steps, noise=noise)

    return median_seconds(sample, args.repeats, warmup=3, sync=synchronizer(policy))


@contextlib.contextmanager
def autocast(policy: Pi05Policy) -> Iterator[None]:
    """bf16 autocast on CUDA, as the engine trains and samples there; plain fp32 on the CPU."""
    if policy.device.type != "cuda":
        yield
        return
    with torch.autocast("cuda", dtype=torch.bfloat16):
        yield


def synchronizer(policy: Pi05Policy) -> Callable[[], None]:
    if policy.device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device


def print_summary(results: dict[str, dict[int, float]], args: argparse.Namespace) -> None:
    print(f"\n{args.model} on {device_name(args.device)}, batch 1, {args.num_steps} steps, medians (ms)")
    print("  cameras  " + "  ".join(f"{mode:>9s}" for mode in results) + "  RTX 4090 (published)")
    for cameras in (1, 2, 3):
        row = "  ".join(f"{results[mode][cameras]:9.1f}" for mode in results)
        print(f"  {cameras:7d}  {row}  {PUBLISHED_4090_MS[cameras]:9.1f}")
    print(f"  (A100, published: {PUBLISHED_A100_MS} ms)")
    print("  JSON: bench/out/bench_cuda_latency.json")


if __name__ == "__main__":
    main()
