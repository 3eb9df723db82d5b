"""What a job's results card costs: GET /v1/fine-tunes/{id}/summary, which reads every event of the
job, against GET /v1/fine-tunes/{id} (one row), on the real service (PostgreSQL, uvicorn), for jobs
of a growing number of events written as a worker writes them (metrics every 10 steps, a
checkpoint every 1,000). Prints each route's median and p90 over --requests sequential requests
from one client, and the ratio.

    python bench/bench_summary.py [--events 100 1000 10000] [--requests 30]

10,000 events are a 100,000-step job's, the most a recipe takes. The machine is shared: expect noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relay_api.db import utcnow  # noqa: E402
from relay_api.event_rows import insert_event_row  # noqa: E402
from tests.service.stack import Stack  # noqa: E402


def timings(http: httpx.Client, path: str, requests: int) -> list[float]:
    http.get(path).raise_for_status()  # warm: the connection, the route's first use
    taken = []
    for _ in range(requests):
        started = time.perf_counter()
        http.get(path).raise_for_status()
        taken.append((time.perf_counter() - started) * 1000)
    return sorted(taken)


def job_with_events(stack: Stack, http: httpx.Client, count: int) -> str:
    """A queued job (the parked API's: no worker takes it) with `count` events as a worker writes them."""
    steps = 10 * count
    job = http.post(
        "/v1/fine-tunes",
        json={"model": "pi05-tiny", "dataset_name": "lerobot/pusht_image", "steps": min(steps, 100_000)},
    ).json()
    written = utcnow()
    with stack.sessions() as session:
        for n in range(1, count + 1):
            window = {"loss": 1 / n, "grad_norm": 1.0, "lr": 1e-3, "skipped": 0.0}
            window |= {"steps_per_second": 2.0, "samples_per_second": 32.0, "data_wait": 0.01}
            insert_event_row(session, job["id"], 10 * n, "metrics", 1, window, written)
            if n % 100 == 0:
                insert_event_row(session, job["id"], 10 * n, "checkpoint", 1, {"seconds": 1.5}, written)
        session.commit()
    return str(job["id"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, nargs="+", default=[100, 1000, 10_000])
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    stack = Stack()
    try:
        _, key = stack.new_user()
        headers = {"authorization": f"Bearer {key}"}
        with httpx.Client(base_url=stack.parked_api_url, headers=headers, timeout=60) as http:
            print("events   retrieve median/p90 (ms)   summary median/p90 (ms)   summary / retrieve (median)")
            for count in args.events:
                job_id = job_with_events(stack, http, count)
                one = timings(http, f"/v1/fine-tunes/{job_id}", args.requests)
                card = timings(http, f"/v1/fine-tunes/{job_id}/summary", args.requests)
                p90 = int(0.9 * (args.requests - 1))
                print(
                    f"{count:>6}   {statistics.median(one):8.1f} / {one[p90]:6.1f}"
                    f"            {statistics.median(card):8.1f} / {card[p90]:6.1f}"
                    f"           {statistics.median(card) / statistics.median(one):6.1f}x"
                )
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
