"""The full pi05 LoRA training step on a CUDA GPU: step time and model FLOP utilisation.

Not a test; needs a CUDA machine (an estimate, not measured: some 20-30 GB of GPU memory at
batch 32, 13.4 GB of it the fp32 weights). It has not been run: no GPU was at hand when it was
written; its code path was exercised with `--device cpu --model pi05-tiny`. Builds pi05 at its
real sizes with random weights (the timing does not depend on their values; no download),
LoRA rank 32 on the default targets (the action expert, heads in full), and runs the engine's
training step (Pi05Learner: bf16 autocast, fp32 weights, gradients and AdamW) on a batch of 32
with three 224x224 cameras and a prompt of --prompt-tokens PaliGemma tokens.

MFU = (FLOPs of one step, counted by torch's FlopCounterMode: matmuls and attention, forward
and backward) / step time / (this card's bf16 matmul rate, measured on an 8192^3 matmul).

    python bench/bench_cuda_pi05.py [--batch-size 32] [--steps 10]
    python bench/bench_cuda_pi05.py --device cpu --model pi05-tiny --batch-size 4   # a smoke run

Multi-GPU mode: under torchrun the step runs as the engine runs a job of many processes (DDP for
LoRA, FSDP2 with bf16 compute and activation checkpointing for full; --strategy overrides), the
global --batch-size split across the ranks. Rank 0 prints samples/s, MFU against the measured
matmul rate and against the H200's bf16 dense peak, and each rank's peak memory against the
memory plan (`relay models info ... --memory`):

    torchrun --nproc-per-node 1 bench/bench_cuda_pi05.py --finetune full   # FSDP on one GPU
    torchrun --nproc-per-node 1 bench/bench_cuda_pi05.py --finetune lora   # DDP on one GPU
    torchrun --nproc-per-node 8 bench/bench_cuda_pi05.py --finetune full
    torchrun --nproc-per-node 2 bench/bench_cuda_pi05.py --device cpu --model pi05-tiny --batch-size 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import make_step, matmul_rate, median_seconds, step_flops

from relay.optimizer import AdamParams
from relay_engine.core.group import batch_slice, join, launched, leave
from relay_engine.families.pi05.learner import Pi05Learner
from relay_engine.families.pi05.memory import plan_memory
from relay_engine.families.pi05.parallel import Parallel, choose_strategy
from relay_engine.models import Pi05Batch, build_policy
from relay_engine.tuning import apply_tuning

# NVIDIA's H200 SXM dense bf16 tensor-core peak (989 TFLOP/s; the 1,979 figure assumes sparsity).
H200_BF16_PEAK = 989e12


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
    parser.add_argument("--finetune", default="lora", choices=["lora", "full"])
    parser.add_argument("--strategy", default="auto", choices=["auto", "ddp", "fsdp"])
    args = parser.parse_args()
    if launched():
        distributed_main(args)
        return
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


def distributed_main(args: argparse.Namespace) -> None:
    """One rank of a torchrun launch: the engine's distributed step, figures printed by rank 0."""
    world = join(args.device if args.device == "cpu" else "auto")
    cuda = world.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    strategy = choose_strategy(args.strategy, args.finetune)
    plan = plan_memory(
        apply_tuning(build_policy(args.model, device="meta"), args.finetune, lora_rank=args.lora_rank),
        batch_size=args.batch_size,
        gpus=world.size,
        strategy=strategy,
        device="cuda" if cuda else "cpu",
    )
    matmul = matmul_rate(
        args.matmul_size if cuda else 1024,
        torch.bfloat16 if cuda else torch.float32,
        str(world.device),
        repeats=20,
    )
    policy = apply_tuning(
        build_policy(args.model, device=world.device), args.finetune, lora_rank=args.lora_rank
    )
    start, stop = batch_slice(args.batch_size, world.rank, world.size)
    batch = synthetic_batch(policy, args.batch_size, args.prompt_tokens, args.cameras)
    batch = batch._map(lambda t: t[start:stop]).to(world.device)
    parallel = Parallel(policy, world, strategy)
    learner = Pi05Learner(policy, seed=0, device=world.device, parallel=parallel)
    adam = AdamParams(learning_rate=1e-5)

    def step() -> None:
        learner.forward_backward(batch)
        learner.optim_step(adam)

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    flops = step_flops(step)  # this rank's share of the step
    seconds = median_seconds(step, args.steps, warmup=3, sync=sync)
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    peaks = parallel.sum([float(peak)])[0] / world.size
    if world.is_main:
        name = torch.cuda.get_device_name() if cuda else "cpu"
        print(f"{args.model} {args.finetune} under {strategy.upper()} on {world.size} x {name}")
        print(f"  global batch {args.batch_size} ({stop - start} on rank 0), median of {args.steps} steps")
        print(f"  step: {seconds * 1e3:.1f} ms, {args.batch_size / seconds:.1f} samples/s")
        achieved = flops / seconds
        print(f"  per GPU: {achieved / 1e12:.2f} TFLOP/s achieved, {matmul / 1e12:.2f} measured matmul")
        print(
            f"  MFU vs measured matmul: {achieved / matmul:.3f}; "
            f"vs H200 bf16 peak: {achieved / H200_BF16_PEAK:.3f}"
        )
        if cuda:
            # The plan's flat overhead (CUDA context, workspaces) is not in the allocator's count.
            planned = plan.total - plan.overhead
            print(
                f"  peak allocated per GPU (mean of ranks): {peaks / 2**30:.2f} GiB; plan without overhead "
                f"{planned / 2**30:.2f} GiB (plan / measured {planned / max(peaks, 1):.2f})"
            )
    leave()


if __name__ == "__main__":
    main()
