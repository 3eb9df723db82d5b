"""Relay end to end on a laptop: the embedded server, a synthetic dataset of a task the pi05-tiny
base never saw, a fine-tune through the SDK, the merged weights downloaded, and the proof: the
held-out action error of the blind baseline, the base and the fine-tuned model side by side, then
each acting in the simulator the task was recorded in.

    python examples/demo.py            # a few minutes on 2 CPU cores
    RELAY_DEMO_STEPS=500 python examples/demo.py   # shorter, on a slow or busy machine
    RELAY_DEMO_MODEL=smolvla-tiny python examples/demo.py   # the same task with SmolVLA

It starts `relay server` (SQLite, a broker that needs no server, one worker) with its data in
./.relay-demo, prints the web console's address and key so you can watch the job's loss fall in a
browser, and stops the server at the end (on a terminal, once you press Enter). It measures this
machine's step rate over the job's first steps and says so if the run will take far longer than on
a quiet 2-core machine. Ctrl-C while the job trains leaves the server and its job running, and
says how to follow, cancel and stop them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HOME = Path(".relay-demo").absolute()
PORT = int(os.environ.get("RELAY_DEMO_PORT", "8765"))
# The robot policy the demo tunes: pi05-tiny, or smolvla-tiny (any tiny robot model of the registry).
MODEL = os.environ.get("RELAY_DEMO_MODEL", "pi05-tiny")
# The fine-tune: sized for about two minutes on 2 CPU cores. pi05-tiny: every weight trains
# (finetune="full"), since the tiny base's vision tower has to learn the new colour, which LoRA on
# the action expert cannot, at 2e-3. Another model trains at its own defaults (smolvla-tiny:
# lerobot's default training, the action expert and the projections, at 1e-3).
STEPS = int(os.environ.get("RELAY_DEMO_STEPS", "1500"))
RECIPE: dict[str, dict[str, Any]] = {
    "pi05-tiny": {"finetune": "full", "batch_size": 16, "learning_rate": 2e-3},
}
# A quiet 2-core machine trains the demo's job at about this rate (pi05-tiny: 1,500 steps in about 2
# minutes); a run projected to take more than SLOW_FACTOR times as long is called out, with how to
# shorten it.
QUIET_STEPS_PER_SECOND = {"pi05-tiny": 12.5, "smolvla-tiny": 40.0}
SLOW_FACTOR = 2.0
# Enough episodes that the gripper's state cannot tell them apart: a policy that learned them by
# heart would fail on the held-out ones; this one has to find the dot.
EPISODES = 400
HELD_OUT_EPISODES = 40
# Closed-loop episodes in relay/Dot-v0, seeded apart from every episode written above.
CLOSED_LOOP_EPISODES = 40
CLOSED_LOOP_SEED = 1000
CAMERAS = {"observation.images.top": (64, 64), "observation.images.wrist": (64, 64)}
# The dataset's layout: what users bring today, LeRobot v3.0 with the cameras as H.264 mp4s
# (`relay datasets synth --format v3.0 --video`). {"format": "v2.1", "video": False} writes PNG
# frames instead. Since video is decoded once when the dataset is first opened, the two train at
# about the same speed (before that, per-sample decoding made this demo 45% slower on video).
LAYOUT: dict[str, Any] = {"format": "v3.0", "video": True}


def start_server() -> subprocess.Popen[bytes]:
    """`relay server` in the background; returns once its API answers."""
    os.environ["RELAY_HOME"] = str(HOME)  # where the server writes, and the SDK finds, the local key
    server = subprocess.Popen(
        [sys.executable, "-m", "relay.cli", "server", "--port", str(PORT)],
        stdout=open(HOME / "server.log", "wb"),  # noqa: SIM115 - the server outlives this block
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C in the terminal reaches the demo, not its server and job
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"relay server exited; see {HOME / 'server.log'}")
        try:
            if (
                httpx.get(f"http://127.0.0.1:{PORT}/healthz", timeout=1).status_code == 200
                and (HOME / "client.json").exists()
            ):
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.terminate()
    sys.exit(f"relay server did not start in 2 minutes; see {HOME / 'server.log'}")


def measured_rate(job: Any) -> float | None:
    """The job's steps per second over its first metrics windows (the engine's own measure), once
    it has trained 20 steps; None if it ended first."""
    while not job.refresh().done:
        rates = [e["steps_per_second"] for e in job.events() if e.get("step", 0) >= 20 and "loss" in e]
        if rates:
            return float(rates[0])
        time.sleep(1)
    return None


def say_if_slow(job: Any) -> None:
    """Measure the first steps; a run that will take far longer than on a quiet 2-core machine says
    so, with the time it expects and the setting that shortens it."""
    print("measuring this machine's step rate over the first 20 steps ...", flush=True)
    rate = measured_rate(job)
    if rate is None or rate <= 0:
        return
    expected, quiet = STEPS / rate, STEPS / QUIET_STEPS_PER_SECOND.get(MODEL, rate)
    print(f"{rate:.3g} steps/s: {STEPS:,} steps will take about {expected / 60:.0f} min", flush=True)
    if expected > SLOW_FACTOR * quiet:
        print(
            f"slower than a quiet 2-core machine (about {quiet / 60:.0f} min there): this one is busy or "
            f"small. RELAY_DEMO_STEPS=500 bash scripts/demo.sh takes about {500 / rate / 60:.0f} min "
            "(fewer steps learn less: the table will show by how much)",
            flush=True,
        )


def say_it_runs_on(job: Any, server: subprocess.Popen[bytes]) -> None:
    """Ctrl-C while the job trains: the server and the job run on; say how to follow, cancel, stop."""
    commands = [
        (f"export RELAY_HOME={HOME}", ""),
        (f"relay fine-tunes events {job.id} --follow", "follow the job again"),
        (f"relay fine-tunes cancel {job.id}", "cancel it"),
        (f"kill {server.pid}", "stop the server"),
    ]
    width = max(len(command) for command, why in commands if why) + 4
    lines = [f"  {command.ljust(width)}# {why}" if why else f"  {command}" for command, why in commands]
    head = f"\nthe demo's server keeps running (pid {server.pid}, data in {HOME}); in another shell:"
    print("\n".join([head, *lines]), file=sys.stderr)


def main() -> None:
    from relay import families

    family = families.family_of(MODEL)
    if family is None or family.name == families.RTJ:
        robot_models = families.models_where(lambda spec: spec.name != families.RTJ)
        sys.exit(f"RELAY_DEMO_MODEL: {MODEL!r} is not a robot policy; one of {', '.join(robot_models)}")
    shutil.rmtree(HOME, ignore_errors=True)
    HOME.mkdir(parents=True)

    # 1. A task the pi05-tiny base never saw: move to the orange dot (orange is held out of its
    #    pretraining, scripts/pretrain_tiny.py). Its actions depend on what the cameras see.
    from relay_engine.datasets import open_dataset, write_synthetic_dataset

    task: dict[str, Any] = {"colours": ["orange"], "cameras": CAMERAS, "episode_length": (20, 30), **LAYOUT}
    print("writing the datasets ...", flush=True)
    dataset_dir = write_synthetic_dataset(HOME / "orange-dot", episodes=EPISODES, seed=0, **task)
    held_out_dir = write_synthetic_dataset(
        HOME / "orange-dot-held-out", episodes=HELD_OUT_EPISODES, seed=1, **task
    )
    layout = f"LeRobot {LAYOUT['format']}, " + (
        "cameras as H.264 video" if LAYOUT.get("video") else "PNG frames"
    )
    print(f"dataset: {dataset_dir} ({EPISODES} episodes, a top and a wrist camera, 2-D state and action)")
    print(f"  written as {layout}")
    print(f"held-out episodes: {held_out_dir} ({HELD_OUT_EPISODES} more, never trained on)")

    print("starting relay server ...", flush=True)
    server = start_server()
    keep_server = False  # Ctrl-C while the job trains leaves it, and the server, running
    try:
        # 2. A recipe job through the SDK, as docs/recipe-jobs.md shows it.
        from relay.sft.config import SFTConfig
        from relay.sft.train import train

        config = SFTConfig(
            model=MODEL, dataset_name=str(dataset_dir), steps=STEPS, name="demo", **RECIPE.get(MODEL, {})
        )
        job = train(config)
        print(f"job {job.id}: {job.status}", flush=True)
        from relay import client_config

        local = client_config.resolve()
        print(f"\nwatch it in a browser: open {local.base_url}/ and sign in with the API key")
        print(f"    {local.api_key}")
        print(f"(the loss curve grows as the job trains; the key is also in {HOME / 'client.json'})\n")
        try:
            say_if_slow(job)
            job.wait(poll=1)  # progress on stderr: a bar on a terminal, plain lines otherwise
        except KeyboardInterrupt:
            keep_server = True
            say_it_runs_on(job, server)
            sys.exit(130)
        print(f"{job.status} at step {job.step}, loss {job.loss:.4f} (mean of the last 10 steps)")

        # 3. The merged weights.
        output = job.download(HOME / "model")
        print("downloaded:", sorted(p.name for p in output.iterdir()))
        if sys.stdin.isatty():
            input(f"\nthe console stays up at {local.base_url}/ until you press Enter ")
    finally:
        if not keep_server:
            server.terminate()
            server.wait(timeout=30)

    # 4. Did fine-tuning work? Sampled chunks on the held-out episodes against the dataset's, beside
    #    the blind baseline (always the training frames' mean chunk) and the base before tuning. The
    #    headline is the error of the mean of CHUNKS_PER_FRAME chunks a frame (one chunk's error
    #    carries the sampler's spread, which the mean cuts); the blind baseline samples nothing, so
    #    its one chunk is its mean, and it has no spread.
    from relay.events import CHUNKS_PER_FRAME
    from relay_engine.acting import read_norm_stats
    from relay_engine.families import family_named
    from relay_engine.families.base import EvaluationRequest
    from relay_engine.families.robot_scores import ActionChunks, BlindPolicy, blind_baseline, with_norm_stats

    print("\nscoring on the held-out episodes ...", flush=True)
    # Everything in the tuned model's units: its norm_stats.json (the training episodes' statistics,
    # by its own method: pi05's quantiles, SmolVLA's mean and std).
    method = read_norm_stats(output).method
    train_set = open_dataset(str(dataset_dir), normalization=method)
    held_out = with_norm_stats(open_dataset(str(held_out_dir), normalization=method), output)
    frames = list(range(len(held_out)))
    blind = blind_baseline(ActionChunks(train_set), range(len(train_set)), ActionChunks(held_out), frames).mse
    engine_family = family_named(family.name)

    def scores(model: str) -> dict[str, Any]:
        request = EvaluationRequest(
            model=model, dataset=str(held_out_dir), chunks=CHUNKS_PER_FRAME, norm_stats_from=str(output)
        )
        return engine_family.evaluate(request)

    base, tuned = scores(MODEL), scores(str(output))
    print(
        f"\nheld-out action error ({len(frames)} frames; mean squared error, normalized units; the error "
        f"of the mean of {CHUNKS_PER_FRAME} sampled chunks a frame, one chunk's and their spread beside):"
    )
    print(f"  {'policy':<44} {'error':>7}  {'vs blind':>8}  {'one chunk':>9}  {'spread':>7}")
    blind_name = "blind: the training frames' mean chunk"
    print(f"  {blind_name:<44} {blind:7.4f}  {1.0:7.2f}x  {blind:9.4f}  {0.0:7.4f}")
    for name, report in (
        (f"{MODEL} base, before fine-tuning", base),
        (f"fine-tuned ({STEPS} steps, {job.id})", tuned),
    ):
        error = report["mean_action_mse"]
        print(
            f"  {name:<44} {error:7.4f}  {blind / error:7.2f}x  "
            f"{report['mse']:9.4f}  {report['action_spread']:7.4f}"
        )

    # 5. Does the tuned policy work in closed loop? It acts in relay/Dot-v0, the environment the
    #    dataset's demonstrations were recorded in, on episodes it never saw (their own seeds):
    #    success is reaching the orange dot within the episode's 50 steps.
    from relay_engine.envs import evaluate_in_env
    from relay_engine.errors import ConfigError

    episodes = f"{CLOSED_LOOP_EPISODES} new episodes, seed {CLOSED_LOOP_SEED}"
    print(f"\nclosed loop in relay/Dot-v0 ({episodes}) ...", flush=True)
    scene = {"colours": task["colours"], "cameras": CAMERAS}
    print(f"  {'policy':<44} {'success':>7}  {'mean steps':>10}")
    policies: tuple[tuple[str, Any], ...] = (
        ("blind: the training frames' mean chunk", BlindPolicy.from_dataset(train_set)),
        (f"{MODEL} base, before fine-tuning", MODEL),
        (f"fine-tuned ({job.id})", str(output)),
    )
    for name, model in policies:
        try:
            acted = evaluate_in_env(
                model, "relay/Dot-v0", episodes=CLOSED_LOOP_EPISODES, seed=CLOSED_LOOP_SEED,
                env_options=scene, videos=HOME / "videos" / name.split(" ")[0].rstrip(":"),
            )  # fmt: skip
        except ConfigError as refused:  # a base that acts for no robot yet (SmolVLA's) says why
            print(f"  {name:<44} (does not act: {refused})")
            continue
        print(f"  {name:<44} {acted.success_rate:7.0%}  {acted.mean_length:10.1f}")
    print(f"  (videos of the first episodes: {HOME / 'videos'})")


if __name__ == "__main__":
    main()
