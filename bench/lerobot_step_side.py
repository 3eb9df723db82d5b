"""lerobot 0.6.1's pi05 training step at Relay's sizes, on Relay's batch, in lerobot's own environment
(for `bench_model.py --against-lerobot`):

    python lerobot_step_side.py RELAY_CONFIG.json BATCH.npz --steps 6 --threads 1 [--expert-only]

It builds lerobot's `PI05Policy` at the sizes of the Relay config (`lerobot_eval_side.teach_sizes`),
with random weights, and times its own training step on the batch Relay's collate made: the same
images (the cameras in use, at the model's resolution, so lerobot resizes nothing), the same prompt
tokens and mask (so both attend over the same prefix; lerobot's own tokenizer step would pad to 200
tokens), the same actions. The step is what lerobot's trainer does for one batch: `policy.forward`,
backward, gradient clipping at 1.0, AdamW, zero_grad. `--expert-only` sets `train_expert_only`
(the vision-language model frozen). Prints one JSON line: the step times in seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.pi05.configuration_pi05 import PI05Config
from lerobot.policies.pi05.modeling_pi05 import PI05Policy

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lerobot_eval_side import teach_sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("batch", type=Path)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--expert-only", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    relay = json.loads(args.config.read_text())
    teach_sizes(relay)
    data = np.load(args.batch)
    images = torch.from_numpy(data["images"])  # (B, cameras in use, 3, S, S) in [0, 1]
    state_dim, action_dim = int(data["state_dim"]), int(data["action_dim"])
    size = relay["vision"]["image_size"]
    cameras = [f"observation.images.camera{i}" for i in range(images.shape[1])]
    config = PI05Config(
        paligemma_variant=relay["model"],
        action_expert_variant=relay["model"],
        chunk_size=int(data["actions"].shape[1]),
        n_action_steps=int(data["actions"].shape[1]),
        image_resolution=(size, size),
        tokenizer_max_length=int(data["tokens"].shape[1]),
        train_expert_only=args.expert_only,
        device="cpu",
        input_features={
            **{name: PolicyFeature(type=FeatureType.VISUAL, shape=(3, size, size)) for name in cameras},
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(state_dim,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))},
    )
    torch.manual_seed(0)
    policy = PI05Policy(config)
    policy.train()
    batch = {
        **{name: images[:, i].contiguous() for i, name in enumerate(cameras)},
        "observation.language.tokens": torch.from_numpy(data["tokens"]),
        "observation.language.attention_mask": torch.from_numpy(data["token_mask"]),
        "action": torch.from_numpy(data["actions"]),
    }
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.01)

    def step() -> None:
        loss, _ = policy.forward(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up, as bench_model's median_seconds does
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    print(
        json.dumps(
            {
                "seconds": times,
                "median": statistics.median(times),
                "weights": sum(p.numel() for p in policy.parameters()),
                "trained": sum(p.numel() for p in trained),
                "threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
