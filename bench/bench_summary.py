"""What a job's results card costs: GET /v1/fine-tunes/{id}/summary, which reads the job's card row
(its metrics folded as they were written) and its few other events, against GET /v1/fine-tunes/{id}
(one row), on the real service (PostgreSQL, uvicorn), for jobs of a growing number of events:
metrics every 10 steps, written 5 s apart (2 steps/s), and a checkpoint every 1,000 steps, or every
hundredth of a longer job (100 at most). Prints each route's median and p90 over --requests
sequential requests from one client, and the ratio.

    python bench/bench_summary.py [--events 100 1000 10000 1000000] [--requests 30]

Up to --written events (10,000) are written as a worker writes them (event_rows.insert_event_row,
each folded into the card as it is); more are written by PostgreSQL itself (INSERT ... SELECT over
generate_series), and their card is then folded from them as for a job whose events predate cards
(event_rows.locked_card). 10,000 events are a 100,000-step job's, the most a recipe takes; a
million, a 10-million-step job's. The machine is shared: expect noise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

import httpx
from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relay_api.db import utcnow  # noqa: E402
from relay_api.event_rows import insert_event_row, locked_card, save_card  # noqa: E402
from tests.service.stack import Stack  # noqa: E402


def timings(http: httpx.Client, path: str, requests: int) -> list[float]:
    http.get(path).raise_for_status()  # warm: the connection, the route's first use
    taken = []
    for _ in range(requests):
        started = time.perf_counter()
        http.get(path).raise_for_status()
        taken.append((time.perf_counter() - started) * 1000)
    return sorted(taken)


def checkpoint_every(count: int) -> int:
    """Events between checkpoints: every 1,000 steps, or every hundredth of a longer job."""
    return max(100, count // 100)


def job_with_events(stack: Stack, http: httpx.Client, count: int, written_up_to: int) -> str:
    """A queued job (the parked API's: no worker takes it) with `count` metrics events and its
    checkpoints, and its card row."""
    steps = 10 * count
    job = http.post(
        "/v1/fine-tunes",
        json={"model": "pi05-tiny", "dataset_name": "lerobot/pusht_image", "steps": min(steps, 100_000)},
    ).json()
    start = utcnow() - dt.timedelta(seconds=5 * count)
    with stack.sessions() as session:
        if count <= written_up_to:
            for n in range(1, count + 1):
                written = start + dt.timedelta(seconds=5 * n)
                window = {"loss": 1 / n, "grad_norm": 1.0, "lr": 1e-3, "skipped": 0.0}
                window |= {"steps_per_second": 2.0, "samples_per_second": 32.0, "data_wait": 0.01}
                insert_event_row(session, job["id"], 10 * n, "metrics", 1, window, written)
                if n % checkpoint_every(count) == 0:
                    insert_event_row(session, job["id"], 10 * n, "checkpoint", 1, {"seconds": 1.5}, written)
        else:
            session.execute(
                text(
                    """
                    INSERT INTO fine_tune_events (job_id, step, kind, attempt, data, created_at)
                    SELECT :job_id, 10 * n, kind, 1, data, :start + n * interval '5 seconds'
                    FROM generate_series(1, :count) n,
                         LATERAL (
                            SELECT 'metrics', json_build_object(
                                'loss', 1.0 / n, 'grad_norm', 1.0, 'lr', 1e-3, 'skipped', 0.0,
                                'steps_per_second', 2.0, 'samples_per_second', 32.0, 'data_wait', 0.01)
                            UNION ALL
                            SELECT 'checkpoint', json_build_object('seconds', 1.5) WHERE n % :every = 0
                         ) e(kind, data)
                    ORDER BY n, kind DESC
                    """
                ),
                {
                    "job_id": job["id"],
                    "count": count,
                    "every": checkpoint_every(count),
                    "start": start.replace(tzinfo=None),  # the column's naive UTC
                },
            )
            save_card(session, job["id"], locked_card(session, job["id"]))
        session.commit()
    with stack.sessions.kw["bind"].connect().execution_options(isolation_level="AUTOCOMMIT") as db:
        db.execute(
            text("VACUUM ANALYZE fine_tune_events")
        )  # statistics for the new rows, as a live table has
    return str(job["id"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, nargs="+", default=[100, 1000, 10_000, 1_000_000])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument(
        "--written", type=int, default=10_000, help="the most events written one by one, as a worker does"
    )
    args = parser.parse_args()
    stack = Stack()
    try:
        _, key = stack.new_user()
        headers = {"authorization": f"Bearer {key}"}
        with httpx.Client(base_url=stack.parked_api_url, headers=headers, timeout=60) as http:
            print("events   retrieve median/p90 (ms)   summary median/p90 (ms)   summary / retrieve (median)")
            for count in args.events:
                job_id = job_with_events(stack, http, count, args.written)
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
