"""Closed-loop evaluation speed: policy steps/s of `relay eval` ÷ lerobot 0.6.1's `lerobot-eval`, on
the same environment, episodes and policy (issue 19; goal: at least 1.5x).

    python bench/bench_eval.py [--lerobot-python PATH] [--episodes 8] [--batch 8] [--max-steps 40]
                               [--actions-per-chunk 5] [--rounds 3]

What runs: `pi05-tiny` trained a few steps by Relay's Trainer on a synthetic dataset shaped as
PushT's (one 96x96 camera `observation.image`, state 2, action 2), then, in interleaved rounds
(the order alternating), each side as a fresh process on that output directory:
- Relay: `relay eval OUT --env gym_pusht/PushT-v0 --json ...` (evaluate_in_env);
- lerobot: `lerobot-eval --policy.path=OUT --env.type=pusht ...` in lerobot's own environment,
  through bench/lerobot_eval_side.py, which teaches lerobot's pi05 the tiny sizes and gives it a
  byte tokenizer (it knows only the full-size model and PaliGemma's tokenizer) and then calls
  lerobot-eval's own main().

Equal on both sides: gym-pusht's PushT-v0 (pixels_agent_pos, 96x96 observations), the output
directory (lerobot strict-loads Relay's model.safetensors and Relay's processors), the episodes
and their seeds (seed + k), the step limit, environments side by side (`--num-envs` =
`--eval.batch_size`, Gymnasium's SyncVectorEnv on both), actions executed per sampled chunk
(`--actions-per-chunk` = `--policy.n_action_steps`, of a chunk of 10), 10 Euler steps, the CPU,
torch's threads, and videos of the first 10 episodes (lerobot-eval always renders 10; its render
size is set to the observation's 96x96, and Relay is asked for the same 10).

Same policy: before the rounds, both sides sample one chunk from PushT's first observation with the
same noise (lerobot_eval_side.py --chunk-of); the largest difference, as a fraction of the action
range, is printed (0.2 to 0.3%, from the two libraries' different resizing of 96x96 to 32x32).

Figures: policy steps/s = environment steps of the episodes ÷ the wall time of the episodes
(Relay's report `seconds`; for lerobot, `eval_policy_all` timed from outside): process start,
model load and making the environments excluded. The whole process's wall time is reported too.
Medians over --rounds; the ratio is the median of each round's ratio. JSON in
bench/out/bench_eval.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_lerobot_opens_output import LEROBOT_TORCH, lerobot_python, make_tiny_output

from relay_engine.datasets.norm_stats import NormStats

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENV_ID = "gym_pusht/PushT-v0"
# PushT's observation: one 96x96 camera (lerobot's `observation.image`), state and action 2 wide.
PUSHT_CAMERAS = {"observation.image": (96, 96)}
# lerobot-eval renders the first 10 episodes into videos, always; Relay is asked for as many.
LEROBOT_VIDEO_EPISODES = 10
GOAL = 1.5
# What lerobot-eval needs on PushT beyond lerobot[pi]: its dataset extra (lerobot_eval imports
# LeRobotDataset) and the simulator.
LEROBOT_EVAL = ("lerobot[pi,dataset]==0.6.1", "gym-pusht>=0.1.5,<0.2")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lerobot-python", help="a Python with lerobot[pi]==0.6.1 and gym-pusht installed")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="environments side by side (both sides)")
    parser.add_argument("--max-steps", type=int, default=40, help="an episode's step limit")
    parser.add_argument("--actions-per-chunk", type=int, default=5, help="of the chunk of 10 (both sides)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=4, help="Relay's training steps of the policy")
    parser.add_argument("--threads", type=int, help="torch threads on both sides (default: torch's)")
    args = parser.parse_args()
    python = lerobot_python(args.lerobot_python)
    ensure_lerobot_eval(python)
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYGAME_HIDE_SUPPORT_PROMPT": "1"}
    if args.threads:
        environment["OMP_NUM_THREADS"] = environment["MKL_NUM_THREADS"] = str(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"training pi05-tiny {args.train_steps} steps on a PushT-shaped dataset ...", flush=True)
        output = make_tiny_output(root, args.train_steps, cameras=PUSHT_CAMERAS)
        chunk_difference = same_chunk(python, output, root, environment)
        print(
            f"same policy: lerobot's action chunk is within {chunk_difference:.2%} of the action range "
            "of Relay's (PushT's first observation, the same noise)",
            flush=True,
        )
        runs: dict[str, list[dict[str, Any]]] = {"relay": [], "lerobot": []}
        for round_index in range(args.rounds):
            order = ["relay", "lerobot"] if round_index % 2 == 0 else ["lerobot", "relay"]
            for side in order:
                work = root / f"{side}-{round_index}"
                run = (
                    run_relay(output, work, args, environment)
                    if side == "relay"
                    else (run_lerobot(python, output, work, args, environment))
                )
                runs[side].append(run)
                print(
                    f"round {round_index + 1} {side:8s} {run['steps']:5d} steps in {run['seconds']:6.2f} s: "
                    f"{run['steps_per_s']:6.1f} steps/s ({run['process_s']:.1f} s with start and load)",
                    flush=True,
                )
    report = summarize(runs, args, chunk_difference)
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_eval.json").write_text(json.dumps(report, indent=2))
    print_summary(report)


def ensure_lerobot_eval(python: Path) -> None:
    """lerobot's environment with what lerobot-eval on PushT imports; installed into it if missing."""
    probe = [str(python), "-c", "import datasets, gym_pusht, lerobot.scripts.lerobot_eval"]
    if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return
    print(f"installing {' '.join(LEROBOT_EVAL)} into {python}'s environment", flush=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", LEROBOT_TORCH, *LEROBOT_EVAL], check=True)


def same_chunk(python: Path, output: Path, root: Path, environment: dict[str, str]) -> float:
    """The largest difference between the action chunks Relay and lerobot sample from the output
    for PushT's first observation (seed 0) and the same noise, as a fraction of the action's range
    (q01 to q99 of the training data)."""
    import gymnasium
    import numpy as np

    from relay_engine.acting import load_acting_policy
    from relay_engine.envs.evaluate import PolicyAdapter
    from relay_engine.envs.mapping import PUSHT_PROMPT, mapping_for

    policy, _, model_dir = load_acting_policy(output, "cpu")
    mapping = mapping_for(ENV_ID)
    __import__(str(mapping.module))
    env = gymnasium.make(ENV_ID, **mapping.make_kwargs)
    observation, _ = env.reset(seed=0)
    env.close()
    batched = {key: np.asarray(value)[None] for key, value in observation.items()}
    stats = NormStats.from_json((output / "norm_stats.json").read_text())
    adapter = PolicyAdapter.build(policy, model_dir, mapping, env, stats, None)
    config = policy.config
    noise = torch.randn(
        (1, config.action_horizon, config.action_dim), generator=torch.Generator().manual_seed(0)
    )
    with torch.inference_mode():
        batch = policy.collate([adapter.sample(batched, 0, PUSHT_PROMPT)])
        chunk = policy.sample_actions(batch, num_steps=10, noise=noise).float().numpy()
    relay_actions = stats.unnormalize_actions(chunk)[0][:, adapter.columns]
    inputs = root / "chunk_inputs.npz"
    np.savez(
        inputs,
        image=observation["pixels"],
        state=observation["agent_pos"],
        noise=noise.numpy(),
        prompt=PUSHT_PROMPT,
    )
    command = [str(python), str(HERE / "lerobot_eval_side.py"), "--chunk-of", str(output), str(inputs)]
    lerobot_environment = {k: v for k, v in environment.items() if k != "PYTHONPATH"}
    done = subprocess.run(command, capture_output=True, text=True, env=lerobot_environment, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"lerobot's chunk failed:\n{done.stderr[-3000:]}")
    lerobot_actions = np.asarray(json.loads(done.stdout.strip().splitlines()[-1]))
    action_range = (stats.actions.q99 - stats.actions.q01)[adapter.columns]
    return float((np.abs(lerobot_actions - relay_actions) / action_range).max())


def run_relay(
    output: Path, work: Path, args: argparse.Namespace, environment: dict[str, str]
) -> dict[str, Any]:
    command = [sys.executable, "-m", "relay.cli", "eval", str(output), "--env", ENV_ID]
    command += [
        "--episodes",
        str(args.episodes),
        "--max-steps",
        str(args.max_steps),
        "--seed",
        str(args.seed),
    ]
    command += ["--num-envs", str(args.batch), "--actions-per-chunk", str(args.actions_per_chunk)]
    command += ["--videos", str(work / "videos"), "--video-episodes", str(LEROBOT_VIDEO_EPISODES)]
    command += ["--device", "cpu", "--num-steps", "10", "--json"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    process_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"relay eval failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    return _figures(report["steps"], report["steps"], report["seconds"], process_s, report["success_rate"])


def run_lerobot(
    python: Path, output: Path, work: Path, args: argparse.Namespace, environment: dict[str, str]
) -> dict[str, Any]:
    counts_file = work / "counts.json"
    work.mkdir(parents=True)
    command = [str(python), str(HERE / "lerobot_eval_side.py"), f"--policy.path={output}", "--env.type=pusht"]
    command += [f"--eval.n_episodes={args.episodes}", f"--eval.batch_size={args.batch}"]
    command += [
        "--eval.use_async_envs=false",
        f"--env.episode_length={args.max_steps}",
        f"--seed={args.seed}",
    ]
    command += [f"--policy.n_action_steps={args.actions_per_chunk}", "--policy.num_inference_steps=10"]
    command += ["--policy.device=cpu", f"--output_dir={work / 'out'}"]
    command += ["--env.visualization_width=96", "--env.visualization_height=96"]
    started = time.perf_counter()
    # lerobot's process has its own environment: Relay's source paths stay out of it.
    lerobot_environment = {k: v for k, v in environment.items() if k != "PYTHONPATH"}
    lerobot_environment["RELAY_BENCH_COUNTS"] = str(counts_file)
    done = subprocess.run(command, capture_output=True, text=True, env=lerobot_environment, check=False)
    process_s = time.perf_counter() - started
    if done.returncode != 0 or not counts_file.exists():
        raise RuntimeError(f"lerobot-eval failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    counts = json.loads(counts_file.read_text())
    info = json.loads((work / "out" / "eval_info.json").read_text())
    success = float(info["overall"]["pc_success"]) / 100
    return _figures(counts["steps"], counts["executed_steps"], counts["seconds"], process_s, success)


def _figures(steps: int, executed: int, seconds: float, process_s: float, success: float) -> dict[str, Any]:
    return {
        "steps": steps,
        "executed_steps": executed,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "process_s": process_s,
        "steps_per_process_s": steps / process_s,
        "success_rate": success,
    }


def summarize(
    runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace, chunk_difference: float
) -> dict[str, Any]:
    relay, lerobot = runs["relay"], runs["lerobot"]
    ratios = [r["steps_per_s"] / o["steps_per_s"] for r, o in zip(relay, lerobot, strict=True)]
    process_ratios = [
        r["steps_per_process_s"] / o["steps_per_process_s"] for r, o in zip(relay, lerobot, strict=True)
    ]
    return {
        "env": ENV_ID,
        "model": "pi05-tiny, trained by Relay on a PushT-shaped dataset",
        "settings": {
            "episodes": args.episodes,
            "envs_side_by_side": args.batch,
            "max_steps": args.max_steps,
            "actions_per_chunk": args.actions_per_chunk,
            "seed": args.seed,
            "rounds": args.rounds,
            "threads": args.threads or torch.get_num_threads(),
            "video_episodes": LEROBOT_VIDEO_EPISODES,
        },
        "chunk_difference_of_action_range": chunk_difference,
        "relay": _side(relay),
        "lerobot": _side(lerobot),
        "ratio": statistics.median(ratios),
        "ratio_with_start_and_load": statistics.median(process_ratios),
        "goal": GOAL,
        "met": statistics.median(ratios) >= GOAL,
    }


def _side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "median_steps_per_s": statistics.median(run["steps_per_s"] for run in runs),
        "median_steps_per_process_s": statistics.median(run["steps_per_process_s"] for run in runs),
        "median_process_s": statistics.median(run["process_s"] for run in runs),
        "runs": runs,
    }


def print_summary(report: dict[str, Any]) -> None:
    settings = report["settings"]
    print("\n== summary ==")
    print(
        f"{report['env']}, {settings['episodes']} episodes of at most {settings['max_steps']} steps, "
        f"{settings['envs_side_by_side']} envs side by side, "
        f"{settings['actions_per_chunk']} actions per chunk, "
        f"medians of {settings['rounds']} rounds"
    )
    relay, lerobot = report["relay"], report["lerobot"]
    for name, side in (("relay eval", relay), ("lerobot-eval", lerobot)):
        print(
            f"  {name:12s} {side['median_steps_per_s']:7.1f} policy steps/s; "
            f"{side['median_steps_per_process_s']:6.1f} counting the whole process "
            f"({side['median_process_s']:.1f} s)"
        )
    verdict = "met" if report["met"] else "MISSED"
    print(
        f"  ratio {report['ratio']:.2f}x (goal >= {report['goal']}x: {verdict}); "
        f"{report['ratio_with_start_and_load']:.2f}x counting process start and model load"
    )
    print("  JSON: bench/out/bench_eval.json")


if __name__ == "__main__":
    main()
