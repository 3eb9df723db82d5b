"""The memory plan against measured peak memory, on the CPU, for a mid-size pi05.

Not a test. For LoRA and full fine-tuning of a mid-size pi05 (the real architecture at about a
tenth of its width: Gemma width 512, 6 layers; SigLIP width 384, 6 layers, 112 px), each in a
fresh process: the plan (`relay.memory_plan`, through the engine's `plan_memory`; one process,
fp32 on the CPU) against the growth of the process's peak resident memory over a few training
steps (from just before the model is built). The process's own baseline (Python, torch) is left
out. The last column is plan / measured: above 1 the plan counts more than the step used, below
1 something it does not count (the allocator's slack, the data batch) took more.

    python bench/bench_memory_plan.py [--batch-size 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from relay.optimizer import AdamParams
from relay_engine.families.pi05.learner import Pi05Learner
from relay_engine.families.pi05.memory import plan_memory
from relay_engine.models import build_policy
from relay_engine.models.config import GemmaSize, VisionSize, named_config
from relay_engine.tuning import apply_tuning

MID_GEMMA = GemmaSize(width=512, depth=6, mlp_dim=2048, num_heads=8, num_kv_heads=1, head_dim=64)
MID_VISION = VisionSize(width=384, depth=6, mlp_dim=1536, num_heads=6, patch_size=14, image_size=112)


def mid_config():  # type: ignore[no-untyped-def]
    return named_config("pi05-tiny").replace(
        model="pi05-mid", vision=MID_VISION, language=MID_GEMMA, expert=MID_GEMMA, max_token_len=64
    )


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def measure(finetune: str, batch_size: int) -> dict[str, float]:
    """In this (fresh) process: the plan, then the peak memory growth over 3 steps."""
    from bench_cuda_pi05 import synthetic_batch

    torch.set_num_threads(1)
    plan = plan_memory(
        apply_tuning(build_policy(mid_config(), device="meta"), finetune),
        batch_size=batch_size,
        gpus=1,
        strategy="none",
        device="cpu",
    )
    baseline = resident_bytes()
    policy = apply_tuning(build_policy(mid_config()), finetune)
    batch = synthetic_batch(policy, batch_size, prompt_tokens=48, cameras=3)
    learner = Pi05Learner(policy, seed=0)
    for _ in range(3):
        learner.forward_backward(batch)
        learner.optim_step(AdamParams(learning_rate=1e-5))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {**{k: v for k, v in plan.to_dict().items() if isinstance(v, int)}, "measured": peak - baseline}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.batch_size)))
        return
    print(
        f"pi05-mid (Gemma 512x6, SigLIP 384x6 at 112 px), batch {args.batch_size}, fp32 on the CPU, 1 process"
    )
    print(
        f"{'':<6}{'weights':>10}{'grads':>10}{'optim':>10}{'activ.':>10}{'plan':>10}{'measured':>10}"
        f"{'plan/measured':>15}"
    )
    for finetune in ("lora", "full"):
        child = [sys.executable, __file__, "--child", finetune, "--batch-size", str(args.batch_size)]
        figures = json.loads(subprocess.run(child, capture_output=True, text=True, check=True).stdout)
        mib = {k: v / 2**20 for k, v in figures.items()}
        print(
            f"{finetune:<6}{mib['weights']:>8.0f}Mi{mib['gradients']:>8.0f}Mi{mib['optimizer']:>8.0f}Mi"
            f"{mib['activations']:>8.0f}Mi{mib['total']:>8.0f}Mi{mib['measured']:>8.0f}Mi"
            f"{figures['total'] / figures['measured']:>15.2f}"
        )


if __name__ == "__main__":
    main()
