"""Pretrain the pi05-tiny base that Relay ships, on a family of synthetic look-and-move tasks.

    python scripts/pretrain_tiny.py                 # about 3 minutes on 2 CPU cores
    python scripts/pretrain_tiny.py --steps 200 --out /tmp/tiny   # a quick look
    python scripts/pretrain_tiny.py --prompted 0.5 --out /tmp/tiny # half the scenes name their target

The shipped base was made with --prompted 0 (pretraining.json): every scene holds one target dot,
so that base never needs its prompt, and a fine-tune of two tasks whose dots share a scene has to
learn to read it. --prompted F makes a fraction F of the datasets scenes of 2 or 3 dots (and up to
one distractor) whose prompt names the target; such a base has not been measured yet (issue 27).

Users fine-tune pretrained bases, and so should the demo: a pi05-tiny with random weights has a
random vision tower, and LoRA on the action expert (the default) cannot teach it to see. This
script writes a family of small synthetic datasets (relay_engine.datasets.synth) that vary what a
robot's data varies: the target colours, distractor dots, the top camera's placement and zoom,
the wrist camera's zoom, one or two cameras, image shapes, and state and action widths. It
trains every weight of pi05-tiny on all of them at once (each dataset normalized by its own
stats, as a fine-tune would), and writes the result where `load_policy("pi05-tiny")` finds it.

What the base never sees, so that fine-tuning on it is a test of transfer: the colour `orange`
(HELD_OUT_COLOUR). The demo and the learning test fine-tune on an orange-dot dataset.

Everything is seeded: the same command with the same --threads on the same torch build gives the
same file (a different thread count may round differently).

Why these settings: 60 episodes per variant (1,440 in all), so that no policy can learn the
episodes by heart from the gripper's state and has to find the dot; and a dot whose radius is a
fifth of the plane's width, which the tiny vision tower (32 px, 8 px patches) learns to find
within a fine-tune's budget, where a dot half that size was not found at all.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relay.events import Event
from relay.optimizer import AdamParams
from relay_engine.core.data import BatchOrder, DataPosition, batch_loader
from relay_engine.core.loop import LoopState, run_loop
from relay_engine.core.schedule import learning_rate
from relay_engine.datasets import open_dataset, write_synthetic_dataset
from relay_engine.envs.dot_world import COLOURS
from relay_engine.families.pi05.export import write_output
from relay_engine.families.pi05.learner import Pi05Learner
from relay_engine.models import build_policy
from relay_engine.models.weights import TINY_BASE_DIR
from relay_engine.tuning import apply_tuning

HELD_OUT_COLOUR = "orange"
PRETRAIN_COLOURS = [colour for colour in COLOURS if colour != HELD_OUT_COLOUR]


def variant(rng: np.random.Generator, index: int, prompted: float = 0.0) -> dict[str, Any]:
    """The settings of the family's `index`-th dataset: one target dot of one colour (never the
    held-out one), seen by a top camera placed a little differently in each dataset and, mostly,
    a wrist camera; states and actions of several widths.

    With `prompted` > 0, that fraction of the datasets (drawn apart from the rest, so that
    `prompted` 0 gives the family it always gave) are scenes of 2 or 3 dots of different colours
    where each episode's prompt names the target (2 or 3 tasks), some with a distractor: a base
    that only looks for a dot cannot tell which to go to, so these teach it to read the prompt."""
    cameras = {"observation.images.top": (64, 64)}
    if rng.random() < 0.8:
        cameras["observation.images.wrist"] = (64, 64)
    colours = [str(rng.choice(PRETRAIN_COLOURS))]
    distractors = 0
    scenes = np.random.default_rng((7, index))
    if scenes.random() < prompted:
        tasks = int(scenes.integers(2, 4))
        colours = [str(c) for c in scenes.permutation(PRETRAIN_COLOURS)[:tasks]]
        distractors = int(scenes.integers(0, 2))
    return {
        "colours": colours,
        "distractors": distractors,
        "top_view": (
            float(rng.uniform(-0.1, 0.1)),
            float(rng.uniform(-0.1, 0.1)),
            float(rng.uniform(0.9, 1.1)),
        ),
        "wrist_zoom": float(rng.uniform(1.7, 2.3)),
        "cameras": cameras,
        "state_dim": int(rng.integers(2, 5)),
        "action_dim": int(rng.choice([2, 2, 3, 4, 6])),
        "seed": 1000 + index,
    }


def write_family(root: Path, count: int, episodes: int, seed: int, prompted: float = 0.0) -> list[Path]:
    rng = np.random.default_rng(seed)
    paths = []
    for index in range(count):
        settings = variant(rng, index, prompted)
        paths.append(
            write_synthetic_dataset(
                root / f"variant-{index:02d}", episodes=episodes, episode_length=(30, 50), **settings
            )
        )
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=TINY_BASE_DIR, help="where the weights go [the package's]"
    )
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--variants", type=int, default=24)
    parser.add_argument("--episodes", type=int, default=60, help="episodes per variant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prompted",
        type=float,
        default=0.0,
        help="the fraction of datasets whose scenes hold several colours, the prompt naming the target",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--balance-padding",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="weigh the robot's columns' error as much as the padding columns'",
    )
    parser.add_argument("--save-every", type=int, default=500, help="also write the weights every N steps")
    parser.add_argument(
        "--stop-at",
        type=int,
        default=None,
        help="stop at this step of the --steps schedule and write the weights then",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="relay-pretrain-") as tmp:
        paths = write_family(Path(tmp), args.variants, args.episodes, args.seed, args.prompted)
        datasets = [open_dataset(str(path), cache_dir=Path(tmp) / "cache") for path in paths]
        family = torch.utils.data.ConcatDataset(datasets)
        print(
            f"{len(paths)} datasets, {len(family)} frames, written in {time.monotonic() - started:.0f}s",
            flush=True,
        )

        policy = build_policy("pi05-tiny", seed=args.seed)
        policy.config = policy.config.replace(balance_padding=args.balance_padding)
        model = apply_tuning(policy, "full", None, 32, None)
        learner = Pi05Learner(model, seed=args.seed)
        order = BatchOrder(len(family), args.batch_size, args.seed, span_epochs=True)
        batches = batch_loader(family, order, DataPosition(), policy.collate, 0)
        state = LoopState()

        def on_event(event: Event) -> None:
            if "loss" in event:
                elapsed = time.monotonic() - started
                print(
                    f"step {event['step']:5d}/{args.steps}  loss {event['loss']:.4f}  {elapsed:.0f}s",
                    flush=True,
                )

        def after_step(state: LoopState) -> None:
            if state.step % args.save_every == 0 and state.step < args.steps:
                write_output(model, args.out, None)

        run_loop(
            learner,
            lambda: [next(batches)],
            state=state,
            total_steps=args.steps,
            learning_rate_at=lambda step: learning_rate(step, args.steps, args.learning_rate),
            adam=AdamParams(
                learning_rate=0.0, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0
            ),
            on_event=on_event,
            # Stopping early changes nothing before it: the weights at step N are the same either way.
            should_stop=lambda: args.stop_at is not None and state.step >= args.stop_at,
            log_every=50,
            after_step=after_step,
        )
        # The base's config says nothing about how a fine-tune of it weighs its loss.
        policy.config = policy.config.replace(tuning=None, robot_action_dim=None, balance_padding=True)
        write_output(model, args.out, None)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "save_every")}
    record = {
        "script": "scripts/pretrain_tiny.py",
        "held_out_colour": HELD_OUT_COLOUR,
        "steps_taken": state.step,
    }
    (args.out / "pretraining.json").write_text(json.dumps({**record, **settings}, indent=2) + "\n")
    print(f"wrote {args.out} (step {state.step}) in {time.monotonic() - started:.0f}s", flush=True)


if __name__ == "__main__":
    main()
