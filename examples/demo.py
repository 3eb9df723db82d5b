"""Relay end to end on a laptop: the embedded server, a synthetic dataset, a pi05-tiny fine-tune
through the SDK, the merged weights downloaded and a few actions sampled from them.

    python examples/demo.py            # about two minutes on 2 CPU cores

It starts `relay server` (SQLite, a broker that needs no server, one worker) with its data in
./.relay-demo, prints the web console's address and key so you can watch the job's loss fall in a
browser, and stops the server at the end (on a terminal, once you press Enter).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import torch

HOME = Path(".relay-demo").absolute()
PORT = int(os.environ.get("RELAY_DEMO_PORT", "8765"))


def start_server() -> subprocess.Popen[bytes]:
    """`relay server` in the background; returns once its API answers."""
    os.environ["RELAY_HOME"] = str(HOME)  # where the server writes, and the SDK finds, the local key
    server = subprocess.Popen(
        [sys.executable, "-m", "relay.cli", "server", "--port", str(PORT)],
        stdout=open(HOME / "server.log", "wb"),  # noqa: SIM115 - the server outlives this block
        stderr=subprocess.STDOUT,
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


def main() -> None:
    shutil.rmtree(HOME, ignore_errors=True)
    HOME.mkdir(parents=True)

    # 1. A dataset whose actions depend on what the camera sees: move to the dot of the task's colour.
    from relay_engine.datasets import open_dataset, write_synthetic_dataset

    dataset_dir = write_synthetic_dataset(HOME / "look-and-move", episodes=40, seed=0)
    print(f"dataset: {dataset_dir} (40 episodes, 2 cameras, 2-D state and action)")

    print("starting relay server ...")
    server = start_server()
    try:
        # 2. A recipe job through the SDK, exactly as docs/recipe-jobs.md shows it.
        from relay.sft.config import SFTConfig
        from relay.sft.train import train

        config = SFTConfig(
            model="pi05-tiny",
            dataset_name=str(dataset_dir),
            batch_size=16,
            learning_rate=1e-3,
            steps=200,
            name="demo",
        )
        job = train(config)
        print(f"job {job.id}: {job.status}")
        from relay import _config

        local = _config.resolve()
        print(f"\nwatch it in a browser: open {local.base_url}/ and sign in with the API key")
        print(f"    {local.api_key}")
        print(f"(the loss curve grows as the job trains; the key is also in {HOME / 'client.json'})\n")
        job.wait(poll=1)
        print(job.status, job.step, f"{job.loss:.4f}")
        print("last events:", job.events()[-3:])

        # 3. The merged weights, and a few actions sampled from them.
        output = job.download(HOME / "model")
        print("downloaded:", sorted(p.name for p in output.iterdir()))
        if sys.stdin.isatty():
            input(f"\nthe console stays up at {local.base_url}/ until you press Enter ")
    finally:
        server.terminate()
        server.wait(timeout=30)

    from relay_engine.models import load_policy

    policy = load_policy(str(output))
    dataset = open_dataset(str(dataset_dir))
    frames = [0, 100, 200, 300]
    batch = policy.collate([dataset[i] for i in frames])
    actions = policy.sample_actions(batch, generator=torch.Generator().manual_seed(0))
    stats = dataset.norm_stats
    width = dataset.summary.action_dim
    print("\nfirst action of each sampled chunk vs the dataset's, in dataset units:")
    for row, frame in enumerate(frames):
        predicted = stats.unnormalize_actions(actions[row, 0, :width].numpy())
        expected = stats.unnormalize_actions(batch.actions[row, 0, :width].numpy())
        print(f"  frame {frame:4d}: sampled {np.round(predicted, 3)}  dataset {np.round(expected, 3)}")


if __name__ == "__main__":
    main()
