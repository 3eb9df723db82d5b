"""Benchmarks of the fine-tuning service (issue 4), measured in one run; prints figures and ratios.

1. API latency with 50 concurrent clients on loopback: p50 and p99 of create, retrieve, list and
   events (a page of 100), each against a bare FastAPI endpoint (a sync `def` returning a small
   JSON object, as the routes are; an `async def` one is shown too) served the same way: uvicorn,
   one process, the same options, measured by the same client in the same run, the workloads
   taking turns. Goal: p99 ratio at most 2. The server's CPU time per request (from /proc, so
   Linux only) is printed beside it: on a busy machine it is the steadier figure.
2. From POST to `running` with a warm worker (Redis broker, one Celery worker process that has
   already run a job): median over --jobs jobs, seen by a client polling every 10 ms, and from
   the server's timestamps (created_at to started_at). Goal: under 1 s.

Needs PostgreSQL and Redis on 127.0.0.1 (scripts/services.sh); uses the database relay_bench and
Redis database 12, both emptied first.

    python bench/bench_api.py [--requests 40] [--rounds 4] [--jobs 10]
    python bench/bench_api.py --scale          # part 3 (seeds a 100,000-job database first)
    python bench/bench_api.py --claims-only    # part 3's claim wait alone, on 100 jobs

The machine is shared, so expect noise; the ratios come from back-to-back runs in one process.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import api_scale
import httpx
import psycopg
import redis
from fastapi import FastAPI

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("RELAY_BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("RELAY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
DATABASE = "relay_bench"
CLIENTS = 50
PARKED_QUEUE = "relay.bench-parked"


def bare_app() -> FastAPI:
    """The baseline: FastAPI with nothing behind it."""
    app = FastAPI()

    @app.get("/bare")
    def bare() -> dict[str, Any]:
        return {"id": "ft-000000000000", "object": "fine_tune", "status": "running"}

    @app.get("/bare-async")
    async def bare_async() -> dict[str, Any]:
        return {"id": "ft-000000000000", "object": "fine_tune", "status": "running"}

    return app


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def recreate_database(name: str = DATABASE) -> str:
    """An empty database `name`; its URL."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name


class Served:
    """An ASGI app served by `uvicorn --factory` in a child process, like production (one worker)."""

    def __init__(self, factory: str, env: dict[str, str], app_dir: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            factory,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            "--no-access-log",
        ]
        if app_dir is not None:
            command += ["--app-dir", str(app_dir)]
        self.process = subprocess.Popen(command, env=env, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(self.url + "/docs", timeout=1)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"{factory} did not start") from None
                time.sleep(0.2)

    def cpu_seconds(self) -> float:
        """The server process's CPU time so far (user and system), from /proc."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=30)


async def measure(
    url: str, request: Callable[[httpx.AsyncClient, int], Awaitable[httpx.Response]], per_client: int
) -> list[float]:
    """`CLIENTS` clients, each with its own connection, each sending `per_client` requests in a row."""
    latencies: list[float] = []

    async def one_client(index: int) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
            await request(client, index)  # warm the connection
            for _ in range(per_client):
                started = time.perf_counter()
                response = await request(client, index)
                latencies.append(time.perf_counter() - started)
                if response.status_code != 200:
                    raise RuntimeError(f"{response.request.url}: {response.status_code} {response.text}")

    await asyncio.gather(*(one_client(i) for i in range(CLIENTS)))
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def route_workloads(url: str, key: str, job_id: str, suffix: str = "") -> dict[str, Workload]:
    """The service's routes as workloads: create, retrieve, list (20), a job's events (100), its files."""
    headers = {"authorization": f"Bearer {key}"}
    config = {"model": "pi05-tiny", "dataset_name": "bench/dataset", "steps": 10, "batch_size": 2}
    return {
        "create" + suffix: (url, lambda c, i: c.post("/v1/fine-tunes", json=config, headers=headers)),
        "retrieve" + suffix: (url, lambda c, i: c.get(f"/v1/fine-tunes/{job_id}", headers=headers)),
        "list" + suffix: (url, lambda c, i: c.get("/v1/fine-tunes", params={"limit": 20}, headers=headers)),
        "events (100)" + suffix: (
            url,
            lambda c, i: c.get(f"/v1/fine-tunes/{job_id}/events", params={"limit": 100}, headers=headers),
        ),
        "files" + suffix: (url, lambda c, i: c.get(f"/v1/fine-tunes/{job_id}/files", headers=headers)),
    }


def api_latency(
    env: dict[str, str], key: str, job_id: str, per_client: int, rounds: int
) -> dict[str, dict[str, float]]:
    bare = Served("bench_api:bare_app", env, app_dir=ROOT / "bench")
    relay = Served("relay_api.app:create_app", {**env, "RELAY_FINE_TUNE_QUEUE": PARKED_QUEUE})
    workloads: dict[str, Workload] = {
        "bare (def)": (bare.url, lambda c, i: c.get("/bare")),
        "bare (async def)": (bare.url, lambda c, i: c.get("/bare-async")),
        **route_workloads(relay.url, key, job_id),
    }
    try:
        return take_turns(workloads, {bare.url: bare, relay.url: relay}, per_client, rounds)
    finally:
        bare.stop()
        relay.stop()


Workload = tuple[str, Callable[[httpx.AsyncClient, int], Awaitable[httpx.Response]]]


def take_turns(
    workloads: dict[str, Workload], servers: dict[str, Served], per_client: int, rounds: int
) -> dict[str, dict[str, float]]:
    """p50, p99 and the server's CPU per request of each workload (name -> (server URL, request))."""
    # The workloads take turns, `rounds` times, and each one's percentiles are over all its rounds:
    # a busy spell on the shared machine then lands on every workload alike, not on one of them.
    # The server's CPU time per request is a steadier figure than latency on a busy machine.
    latencies: dict[str, list[float]] = {name: [] for name in workloads}
    cpu_seconds = dict.fromkeys(workloads, 0.0)
    # This client's own garbage collections are kept out of the timing: a full one took 0.1-0.4 s
    # (50 connections' worth of garbage per turn), during which no client reads its answer, so
    # it landed on whichever workload was running, as a stall the servers did not cause. The
    # collector is off while a workload runs and collects between turns, for every workload alike.
    gc.disable()
    try:
        for _ in range(rounds):
            for name, (url, request) in workloads.items():
                server = servers[url]
                before = server.cpu_seconds()
                latencies[name] += asyncio.run(measure(url, request, max(1, per_client // rounds)))
                cpu_seconds[name] += server.cpu_seconds() - before
                gc.collect()
    finally:
        gc.enable()
    return {
        name: {
            "p50_ms": 1000 * percentile(values, 0.5),
            "p99_ms": 1000 * percentile(values, 0.99),
            # Each client's connection-warming request is served too.
            "server_cpu_ms": 1000 * cpu_seconds[name] / (len(values) + CLIENTS * rounds),
            "requests": len(values),
        }
        for name, values in latencies.items()
    }


class Worker:
    """One Celery worker process; `threads` sets its torch threads (OMP_NUM_THREADS)."""

    def __init__(self, env: dict[str, str], log: Path, threads: int | None = None) -> None:
        from relay_worker.command import worker_command

        self.log = open(log, "ab")  # noqa: SIM115
        env = {**env, "OMP_NUM_THREADS": str(threads)} if threads else env
        self.process = subprocess.Popen(
            worker_command(concurrency=1, heartbeat=False),
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 300) -> None:
        """Until Celery says the worker is ready (it has imported torch and connected)."""
        deadline = time.monotonic() + timeout
        while b" ready." not in Path(self.log.name).read_bytes():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"the worker logging to {self.log.name} did not start")
            time.sleep(0.2)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


def post_to_running(env: dict[str, str], key: str, dataset: Path, jobs: int) -> dict[str, float]:
    """Median time from POST to `running` with a warm worker."""
    from relay.http_client import Client

    worker = Worker(env, Path(env["RELAY_HOME"]) / "worker.log")
    relay = Served("relay_api.app:create_app", env)
    client = Client(relay.url, key)
    config = {"model": "pi05-tiny", "dataset_name": str(dataset), "batch_size": 1}
    try:
        # Warm up: the worker's first job loads the dataset and builds the model once.
        warm = client.request("POST", "/v1/fine-tunes", json_body={**config, "steps": 2})
        wait_until(client, warm["id"], {"completed"}, timeout=600)
        observed, server_side = [], []
        for _ in range(jobs):
            started = time.perf_counter()
            job = client.request("POST", "/v1/fine-tunes", json_body={**config, "steps": 100_000})
            while client.request("GET", f"/v1/fine-tunes/{job['id']}")["status"] == "queued":
                time.sleep(0.01)
            observed.append(time.perf_counter() - started)
            job = client.request("GET", f"/v1/fine-tunes/{job['id']}")
            server_side.append(_seconds_between(job["created_at"], job["started_at"]))
            client.request("POST", f"/v1/fine-tunes/{job['id']}/cancel")
            wait_until(client, job["id"], {"cancelled"}, timeout=120)
        return {
            "observed_median_s": statistics.median(observed),
            "server_median_s": statistics.median(server_side),
            "observed_max_s": max(observed),
            "jobs": jobs,
        }
    finally:
        relay.stop()
        worker.stop()


def wait_until(client: Any, job_id: str, statuses: set[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (status := client.request("GET", f"/v1/fine-tunes/{job_id}")["status"]) not in statuses:
        if status == "error" or time.monotonic() > deadline:
            raise RuntimeError(f"{job_id} is {status}, waiting for {statuses}")
        time.sleep(0.05)


def _seconds_between(start: str, end: str) -> float:
    from datetime import datetime

    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def post_to_running_report(env: dict[str, str], key: str, home: Path, jobs: int) -> dict[str, float]:
    from relay_engine.datasets import write_synthetic_dataset

    print(f"\n2. POST -> running with a warm worker ({jobs} jobs)")
    dataset = write_synthetic_dataset(home / "dataset", episodes=2, episode_length=20)
    running = post_to_running(env, key, dataset, jobs)
    print(
        f"median {running['observed_median_s']:.3f} s seen by the client "
        f"(max {running['observed_max_s']:.3f} s); "
        f"median {running['server_median_s']:.3f} s from created_at to started_at"
    )
    return running


def fresh_service(database: str, redis_url: str, prefix: str) -> tuple[Path, dict[str, str], Any, str]:
    """An empty, migrated database, an empty Redis database and a data dir; the service's
    environment and settings, and a key of the user `bench`."""
    from relay_api import keys, migrate
    from relay_api.db import session_factory
    from relay_api.settings import Settings

    home = Path(tempfile.mkdtemp(prefix=prefix))
    database_url = recreate_database(database)
    redis.Redis.from_url(redis_url).flushdb()
    env = {
        **os.environ,
        "RELAY_HOME": str(home),
        "RELAY_DATABASE_URL": database_url,
        "RELAY_BROKER_URL": redis_url,
        "RELAY_CACHE_DIR": str(home / "cache"),
    }
    settings = Settings(home=home, database_url=database_url, broker_url=redis_url)
    migrate.upgrade(settings.database_url)
    with session_factory(settings)() as session:
        key = keys.create_key(session, "bench").key
    return home, env, settings, key


def finish(file_name: str, report: dict[str, Any], databases: list[str], homes: list[Path]) -> None:
    """Write `report` to bench/out/`file_name`, then drop the benchmark's databases, empty Redis and
    remove its data directories."""
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / file_name).write_text(json.dumps(report, indent=2))
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        for name in databases:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    redis.Redis.from_url(REDIS_URL).flushdb()
    for home in homes:
        shutil.rmtree(home, ignore_errors=True)


SCALE_GOAL = 1.5  # a route's p99 on the large database over the same route's on the small one


def scale_report(args: argparse.Namespace) -> None:
    """Part 3: the routes on 100 jobs and on 100,000 jobs with 10 M events, their turns interleaved;
    then the claim wait with 1 to 8 workers on the large database."""
    small = fresh_service(DATABASE + "_small", REDIS_URL, "relay-bench-small-")
    small_job, small_user = seed_bench_job(small[2], small[0])
    api_scale.seed_user_jobs(plain_url(small[2].database_url), small_user, 99)
    large = fresh_service(DATABASE + "_large", REDIS_URL, "relay-bench-large-")
    large_job, large_user = seed_bench_job(large[2], large[0])
    api_scale.seed_user_jobs(plain_url(large[2].database_url), large_user, 99)
    seeded = api_scale.seed_others(plain_url(large[2].database_url), args.users)
    print(
        f"3. Scale: the large database holds {seeded['jobs']:,} jobs of {args.users + 1:,} users and "
        f"{seeded['events']:,} events ({seeded['bytes'] / 1e9:.2f} GB, seeded in {seeded['seconds']:.0f} s); "
        f"the small one 100 jobs of 1 user. {CLIENTS} clients; load average {os.getloadavg()[0]:.1f}"
    )
    servers = [
        Served("relay_api.app:create_app", {**env, "RELAY_FINE_TUNE_QUEUE": PARKED_QUEUE})
        for env in (small[1], large[1])
    ]
    small_routes = route_workloads(servers[0].url, small[3], small_job, " @100")
    large_routes = route_workloads(servers[1].url, large[3], large_job, " @100k")
    # Each route on the small database, then on the large one, before the next route.
    workloads = dict(
        pair for pairs in zip(small_routes.items(), large_routes.items(), strict=True) for pair in pairs
    )
    try:
        latency = take_turns(workloads, {s.url: s for s in servers}, args.requests, args.rounds)
    finally:
        for server in servers:
            server.stop()
    print(f"(load average {os.getloadavg()[0]:.1f} at the end)")
    print(f"{'route':14}{'p99 ms @100':>13}{'p99 ms @100k':>14}{'ratio':>8}{'CPU ms @100':>13}{'@100k':>8}")
    ratios = {}
    for name in small_routes:
        route = name.removesuffix(" @100")
        few, many = latency[name], latency[route + " @100k"]
        ratios[route] = many["p99_ms"] / few["p99_ms"]
        print(
            f"{route:14}{few['p99_ms']:13.1f}{many['p99_ms']:14.1f}{ratios[route]:8.2f}"
            f"{few['server_cpu_ms']:13.2f}{many['server_cpu_ms']:8.2f}"
        )
    print(f"goal: every ratio at most {SCALE_GOAL}; worst {max(ratios.values()):.2f}")
    counts = tuple(int(n) for n in args.workers.split(","))
    waits = claim_wait_report(large[1], large[3], large[0], args.jobs or 5, counts)
    report = {"seeded": seeded, "latency": latency, "p99_ratios": ratios, "claim_wait_median_s": waits}
    finish("bench_api_scale.json", report, [DATABASE + "_small", DATABASE + "_large"], [small[0], large[0]])


def claims_report(args: argparse.Namespace) -> None:
    """Only the claim wait of part 3, on a database of the benchmark's user alone (or of --users
    more users, seeded as --scale seeds them): a minute, where --scale seeds 10 M events first."""
    users = args.users if args.users is not None else 0
    home, env, settings, key = fresh_service(DATABASE + "_claims", REDIS_URL, "relay-bench-claims-")
    _, user_id = seed_bench_job(settings, home)
    api_scale.seed_user_jobs(plain_url(settings.database_url), user_id, 99)
    jobs = 100
    if users:
        jobs = int(api_scale.seed_others(plain_url(settings.database_url), users)["jobs"])
    print(f"The claim wait on a database of {jobs:,} jobs; load average {os.getloadavg()[0]:.1f}")
    counts = tuple(int(n) for n in args.workers.split(","))
    waits = claim_wait_report(env, key, home, args.jobs or 5, counts, f"{jobs:,} jobs")
    print(f"(load average {os.getloadavg()[0]:.1f} at the end)")
    report = {"jobs_in_database": jobs, "claim_wait_median_s": waits}
    finish("bench_api_claims.json", report, [DATABASE + "_claims"], [home])


def claim_wait_report(
    env: dict[str, str],
    key: str,
    home: Path,
    jobs: int,
    counts: tuple[int, ...],
    database: str = "large database",
) -> dict[int, float]:
    """The median wait from created_at to started_at of a job, one at a time, with 1 to 8 workers
    reading the queue."""
    from relay.http_client import Client
    from relay_engine.datasets import write_synthetic_dataset

    dataset = write_synthetic_dataset(home / "dataset", episodes=2, episode_length=20)
    relay = Served("relay_api.app:create_app", env)
    client = Client(relay.url, key)
    config = {"model": "pi05-tiny", "dataset_name": str(dataset), "batch_size": 1, "steps": 100_000}

    def start(count: int) -> list[Worker]:
        # One torch thread each: eight workers share two cores, and only the claim is timed. Every
        # one is ready before a job is timed: one still starting would take its share of the CPU.
        workers = [Worker(env, home / f"worker-{count}-{i}.log", threads=1) for i in range(count)]
        for worker in workers:
            worker.wait_ready()
        return workers

    def stop(workers: list[Worker]) -> None:
        for worker in workers:
            worker.stop()

    def one_job() -> float:
        job = client.request("POST", "/v1/fine-tunes", json_body=config)
        wait_until(client, job["id"], {"running"}, timeout=600)
        job = client.request("GET", f"/v1/fine-tunes/{job['id']}")
        client.request("POST", f"/v1/fine-tunes/{job['id']}/cancel")
        wait_until(client, job["id"], {"cancelled"}, timeout=300)
        return _seconds_between(job["created_at"], job["started_at"])

    try:
        waits = api_scale.claim_waits(start, stop, one_job, counts, jobs)
    finally:
        client.close()
        relay.stop()
    print(f"\nA queued job's wait to be claimed (median of {jobs}, created_at to started_at), {database}:")
    for count, wait in waits.items():
        print(f"{count} worker(s): {wait:.3f} s ({wait / waits[counts[0]]:.2f}x the wait with {counts[0]})")
    return waits


def plain_url(database_url: str) -> str:
    """A SQLAlchemy URL as psycopg takes it."""
    return database_url.replace("postgresql+psycopg://", "postgresql://", 1)


def seed_bench_job(settings: Any, home: Path) -> tuple[str, int]:
    """A completed job of the user `bench` with 100 events, written as a worker writes them, for
    retrieve, events and files; its id and the user's."""
    from sqlalchemy import select

    from relay.sft.config import SFTConfig
    from relay_api.db import session_factory
    from relay_api.fine_tunes import create, mark_enqueued
    from relay_api.models import User
    from relay_worker import lifecycle

    sessions = session_factory(settings)
    with sessions() as session:
        user_id = session.execute(select(User.id).where(User.name == "bench")).scalar_one()
        row, _ = create(session, user_id, SFTConfig(model="pi05-tiny", dataset_name="bench/dataset"), None)
        mark_enqueued(session, row["id"])
    claim = lifecycle.claim(sessions, settings, row["id"], "bench")
    assert claim is not None
    for step in range(10, 1010, 10):
        lifecycle.record_event(
            sessions,
            settings,
            claim,
            {"step": step, "loss": 0.5, "grad_norm": 1.0, "lr": 2e-5, "skipped": 0.0},
        )
    lifecycle.complete(sessions, claim, 1000, 0.5, str(home / "nowhere"), {})
    sessions.kw["bind"].dispose()
    return row["id"], user_id


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=40, help="requests per client per workload")
    parser.add_argument("--rounds", type=int, default=4, help="turns each workload takes (requests split)")
    parser.add_argument("--jobs", type=int, default=10, help="jobs for POST -> running (0: skip that part)")
    parser.add_argument(
        "--scale", action="store_true", help="only part 3: 100 jobs against 100,000 jobs and 10 M events"
    )
    parser.add_argument(
        "--claims-only",
        action="store_true",
        help="only part 3's claim wait, on a database of 100 jobs (of --users more users if given)",
    )
    parser.add_argument(
        "--users",
        type=int,
        default=None,
        help=f"users beside bench: --scale {api_scale.USERS} unless given, --claims-only none",
    )
    parser.add_argument(
        "--workers", default="1,2,4,8", help="--scale, --claims-only: worker counts for the claim wait"
    )
    args = parser.parse_args()
    if args.claims_only:
        claims_report(args)
        return
    if args.scale:
        if args.users is None:
            args.users = api_scale.USERS
        scale_report(args)
        return

    home, env, settings, key = fresh_service(DATABASE, REDIS_URL, "relay-bench-")
    job_id, _ = seed_bench_job(settings, home)
    print(
        f"1. API latency: {CLIENTS} concurrent clients x {args.requests} requests in {args.rounds} "
        f"rounds; loopback; 1 uvicorn; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    latency = api_latency(env, key, job_id, args.requests, args.rounds)
    print(f"(load average {os.getloadavg()[0]:.1f} at the end)")
    base = latency["bare (def)"]
    base_async = latency["bare (async def)"]
    print(
        f"{'':18}{'p50 ms':>9}{'p99 ms':>9}{'p50 x':>8}{'p99 x':>8}{'p99 x async':>13}"
        f"{'server CPU ms':>15}{'CPU x':>7}"
    )
    for name, figures in latency.items():
        p50, p99, cpu = figures["p50_ms"], figures["p99_ms"], figures["server_cpu_ms"]
        print(
            f"{name:18}{p50:9.1f}{p99:9.1f}{p50 / base['p50_ms']:8.2f}"
            f"{p99 / base['p99_ms']:8.2f}{p99 / base_async['p99_ms']:13.2f}"
            f"{cpu:15.2f}{cpu / base['server_cpu_ms']:7.2f}"
        )

    running: dict[str, float] = {}
    if args.jobs:
        running = post_to_running_report(env, key, home, args.jobs)

    finish("bench_api.json", {"latency": latency, "post_to_running": running}, [DATABASE], [home])


if __name__ == "__main__":
    main()
