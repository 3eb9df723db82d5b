"""The full pi05 LoRA training step on a CUDA GPU: step time and model FLOP utilisation.

Not a test; needs a CUDA machine (an estimate, not measured: some 20-30 GB of GPU memory at
batch 32, 13.4 GB of it the fp32 weights). It has not been run: no GPU was at hand when it was
written; its code path was exercised with `--device cpu --model pi05-tiny`. Builds pi05 at its
real sizes with random weights (the timing does not depend on their values; no download),
LoRA rank 32 on the default targets (the action expert, heads in full), and runs the engine's
training step (Learner: bf16 autocast, fp32 weights, gradients and AdamW) on a batch of 32
with three 224x224 cameras and a prompt of --prompt-tokens PaliGemma tokens.

MFU = (FLOPs of one step, counted by torch's FlopCounterMode: matmuls and attention, forward
and backward) / step time / (this card's bf16 matmul rate, measured on an 8192^3 matmul).

    python bench/bench_cuda_pi05.py [--batch-size 32] [--steps 10]
    python bench/bench_cuda_pi05.py --device cpu --model pi05-tiny --batch-size 4   # a smoke run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import make_step, matmul_rate, median_seconds, step_flops

from relay_engine.models import Pi05Batch, build_policy
from relay_engine.tuning import apply_tuning


def synthetic_batch(
    policy, batch_size: int, prompt_tokens: int, cameras: int, action_dim: int = 14
) -> Pi05Batch:
    """A batch as the collator would make it, without needing the PaliGemma tokenizer files."""
    config = policy.config
    generator = torch.Generator().manual_seed(0)
    size = config.vision.image_size
    image_mask = torch.zeros(batch_size, 3, dtype=torch.bool)
    image_mask[:, :cameras] = True
    length = -(-prompt_tokens // 8) * 8
    tokens = torch.randint(1, config.vocab_size, (batch_size, length), generator=generator)
    token_mask = torch.zeros(batch_size, length, dtype=torch.bool)
    token_mask[:, :prompt_tokens] = True
    action_mask = torch.zeros(batch_size, config.action_horizon, config.action_dim, dtype=torch.bool)
    action_mask[:, :, :action_dim] = True
    return Pi05Batch(
        images=torch.rand(batch_size, 3, 3, size, size, generator=generator) * 2 - 1,
        image_mask=image_mask,
        tokens=tokens,
        token_mask=token_mask,
        actions=torch.randn(batch_size, config.action_horizon, config.action_dim, generator=generator),
        action_mask=action_mask,
        weights=torch.ones(batch_size),
        cameras_in_use=tuple(bool(x) for x in image_mask.any(0)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pi05")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--cameras", type=int, default=3, choices=[1, 2, 3])
    parser.add_argument("--prompt-tokens", type=int, default=56)
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--matmul-size", type=int, default=8192)
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU (or pass --device cpu --model pi05-tiny for a smoke run)")
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    matmul = matmul_rate(args.matmul_size, torch.bfloat16, args.device, repeats=20)
    policy = apply_tuning(build_policy(args.model, device=args.device), "lora", lora_rank=args.lora_rank)
    batch = synthetic_batch(policy, args.batch_size, args.prompt_tokens, args.cameras).to(args.device)
    step = make_step(policy, batch, args.device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    flops = step_flops(step)
    seconds = median_seconds(step, args.steps, warmup=3, sync=sync)
    achieved = flops / seconds

    name = torch.cuda.get_device_name() if cuda else "cpu"
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    prefix = args.cameras * policy.config.vision.tokens_per_image + args.prompt_tokens
    precision = "bf16 autocast" if cuda else "fp32"
    print(f"{args.model} LoRA rank {args.lora_rank} ({trainable:,} trainable) on {name}, {precision}")
    print(f"  batch {args.batch_size}: {args.cameras} cameras + {args.prompt_tokens} prompt tokens")
    print(f"  prefix tokens per sample: {prefix}")
    print(f"  FLOPs per step (counted): {flops / 1e9:.1f} GFLOP")
    print(
        f"  step, median of {args.steps}: {seconds * 1e3:.1f} ms ({args.batch_size / seconds:.1f} samples/s)"
    )
    print(f"  achieved: {achieved / 1e12:.2f} TFLOP/s")
    print(f"  bf16 matmul {args.matmul_size}^3: {matmul / 1e12:.2f} TFLOP/s")
    print(f"  MFU: {achieved / matmul:.3f}")
    if cuda:
        print(f"  peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
