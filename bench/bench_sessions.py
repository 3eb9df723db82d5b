"""Benchmarks of training-loop sessions (issue 5), measured in one run; prints figures and ratios.

1. Step overhead: --steps pipelined forward_backward + optim_step pairs through the service (the
   SDK, the API served by uvicorn in its own process, Redis, one Celery worker process running
   pi05-tiny), against the same steps run in this process on the engine's TrainingSession: the
   same model, batches and learning rate, in the same run (in-process, then the service, then
   in-process again; the ratio uses the mean of the two in-process runs). The batch is sized so
   that an in-process step takes about 100 ms here (--batch to choose). Three configurations:
   - torch on all cores, two cameras at 224x224 (pi05's own size). pi05-tiny spends ~2 ms of CPU
     per datum, so this moves some 15x more frame bytes per second of compute than pi05 on a GPU,
     and every byte the client, the API and Redis move is CPU taken from the model;
   - the same at 64x64 (a twelfth of the bytes): the per-call cost apart from moving frames;
   - torch on one thread in both runs, 224x224: the other core moves the data, as a GPU host's
     CPU would while the GPU computes.
   Goal: at most 1.2x.
2. Upload rate of one batch of 32 datums with 2 cameras at 224x224 (9.6 MB of frames): from the
   call to the API's acknowledgement (encode, POST, append to the session's Redis stream), for
   each codec, in MB of frames per second, against a plain loopback HTTP upload of the same
   bytes (httpx POST to a bare endpoint that reads the body, served the same way). The session is
   marked ready without a worker, so nothing else competes for the CPU while uploads are timed.

Needs PostgreSQL and Redis on 127.0.0.1 (scripts/services.sh); uses the database
relay_bench_sessions and Redis database 13, both emptied first.

    python bench/bench_sessions.py [--steps 200] [--batch N] [--uploads 10]

The machine is shared (2 cores), so expect noise; every ratio compares runs of this one process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import redis
import torch
from fastapi import FastAPI, Request

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_api import Served, Worker, fresh_service  # noqa: E402

from relay.optimizer import AdamParams  # noqa: E402

PG_ADMIN = os.environ.get("RELAY_BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("RELAY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
DATABASE = "relay_bench_sessions"
HORIZON = 10
LR = 1e-4
DISTINCT_BATCHES = 4


def bare_upload_app() -> FastAPI:
    """The baseline: an endpoint that reads the whole body and answers with its length."""
    app = FastAPI()

    @app.post("/upload")
    async def upload(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    return app


def camera_frame(rng: np.random.Generator, size: int = 224) -> np.ndarray:
    """A camera-like frame (smooth gradients, flat shapes, mild sensor noise): what JPEG sees in practice."""
    y, x = np.mgrid[0:size, 0:size]
    shift = rng.integers(0, 255, 3)
    frame = np.stack([(x + shift[0]) % 256, (y + shift[1]) % 256, ((x + y) // 2 + shift[2]) % 256], -1)
    largest = max(4, size // 5)
    for _ in range(6):
        side = rng.integers(largest // 3, largest)
        top, left = rng.integers(0, size - side), rng.integers(0, size - side)
        frame[top : top + side, left : left + side] = rng.integers(0, 255, 3)
    noise = rng.normal(0, 2.0, frame.shape)
    return np.clip(frame + noise, 0, 255).astype(np.uint8)


def make_batch(seed: int, count: int, size: int = 224) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "observation": {
                "image": {"base_0_rgb": camera_frame(rng, size), "left_wrist_0_rgb": camera_frame(rng, size)},
                "state": rng.uniform(-1, 1, 8).astype(np.float32),
                "prompt": "pick up the fork",
            },
            "actions": rng.uniform(-1, 1, (HORIZON, 7)).astype(np.float32),
            "weight": 1.0,
        }
        for _ in range(count)
    ]


def as_datums(batch: list[dict[str, Any]]) -> list[Any]:
    from relay.training import types

    return [types.Datum(**item) for item in batch]


# -- 1. step overhead ------------------------------------------------------------------------------


def in_process_steps(batches: list[list[dict[str, Any]]], steps: int) -> tuple[float, list[float]]:
    """Seconds for `steps` pairs on the engine here, and each pair's time."""
    from relay_engine.families.pi05.session import SessionSpec, TrainingSession

    session = TrainingSession(SessionSpec(base_model="pi05-tiny"))
    for batch in batches[:2]:  # warm up
        session.forward_backward(batch)
        session.optim_step(AdamParams(learning_rate=LR))
    pairs = []
    started = time.perf_counter()
    for step in range(steps):
        begun = time.perf_counter()
        session.forward_backward(batches[step % len(batches)])
        session.optim_step(AdamParams(learning_rate=LR))
        pairs.append(time.perf_counter() - begun)
    return time.perf_counter() - started, pairs


def service_steps(url: str, key: str, batches: list[list[dict[str, Any]]], steps: int) -> dict[str, Any]:
    from relay.training import ServiceClient, types

    datums = [as_datums(b) for b in batches]
    service = ServiceClient(url, key, progress=False)
    with service.create_lora_training_client("pi05-tiny") as training_client:
        for batch in datums[:2]:  # warm up
            training_client.forward_backward(batch, "flow_matching")
            training_client.optim_step(types.AdamParams(learning_rate=LR)).result()
        futures = []
        started = time.perf_counter()
        for step in range(steps):
            futures.append(training_client.forward_backward(datums[step % len(datums)], "flow_matching"))
            futures.append(training_client.optim_step(types.AdamParams(learning_rate=LR)))
        futures[-1].result()
        elapsed = time.perf_counter() - started
        losses = [f.result().metrics["loss"] for f in futures[::2]]
    service.close()
    return {"seconds": elapsed, "first_loss": losses[0], "last_loss": losses[-1]}


def calibrate(target_ms: float) -> int:
    """The batch size whose in-process forward_backward + optim_step (with this process's torch
    threads) is closest to `target_ms`."""
    from relay_engine.families.pi05.session import SessionSpec, TrainingSession

    session = TrainingSession(SessionSpec(base_model="pi05-tiny"))
    best, best_gap = 1, float("inf")
    for size in (8, 16, 24, 32, 40, 48, 56, 64):
        batch = make_batch(size, size)
        session.forward_backward(batch)
        session.optim_step(AdamParams(learning_rate=LR))
        times = []
        for _ in range(5):
            started = time.perf_counter()
            session.forward_backward(batch)
            session.optim_step(AdamParams(learning_rate=LR))
            times.append(1000 * (time.perf_counter() - started))
        median = statistics.median(times)
        if abs(median - target_ms) < best_gap:
            best, best_gap = size, abs(median - target_ms)
        if median > target_ms:
            break
    return best


def step_report(url: str, key: str, size: int, frame: int, steps: int, label: str) -> dict[str, Any]:
    """The service's run between two in-process runs of the same steps."""
    batches = [make_batch(1000 + i, size, frame) for i in range(DISTINCT_BATCHES)]
    megabytes = sum(f.nbytes for d in batches[0] for f in d["observation"]["image"].values()) / 1e6
    first, pairs = in_process_steps(batches, steps)
    service = service_steps(url, key, batches, steps)
    second, pairs_again = in_process_steps(batches, steps)
    local = (first + second) / 2
    pair_ms = 1000 * statistics.median(pairs + pairs_again)
    print(f"\n  {label}: {size} datums, 2 cameras at {frame}x{frame} ({megabytes:.1f} MB of frames a step)")
    print(f"  in-process: {first:.2f} s and {second:.2f} s (median pair {pair_ms:.0f} ms)")
    print(
        f"  service:    {service['seconds']:.2f} s ({1000 * service['seconds'] / steps:.0f} ms a pair; "
        f"loss {service['first_loss']:.3f} -> {service['last_loss']:.3f})"
    )
    print(f"  ratio service / in-process: {service['seconds'] / local:.3f}")
    return {
        "batch": size,
        "frame": frame,
        "steps": steps,
        "frames_mb_per_step": megabytes,
        "in_process_s": [first, second],
        "in_process_median_pair_ms": pair_ms,
        **service,
        "ratio": service["seconds"] / local,
    }


# -- 2. upload rate --------------------------------------------------------------------------------


def ready_session_without_worker(database_url: str, home: Path, key_user: str) -> dict[str, Any]:
    """A session row marked ready by a stand-in 'worker' that runs nothing, so uploads are timed alone."""
    from sqlalchemy import select

    from relay.training.config import SessionConfig
    from relay_api import sessions
    from relay_api.db import session_factory
    from relay_api.models import User
    from relay_api.settings import Settings
    from relay_worker import session_lifecycle

    settings = Settings(home=home, database_url=database_url, broker_url=REDIS_URL, lease_seconds=3600)
    factory = session_factory(settings)
    with factory() as session:
        user_id = session.execute(select(User.id).where(User.name == key_user)).scalar_one()
        row, _ = sessions.create(session, user_id, SessionConfig(base_model="pi05-tiny"), None, settings)
    claim = session_lifecycle.claim(factory, settings, row["id"], "bench:uploads-only")
    assert claim is not None
    session_lifecycle.mark_ready(factory, settings, claim, {"model": "pi05-tiny"})
    with factory() as session:
        return sessions.get(session, user_id, row["id"])


def upload_rates(url: str, key: str, database_url: str, home: Path, uploads: int) -> dict[str, Any]:
    from relay import Codec, http_client
    from relay.training import TrainingClient, types, wire

    batch = as_datums(make_batch(99, 32))
    frame_bytes = sum(f.nbytes for d in batch for f in d.observation["image"].values())
    results: dict[str, Any] = {"frame_mb": frame_bytes / 1e6}

    raw_body = wire.encode({"op": "forward_backward", "datums": types.batch_message(batch, Codec.LOSSLESS)})
    bare = Served("bench_sessions:bare_upload_app", dict(os.environ), app_dir=ROOT / "bench")
    try:
        with httpx.Client(timeout=60) as client:
            client.post(f"{bare.url}/upload", content=raw_body)
            times = []
            for _ in range(uploads):
                started = time.perf_counter()
                client.post(f"{bare.url}/upload", content=raw_body).raise_for_status()
                times.append(time.perf_counter() - started)
        results["plain_http"] = {"seconds": statistics.median(times), "wire_mb": len(raw_body) / 1e6}
    finally:
        bare.stop()

    http = http_client.Client(url, key)
    for codec in (Codec.LOSSLESS, Codec.JPEG_Q95):
        row = ready_session_without_worker(database_url, home, "bench")
        session = {"id": row["id"], "info": {}, "idle_timeout_seconds": 600}
        training_client = TrainingClient(http, session, codec)
        training_client._calls.max_in_flight = 10_000  # nothing runs the calls: do not wait for results
        times = []
        for index in range(uploads + 1):
            started = time.perf_counter()
            future = training_client.forward_backward(batch, "flow_matching")
            future._call.sent.wait()
            if future.done():  # it could not be sent
                future.result()
            if index:  # the first one warms the connection
                times.append(time.perf_counter() - started)
        wire_bytes = len(wire.encode({"op": "forward_backward", "datums": types.batch_message(batch, codec)}))
        training_client._calls.close(drain=False)
        redis.Redis.from_url(REDIS_URL).delete(f"relay:session:{row['id']}:calls")
        results[codec.value] = {"seconds": statistics.median(times), "wire_mb": wire_bytes / 1e6}
    http.close()
    return results


def upload_report(url: str, key: str, database_url: str, home: Path, uploads: int) -> dict[str, Any]:
    print(f"\n2. upload of a batch of 32 datums, 2 cameras at 224x224 (median of {uploads})")
    results = upload_rates(url, key, database_url, home, uploads)
    frames = results["frame_mb"]
    plain = frames / results["plain_http"]["seconds"]
    print(f"{'':24}{'wire MB':>9}{'ms':>8}{'frames MB/s':>13}{'x plain':>9}")
    for name in ("plain_http", "lossless", "jpeg_q95"):
        figures = results[name]
        rate = frames / figures["seconds"]
        milliseconds = 1000 * figures["seconds"]
        print(f"{name:24}{figures['wire_mb']:9.2f}{milliseconds:8.1f}{rate:13.0f}{rate / plain:9.2f}")
        figures["frames_mb_per_s"] = rate
        figures["ratio_to_plain"] = rate / plain
    return results


# -- the run ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--batch", type=int, default=0, help="datums per step (0: the size of a ~100 ms step)"
    )
    parser.add_argument("--uploads", type=int, default=10)
    parser.add_argument("--parts", default="steps,uploads", help="which parts to run: steps, uploads")
    args = parser.parse_args()

    home, env, settings, key = fresh_service(DATABASE, REDIS_URL, "relay-bench-sessions-")

    parts = set(args.parts.split(","))
    worker = Worker(env, home / "worker.log")
    api = Served("relay_api.app:create_app", env)
    report: dict[str, Any] = {"steps": {}}
    threads = torch.get_num_threads()
    try:
        if "steps" in parts:
            size = args.batch or calibrate(100.0)
            print(f"1. {args.steps} pipelined forward_backward + optim_step pairs; pi05-tiny LoRA (rank 32)")
            for frame in (224, 64):
                label = f"torch on {threads} threads"
                report["steps"][f"{frame}px"] = step_report(api.url, key, size, frame, args.steps, label)
            # A GPU leaves its host's CPU free for moving data; on this CPU-only machine, one torch
            # thread in both runs leaves the other core to the client, the API and Redis.
            worker.stop()
            worker = Worker(env, home / "worker.log", threads=1)
            torch.set_num_threads(1)
            size = args.batch or calibrate(100.0)
            label = "torch on 1 thread (the other core moves the data, as a GPU host's CPU would)"
            report["steps"]["224px_one_thread"] = step_report(api.url, key, size, 224, args.steps, label)
            torch.set_num_threads(threads)
        if "uploads" in parts:
            report["uploads"] = upload_report(api.url, key, settings.database_url, home, args.uploads)
    finally:
        api.stop()
        worker.stop()
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        redis.Redis.from_url(REDIS_URL).flushdb()
        shutil.rmtree(home, ignore_errors=True)

    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_sessions.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
