"""Serving overhead and batching: the policy server against the bare sampler (issue 20; goals:
request latency ÷ bare sample time ≤ 1.2 at 1 client, throughput at 16 clients ≥ 4x one at a time).

    python bench/bench_serving.py [--model pi05-tiny] [--requests 40] [--cameras 2] [--image-size 224]
                                  [--max-batch 16] [--max-wait-ms 2] [--threads N] [--quick]

What runs, on the CPU unless --device says otherwise:
- bare: in this process, the model loaded as the server loads it, one observation at a time:
  `collate` + `sample_actions` (10 Euler steps) from seeded noise, what any server must do per
  request (image decoding excluded: the websocket sends arrays);
- served: `relay serve MODEL --port 0` as a separate process (loopback, an API key), and in this
  process threads of clients with the real openpi-client (`WebsocketClientPolicy`, msgpack-numpy
  arrays), each sending its requests one after another, every request with its own seed;
  at 1 client over HTTP too (httpx, base64 PNG images).

Figures (medians over --requests): latency at 1 client and its ratio to the bare sample time;
throughput (requests/s: requests of all clients ÷ the wall time from the first send to the last
answer) at 1, 4 and 16 concurrent clients, its ratio to 1 client's, and the latency each client
sees there (median, p90); the server's own mean batch. JSON in bench/out/bench_serving.json.
`--quick` runs every path with a few requests (a check that it runs, not figures).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from PIL import Image

from relay.catalog import MODEL_CAMERAS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KEY = "bench-serving-key"
CLIENTS = (1, 4, 16)
LATENCY_GOAL = 1.2
THROUGHPUT_GOAL = 4.0
STATE_DIM = 8


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="pi05-tiny", help="a base model or a model directory")
    parser.add_argument("--requests", type=int, default=40, help="per client, and of the bare sampler")
    parser.add_argument("--cameras", type=int, default=2, choices=(1, 2, 3))
    parser.add_argument("--image-size", type=int, default=224, help="the robot's square camera images")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, help="torch threads, here and in the server (default: torch's)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the 1 / 4 / 16 client runs")
    parser.add_argument("--quick", action="store_true", help="a few requests: check that it runs")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 3, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    observations = [observation(i, args.cameras, args.image_size) for i in range(16)]

    # The machine's speed drifts (a shared VM): each figure's ratio is taken within a round, the
    # two sides measured one after the other, and the rounds' ratios are summarized by their median.
    policy = bare_policy(args)
    server, url = start_server(args)
    try:
        latency = latency_rounds(url, policy, observations, args.requests)
        print(f"bare sample_actions at batch 1: median {median_ms(latency['bare']):.1f} ms", flush=True)
        rounds = [
            {count: websocket_run(url, observations, count, args.requests) for count in CLIENTS}
            for _ in range(args.rounds)
        ]
        stats = httpx.get(f"{url}/stats", headers={"Authorization": f"Bearer {KEY}"}).json()
    finally:
        server.terminate()
        server.wait(timeout=60)
    report = summarize(args, latency, rounds, stats)
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_serving.json").write_text(json.dumps(report, indent=2))
    print_summary(report)


def observation(index: int, cameras: int, size: int) -> dict[str, Any]:
    rng = np.random.default_rng(index)
    return {
        "images": {
            MODEL_CAMERAS[slot]: rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            for slot in range(cameras)
        },
        "state": rng.uniform(-1, 1, STATE_DIM).astype(np.float32),
        "prompt": "pick up the cube and put it in the bowl",
    }


def bare_policy(args: argparse.Namespace) -> Any:
    """The model loaded here as the server loads it, for the bare sample times."""
    from relay_engine.acting import load_acting_policy

    policy, _, _ = load_acting_policy(args.model, args.device)
    policy.eval()
    return policy


def bare_sample(policy: Any, obs: dict[str, Any], seed: int) -> float:
    """Seconds of what any server must do per request: `collate` + `sample_actions` (10 Euler
    steps) from seeded noise (image decoding excluded: the websocket sends arrays)."""
    from relay_engine.acting import observation_sample, sample_chunks, seeded_noise

    started = time.perf_counter()
    sample = observation_sample(obs["images"], obs["state"], obs["prompt"], None)
    noise = seeded_noise(policy, torch.Generator().manual_seed(seed))
    sample_chunks(policy, [sample], [noise], num_steps=10)
    return time.perf_counter() - started


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RELAY_SERVE_API_KEY": KEY}
    if args.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    command = [
        sys.executable, "-m", "relay.cli", "serve", args.model, "--port", "0", "--device", args.device,
        "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms),
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip().startswith("HTTP:"):
            url = line.split()[1].removesuffix("/actions")
            # The rest of the instructions are not read: drain them so the pipe never fills.
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process, url
    raise SystemExit(f"relay serve ended before it served (exit status {process.wait()})")


def latency_rounds(
    url: str, policy: Any, observations: list[dict[str, Any]], requests: int
) -> dict[str, list[float]]:
    """One client, `requests` rounds after a warm-up: in each, the bare sample here, then the same
    observation and seed through the server over the websocket (openpi-client) and over HTTP
    (base64 PNG images). Seconds per request of each, round by round."""
    bodies = [
        {
            "observation": {
                "images": {name: png_base64(image) for name, image in obs["images"].items()},
                "state": obs["state"].tolist(),
                "prompt": obs["prompt"],
            },
        }
        for obs in observations
    ]
    robot = WebsocketClientPolicy(host=url.removeprefix("http://"), api_key=KEY)
    times: dict[str, list[float]] = {"bare": [], "websocket": [], "http": []}
    with httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as client:
        for index in range(requests + 1):
            obs = observations[index % len(observations)]
            bare = bare_sample(policy, obs, index)
            started = time.perf_counter()
            robot.infer({**obs, "seed": index})
            websocket = time.perf_counter() - started
            started = time.perf_counter()
            client.post(
                f"{url}/actions", json={**bodies[index % len(bodies)], "seed": index}
            ).raise_for_status()
            http = time.perf_counter() - started
            if index:  # the first is a warm-up
                times["bare"].append(bare)
                times["websocket"].append(websocket)
                times["http"].append(http)
    robot._ws.close()  # openpi-client has no close of its own
    return times


def websocket_run(url: str, observations: list[dict[str, Any]], count: int, requests: int) -> dict[str, Any]:
    """`count` openpi clients at once, each sending `requests` after a warm-up of its own."""
    host = url.removeprefix("http://")
    clients = [WebsocketClientPolicy(host=host, api_key=KEY) for _ in range(count)]
    for index, client in enumerate(clients):
        client.infer({**observations[index % len(observations)], "seed": index})
    latencies: list[list[float]] = [[] for _ in range(count)]
    start = threading.Barrier(count + 1)

    def run(index: int) -> None:
        start.wait()
        for step in range(requests):
            obs = observations[(index + step) % len(observations)]
            sent = time.perf_counter()
            clients[index].infer({**obs, "seed": index * 100_000 + step})
            latencies[index].append(time.perf_counter() - sent)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    for client in clients:
        client._ws.close()  # openpi-client has no close of its own
    every = [t for per_client in latencies for t in per_client]
    return {
        "clients": count,
        "requests": len(every),
        "seconds": wall,
        "requests_per_s": len(every) / wall,
        "latency_median_ms": median_ms(every),
        "latency_p90_ms": float(np.percentile(every, 90)) * 1000,
    }


def png_base64(image: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def median_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000


def summarize(
    args: argparse.Namespace,
    latency: dict[str, list[float]],
    rounds: list[dict[int, dict[str, Any]]],
    stats: dict[str, Any],
) -> dict[str, Any]:
    def ratio(name: str) -> float:  # the median of each round's served / bare
        return statistics.median(s / b for s, b in zip(latency[name], latency["bare"], strict=True))

    runs = []
    for count in CLIENTS:
        per_round = [r[count] for r in rounds]
        runs.append(
            {
                "clients": count,
                "requests_per_s": statistics.median(run["requests_per_s"] for run in per_round),
                "throughput_ratio": statistics.median(
                    r[count]["requests_per_s"] / r[1]["requests_per_s"] for r in rounds
                ),
                "latency_median_ms": statistics.median(run["latency_median_ms"] for run in per_round),
                "latency_p90_ms": statistics.median(run["latency_p90_ms"] for run in per_round),
                "rounds": per_round,
            }
        )
    return {
        "model": args.model,
        "device": args.device,
        "cameras": args.cameras,
        "image_size": args.image_size,
        "requests_per_client": args.requests,
        "rounds": args.rounds,
        "max_batch": args.max_batch,
        "max_wait_ms": args.max_wait_ms,
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "bare_sample_ms": median_ms(latency["bare"]),
        "websocket_latency_ms": median_ms(latency["websocket"]),
        "websocket_latency_ratio": ratio("websocket"),
        "http_latency_ms": median_ms(latency["http"]),
        "http_latency_ratio": ratio("http"),
        "runs": runs,
        "server_mean_batch": stats.get("mean_batch"),
        "quick": args.quick,
    }


def print_summary(report: dict[str, Any]) -> None:
    print(
        f"\n{report['model']} on {report['device']}, {report['cameras']} camera(s) of "
        f"{report['image_size']}x{report['image_size']}, {report['requests_per_client']} requests a client"
    )
    print(f"  bare sample at batch 1          {report['bare_sample_ms']:8.1f} ms")
    for name in ("websocket", "http"):
        ratio = report[f"{name}_latency_ratio"]
        verdict = "meets" if ratio <= LATENCY_GOAL else "misses"
        print(
            f"  1 client, {name:9s} latency    {report[f'{name}_latency_ms']:8.1f} ms  "
            f"{ratio:5.2f}x bare ({verdict} <= {LATENCY_GOAL})"
        )
    print(f"  (ratios: medians of each round's; load average at the end {report['load_average']:.2f})")
    print("  clients  requests/s  vs 1 client  latency median  p90")
    for run in report["runs"]:
        print(
            f"  {run['clients']:7d}  {run['requests_per_s']:10.1f}  {run['throughput_ratio']:10.2f}x  "
            f"{run['latency_median_ms']:11.1f} ms  {run['latency_p90_ms']:7.1f} ms"
        )
    last = report["runs"][-1]
    verdict = "meets" if last["throughput_ratio"] >= THROUGHPUT_GOAL else "misses"
    print(
        f"  throughput at {last['clients']} clients: {last['throughput_ratio']:.2f}x one at a time "
        f"({verdict} >= {THROUGHPUT_GOAL}); the server's mean batch {report['server_mean_batch']}"
    )
    if report["quick"]:
        print("  (--quick: a check that it runs, not figures)")
    print("  JSON: bench/out/bench_serving.json")


if __name__ == "__main__":
    main()
