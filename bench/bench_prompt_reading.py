"""Does a pi05-tiny base read its prompt? Before any fine-tuning, on scenes of two dots where the
prompt names the target:

    python bench/bench_prompt_reading.py [--base DIR] [--colours blue cyan] [--seeds 201 202 203]

For each seed, a synthetic dataset of two tasks (`--colours`; both dots in every scene) is written,
and for frames of its episodes the base samples a chunk twice from the same noise: once with the
frame's own prompt (the dot the episode goes to) and once with the other task's prompt. It prints
the error of each against the episode's real actions (normalized units, the robot's columns, the
mean of the chunks' steps) and their ratio: a base that ignores its prompt gives the same chunk
both times (ratio 1.00); one that reads it is nearer the real actions with the right prompt.

The default colours are ones the base was pretrained on (the held-out orange is the fine-tunes'
test), with names of the same length: the two prompts are then as many tokens long, and the chunk
moves only if the base reads what they say, not because the actions' positions shifted. The seeds
are ones no test and no pretraining dataset uses.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from relay_engine.datasets import open_dataset, write_synthetic_dataset
from relay_engine.models import load_policy, weights

FRAMES = 96
CHUNK_STEPS = 10


def prompt_errors(policy: torch.nn.Module, dataset_dir: Path, seed: int) -> tuple[float, float]:
    """Mean squared error of the chunks sampled with the right prompt, and with the other task's."""
    dataset = open_dataset(str(dataset_dir))
    tasks = list(dataset.summary.tasks)
    frames = np.random.default_rng(seed).choice(len(dataset), size=min(FRAMES, len(dataset)), replace=False)
    right, wrong = [], []
    for frame in frames.tolist():
        sample = dataset[frame]
        other = next(task for task in tasks if task != sample["prompt"])
        width = sample["action_dim"]
        real = torch.as_tensor(sample["actions"])[:, :width]
        kept = ~torch.as_tensor(sample["action_is_pad"])
        noise = torch.randn((1, *sample["actions"].shape), generator=torch.Generator().manual_seed(frame))
        for prompt, errors in ((sample["prompt"], right), (other, wrong)):
            batch = policy.collate([{**sample, "prompt": prompt}])
            chunk = policy.sample_actions(batch, num_steps=CHUNK_STEPS, noise=noise)[0, :, :width]
            errors.append(float(((chunk - real) ** 2)[kept].mean()))
    return float(np.mean(right)), float(np.mean(wrong))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--base", type=Path, default=None, help="a pi05-tiny base directory [the shipped one]"
    )
    parser.add_argument("--colours", nargs=2, default=["blue", "cyan"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[201, 202, 203])
    parser.add_argument("--episodes", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.base is not None:
        weights.TINY_BASE_DIR = args.base.resolve()
    policy = load_policy("pi05-tiny").eval()
    print(f"base: {weights.TINY_BASE_DIR}")
    print("seed   right prompt   other prompt   other/right")
    ratios = []
    with tempfile.TemporaryDirectory(prefix="relay-prompts-") as tmp, torch.inference_mode():
        for seed in args.seeds:
            path = write_synthetic_dataset(
                Path(tmp) / f"s{seed}", episodes=args.episodes, colours=args.colours, seed=seed
            )
            right, wrong = prompt_errors(policy, path, seed)
            ratios.append(wrong / right)
            print(f"{seed:4d}   {right:12.4f}   {wrong:12.4f}   {wrong / right:10.2f}x", flush=True)
    print(f"median other/right: {statistics.median(ratios):.2f}x (1.00x: the prompt is ignored)")


if __name__ == "__main__":
    main()
