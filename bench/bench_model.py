"""How close a pi0.5 training step comes to this machine's matmul rate (not a test).

Runs, in one process: a large fp32 matmul (the machine's rate), then full fine-tuning steps
(forward, backward, AdamW) of a mid-size pi0.5 (width 512, 6 layers, batch 8), then the
matmul again. The step's FLOPs are counted by torch's FlopCounterMode on one real step
(matmuls, convolutions and attention, forward and backward). Also prints pi05-tiny's step time.

    python bench/bench_model.py [--steps 6] [--threads N]
    python bench/bench_model.py --against-lerobot [--rounds 3] [--threads N]

With --against-lerobot it times, instead, the mid-size step against lerobot 0.6.1's own `PI05Policy`
step at the same sizes, batch, threads and tokens (bench/lerobot_step_side.py, run in lerobot's
environment, `.venv-lerobot`), full fine-tuning and the action expert alone (Relay's LoRA on the
expert; lerobot's `train_expert_only`), in alternating rounds, and prints the medians and ratios.

The other benches import the helpers here (mid-size config, batches, the step, FLOP count).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop, sdpa_flop

from relay_engine.models import GemmaSize, Pi05Batch, Pi05Config, Pi05Policy, VisionSize, build_policy
from relay_engine.models import flow_matching_loss as _loss
from relay_engine.models.config import BYTE_VOCAB_SIZE

# openpi's proportions (language model twice the expert's width) at width 512, 6 layers.
MID = Pi05Config(
    model="pi05-mid",
    vision=VisionSize(width=384, depth=6, mlp_dim=1536, num_heads=6, patch_size=16, image_size=128),
    language=GemmaSize(width=512, depth=6, mlp_dim=2048, num_heads=8, num_kv_heads=1, head_dim=64),
    expert=GemmaSize(width=256, depth=6, mlp_dim=1024, num_heads=8, num_kv_heads=1, head_dim=64),
    vocab_size=BYTE_VOCAB_SIZE,
    tokenizer="bytes",
    max_token_len=256,
)

# The CPU's fused attention is not in FlopCounterMode's table; count it like the CUDA kernels.
_CPU_ATTENTION_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: sdpa_flop,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default: sdpa_backward_flop,
}


def make_samples(count: int, *, seed: int = 0, horizon: int = 10, cameras: int = 2) -> list[dict]:
    """A LeRobot-like batch: 2 cameras of 96x128, 14-dim state and actions, a short task."""
    rng = np.random.default_rng(seed)
    names = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")[:cameras]
    samples = []
    for _ in range(count):
        state = np.zeros(32, np.float32)
        state[:14] = rng.uniform(-1, 1, 14)
        actions = np.zeros((horizon, 32), np.float32)
        actions[:, :14] = rng.normal(size=(horizon, 14))
        samples.append(
            {
                "image": {name: rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for name in names},
                "state": state,
                "state_dim": 14,
                "prompt": "pick up the fork and put it in the cup",
                "actions": actions,
                "action_dim": 14,
                "action_is_pad": np.zeros(horizon, bool),
            }
        )
    return samples


def make_step(model: Pi05Policy, batch: Pi05Batch, device: str = "cpu") -> Callable[[], None]:
    """One training step through the engine's Pi05Learner (forward_backward + optim_step), or, where
    the training package is absent, the same thing with a plain AdamW."""
    try:
        from relay_engine.families.pi05.learner import AdamParams, Pi05Learner
    except ImportError:
        return _plain_step(model, batch)
    learner = Pi05Learner(model, seed=0, device=device)
    params = AdamParams(learning_rate=1e-5)

    def step() -> None:
        learner.forward_backward(batch)
        learner.optim_step(params)

    return step


def _plain_step(model: Pi05Policy, batch: Pi05Batch) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-5, betas=(0.9, 0.95)
    )
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        loss, _ = _loss(model.flow_outputs(batch, generator=generator), batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def step_flops(step: Callable[[], None]) -> int:
    """FLOPs of one step (forward and backward; the optimizer's elementwise work is not counted)."""
    with FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION_FLOPS) as counter:
        step()
    return counter.get_total_flops()


def median_seconds(
    fn: Callable[[], None], repeats: int, warmup: int = 2, sync: Callable[[], None] = lambda: None
) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_rate(
    size: int = 2048, dtype: torch.dtype = torch.float32, device: str = "cpu", repeats: int = 10
) -> float:
    """FLOP/s of a large square matmul: what the machine can do."""
    a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
    out = torch.empty(size, size, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    seconds = median_seconds(lambda: torch.mm(a, b, out=out), repeats, sync=sync)
    return 2 * size**3 / seconds


LEROBOT_PYTHON = Path(__file__).resolve().parents[1] / ".venv-lerobot" / "bin" / "python"


def against_lerobot(steps: int, batch_size: int, rounds: int) -> None:
    """Relay's mid-size step ÷ lerobot's at the same sizes and batch, full and expert-only."""
    from relay_engine.tuning import apply_tuning

    if not LEROBOT_PYTHON.exists():
        raise SystemExit(f"--against-lerobot needs lerobot 0.6.1 in {LEROBOT_PYTHON.parent.parent}")
    threads = torch.get_num_threads()
    for finetune, expert_only in (("full", False), ("lora", True)):
        policy = apply_tuning(build_policy(MID), finetune)
        batch = policy.collate(make_samples(batch_size))
        step = make_step(policy, batch)
        with tempfile.TemporaryDirectory() as work:
            config, arrays = Path(work) / "relay_config.json", Path(work) / "batch.npz"
            config.write_text(json.dumps(MID.to_dict()))
            used = [i for i, on in enumerate(batch.cameras_in_use or ()) if on]
            np.savez(
                arrays,
                images=((batch.images[:, used] + 1) / 2).numpy(),  # lerobot's cameras read [0, 1]
                tokens=batch.tokens.numpy(),
                token_mask=batch.token_mask.numpy(),
                actions=batch.actions[:, :, :14].numpy(),
                state_dim=14,
                action_dim=14,
            )
            side = [str(LEROBOT_PYTHON), str(Path(__file__).with_name("lerobot_step_side.py"))]
            side += [str(config), str(arrays), "--steps", str(steps), "--threads", str(threads)]
            side += ["--expert-only"] if expert_only else []
            ratios, relay_medians, lerobot_medians = [], [], []
            for _ in range(rounds):  # alternating, so that a busy moment of the machine hits both
                relay_medians.append(median_seconds(step, steps, warmup=1))
                answer = subprocess.run(side, capture_output=True, text=True)
                if answer.returncode:
                    raise SystemExit(f"lerobot's side failed:\n{answer.stderr[-3000:]}")
                lerobot_medians.append(json.loads(answer.stdout.strip().splitlines()[-1])["median"])
                ratios.append(relay_medians[-1] / lerobot_medians[-1])
        name = (
            "full fine-tuning"
            if finetune == "full"
            else "expert only (Relay LoRA, lerobot train_expert_only)"
        )
        print(
            f"{name}, batch {batch_size}, {threads} thread(s): "
            f"Relay {statistics.median(relay_medians) * 1e3:.0f} ms, "
            f"lerobot {statistics.median(lerobot_medians) * 1e3:.0f} ms a step (medians of {rounds} rounds "
            f"of {steps}); Relay ÷ lerobot {statistics.median(ratios):.2f} "
            f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads [default: torch's]")
    parser.add_argument(
        "--against-lerobot", action="store_true", help="time lerobot 0.6.1's step beside ours"
    )
    parser.add_argument("--rounds", type=int, default=3, help="--against-lerobot: alternating rounds")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.against_lerobot:
        against_lerobot(args.steps, args.batch_size, args.rounds)
        return

    rate_before = matmul_rate()
    policy = build_policy(MID)  # full fine-tuning: every weight trains
    batch = policy.collate(make_samples(args.batch_size))
    step = make_step(policy, batch)
    flops = step_flops(step)
    seconds = median_seconds(step, args.steps, warmup=1)
    rate_after = matmul_rate()
    machine = max(rate_before, rate_after)
    achieved = flops / seconds
    params = sum(p.numel() for p in policy.parameters())
    used = sum(batch.cameras_in_use or ())
    print(
        f"mid-size pi0.5: {params / 1e6:.1f}M weights, batch {args.batch_size}, "
        f"{used} cameras, {batch.tokens.shape[1]} prompt tokens"
    )
    print(f"  FLOPs per step (fwd+bwd, counted): {flops / 1e9:.2f} GFLOP")
    print(f"  step (fwd, bwd, AdamW), median of {args.steps}: {seconds * 1e3:.1f} ms")
    print(f"  achieved: {achieved / 1e9:.1f} GFLOP/s")
    print(f"  fp32 matmul 2048^3: {rate_before / 1e9:.1f} GFLOP/s before, {rate_after / 1e9:.1f} after")
    print(f"  ratio achieved / matmul (best): {achieved / machine:.2f}   (goal >= 0.3)")

    for finetune in ("lora", "full"):
        from relay_engine.tuning import apply_tuning

        tiny = apply_tuning(build_policy("pi05-tiny"), finetune)
        tiny_batch = tiny.collate(make_samples(args.batch_size))
        tiny_seconds = median_seconds(make_step(tiny, tiny_batch), 20)
        print(f"pi05-tiny {finetune} step at batch {args.batch_size}: {tiny_seconds * 1e3:.1f} ms (median)")


if __name__ == "__main__":
    main()
