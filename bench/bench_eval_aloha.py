"""Closed-loop evaluation in gym-aloha (MuJoCo), which the test suite does not run: what a step
costs on this machine, and what `relay eval` makes of it, in-process and with the environments in
processes of their own.

    pip install -e ".[aloha]"        # gym-aloha, MuJoCo, dm-control; rendering needs libEGL
    python bench/bench_eval_aloha.py [--env gym_aloha/AlohaTransferCube-v0] [--episodes 2]
                                     [--max-steps 10] [--rounds 3]

What runs, in interleaved rounds:
- the environment alone: `--episodes` episodes of `--max-steps` random actions, one environment
  (gymnasium.make with the ready mapping's options: pixels_agent_pos, a 480x640 top camera);
- `evaluate_in_env("pi05-tiny", ...)` with the environments stepped one after another in this
  process (SyncVectorEnv), and each in a process of its own (`asynchronous=True`, AsyncVectorEnv),
  one environment per episode, 5 actions per chunk.

The `pi05-tiny` base knows nothing of ALOHA, so success is not the point (it is printed); the
harness is: the 14 joint positions mapped to the state, the top camera to the model, actions
unclipped as gym-aloha takes them, info read each step. Figures: environment steps/s (medians over
--rounds) and the ratios async/sync and relay-eval/env-alone. JSON in bench/out/bench_eval_aloha.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relay_engine.envs import evaluate_in_env
from relay_engine.envs.evaluate import EnvMaker
from relay_engine.envs.mapping import mapping_for

HERE = Path(__file__).resolve().parent


def env_alone(env_id: str, episodes: int, max_steps: int, seed: int) -> float:
    """Steps/s of the environment under random actions (rendering included, no model)."""
    env = EnvMaker(env_id, mapping_for(env_id), max_steps, {}).make()
    steps, started = 0, time.perf_counter()
    try:
        for episode in range(episodes):
            env.reset(seed=seed + episode)
            env.action_space.seed(seed + episode)
            for _ in range(max_steps):
                _, _, terminated, truncated, _ = env.step(env.action_space.sample())
                steps += 1
                if terminated or truncated:
                    break
    finally:
        env.close()
    return steps / (time.perf_counter() - started)


def relay_eval(env_id: str, episodes: int, max_steps: int, seed: int, asynchronous: bool) -> dict[str, Any]:
    report = evaluate_in_env(
        "pi05-tiny",
        env_id,
        episodes=episodes,
        max_steps=max_steps,
        seed=seed,
        num_envs=episodes,
        asynchronous=asynchronous,
        actions_per_chunk=5,
    )
    return {
        "steps_per_second": report.steps / report.seconds,
        "success_rate": report.success_rate,
        "forward_passes": report.forward_passes,
        "steps": report.steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="gym_aloha/AlohaTransferCube-v0")
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.env}: {args.episodes} episodes x {args.max_steps} steps, {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip

    alone: list[float] = []
    sync: list[dict[str, Any]] = []
    spawned: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        alone.append(env_alone(args.env, args.episodes, args.max_steps, args.seed))
        order = [False, True] if round_ % 2 == 0 else [True, False]
        for asynchronous in order:
            result = relay_eval(args.env, args.episodes, args.max_steps, args.seed, asynchronous)
            (spawned if asynchronous else sync).append(result)
        print(
            f"round {round_ + 1}: env alone {alone[-1]:.2f} steps/s, relay eval in-process "
            f"{sync[-1]['steps_per_second']:.2f}, in processes {spawned[-1]['steps_per_second']:.2f}",
            flush=True,
        )

    def median(results: list[dict[str, Any]]) -> float:
        return statistics.median(r["steps_per_second"] for r in results)

    figures = {
        "env": args.env,
        "env_alone_steps_per_second": statistics.median(alone),
        "relay_eval_sync_steps_per_second": median(sync),
        "relay_eval_async_steps_per_second": median(spawned),
        "async_over_sync": statistics.median(
            a["steps_per_second"] / s["steps_per_second"] for a, s in zip(spawned, sync, strict=True)
        ),
        "sync_over_env_alone": median(sync) / statistics.median(alone),
        "success_rate": float(np.mean([r["success_rate"] for r in sync + spawned])),
        "load_average_end": os.getloadavg()[0],
    }
    print(f"\n{'':<36} {'steps/s':>8}")
    print(f"{'environment alone (random actions)':<36} {figures['env_alone_steps_per_second']:8.2f}")
    print(f"{'relay eval, envs in-process':<36} {figures['relay_eval_sync_steps_per_second']:8.2f}")
    print(f"{'relay eval, envs in processes':<36} {figures['relay_eval_async_steps_per_second']:8.2f}")
    print(f"in processes / in-process: {figures['async_over_sync']:.2f}x; "
          f"in-process / env alone: {figures['sync_over_env_alone']:.2f}x; "
          f"success (pi05-tiny base, untrained for ALOHA): {figures['success_rate']:.0%}")  # fmt: skip
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_eval_aloha.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
