"""The web console in the browser tests' Chromium, on the tests' service (tests/service/stack.py:
PostgreSQL, Redis, the API in uvicorn, a Celery worker when screenshots are asked for). Prints:

1. First paint: for a fresh tab (empty cache) opening `/`, the browser's first-contentful-paint
   of the sign-in page, and the time until a signed-in tab shows the jobs table (navigation
   start to the table drawn), median and spread over --loads loads.
2. Chart update latency: with a job's page open, a metrics event is written to the database as a
   worker writes it; measured from that commit to the loss chart drawing the point (the API's
   stream polls the database every RELAY_EVENTS_POLL_SECONDS, 0.1 s here; 0.5 s by default), and
   the browser's own share (the stream's bytes arriving to the chart drawn), over --events events.

    python bench/bench_console.py [--loads 7] [--events 20] [--screenshots]

--screenshots also runs a real pi05-tiny job (80 steps on a synthetic dataset) and saves the job
page and the jobs table into docs/images/. The machine is shared: expect noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import insert, update

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from relay_api.db import utcnow  # noqa: E402
from relay_api.models import fine_tune_events, fine_tunes  # noqa: E402
from tests.service.browser import chromium, fenced_page, sign_in  # noqa: E402
from tests.service.stack import Stack, wait_for  # noqa: E402

SCREENSHOT_STEPS = 80


def median_and_spread(values: list[float]) -> str:
    ordered = sorted(values)
    middle = statistics.median(ordered)
    return f"median {middle:7.1f} ms  (min {ordered[0]:.1f}, max {ordered[-1]:.1f}, n={len(ordered)})"


def first_paint(browser: Any, origin: str, key: str, loads: int) -> None:
    paints, tables = [], []
    for _ in range(loads):
        page, _fence = fenced_page(browser, origin)
        page.goto(origin + "/")
        page.wait_for_selector("#api-key")
        paint = page.evaluate("performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? null")
        if paint is not None:
            paints.append(paint)
        page.context.close()

        page, _fence = fenced_page(browser, origin)
        page.goto(origin + "/")
        page.evaluate("key => sessionStorage.setItem('relay.apiKey', key)", key)
        page.reload()
        page.wait_for_selector("table[data-testid=jobs] tbody tr")
        tables.append(page.evaluate("performance.now()"))
        page.context.close()
    print("1. first paint (fresh tab, loopback)")
    print(f"   sign-in page, first-contentful-paint: {median_and_spread(paints)}")
    print(f"   signed in, jobs table drawn:          {median_and_spread(tables)}")


def chart_latency(browser: Any, stack: Stack, key: str, count: int) -> None:
    origin = stack.parked_api_url  # its jobs stay queued: the page's stream stays open
    import httpx

    job = httpx.post(
        f"{origin}/v1/fine-tunes",
        json={"model": "pi05-tiny", "dataset_name": "lerobot/pusht_image", "steps": 100_000},
        headers={"authorization": f"Bearer {key}"},
    ).json()
    with stack.sessions() as session:  # as if a worker had claimed it
        session.execute(update(fine_tunes).where(fine_tunes.c.id == job["id"]).values(status="running"))
        session.commit()
    page, _fence = fenced_page(browser, origin)
    sign_in(page, origin, key)
    page.goto(f"{origin}/#/jobs/{job['id']}")
    page.wait_for_selector("[data-chart=loss]")
    time.sleep(1.0)
    totals, in_browser = [], []
    for index in range(count):
        step = 10 * (index + 1)
        with stack.sessions() as session:
            session.execute(
                insert(fine_tune_events).values(
                    job_id=job["id"],
                    step=step,
                    kind="metrics",
                    attempt=1,
                    data={"loss": 1.0 / (index + 1), "grad_norm": 1.0, "lr": 2.5e-5, "skipped": 0.0},
                    created_at=utcnow(),
                )
            )
            session.commit()
        committed = time.time() * 1000
        drawn = index + 1

        def shown(count: int = drawn) -> bool:
            return bool(page.evaluate("window.relayConsole.charts.loss.points") >= count)

        wait_for(shown, 10, "the chart to draw the point", every=0.005)
        probe = page.evaluate("[performance.timeOrigin, window.relayConsole.charts.loss]")
        origin_ms, chart = probe
        totals.append(origin_ms + chart["drawn"] - committed)
        in_browser.append(chart["drawn"] - chart["received"])
        time.sleep(0.3)
    print("2. chart update latency after an event")
    print(f"   event committed -> loss chart drawn:  {median_and_spread(totals)}")
    print(f"   stream bytes in -> loss chart drawn:  {median_and_spread(in_browser)}")
    print(
        f"   ratio of the browser's share to the whole: "
        f"{statistics.median(in_browser) / statistics.median(totals):.3f}"
    )


def screenshots(browser: Any, stack: Stack) -> None:
    from relay.http_client import Client
    from relay.sft.config import SFTConfig
    from relay.sft.train import train

    stack.worker()
    _, key = stack.new_user()  # a user of its own: only this job in its table
    client = Client(stack.api_url, key, max_retries=0)
    config = SFTConfig(
        model="pi05-tiny",
        dataset_name=str(stack.dataset()),
        batch_size=2,
        learning_rate=1e-3,
        steps=SCREENSHOT_STEPS,
        name="pusht-tiny-demo",
    )
    job = train(config, client=client)
    page, _fence = fenced_page(browser, stack.api_url)
    sign_in(page, stack.api_url, key)
    page.goto(f"{stack.api_url}/#/jobs/{job.id}")
    page.wait_for_selector("h1 .status[data-status=completed]", timeout=600_000)
    page.wait_for_selector("tr[data-file='output/model.safetensors']")
    images = ROOT / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(images / "console-job.png"), full_page=True)
    page.goto(f"{stack.api_url}/#/jobs")
    page.wait_for_selector(f"tr[data-job={job.id}]")
    page.screenshot(path=str(images / "console-jobs.png"))
    print(f"3. screenshots: {images / 'console-job.png'}, {images / 'console-jobs.png'}")
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--loads", type=int, default=7)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--screenshots", action="store_true")
    args = parser.parse_args()
    stack = Stack()
    try:
        _, key = stack.new_user()
        with chromium() as browser:
            print(f"Chromium {browser.version}")
            first_paint(browser, stack.api_url, key, args.loads)
            chart_latency(browser, stack, key, args.events)
            if args.screenshots:
                screenshots(browser, stack)
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
