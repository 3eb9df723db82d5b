"""Debian's headless Chromium driven by Playwright, for the console's browser tests and its
benchmark. Playwright's own browser builds are not used (they cannot be downloaded here):
scripts/test.sh installs the `chromium` package when /usr/bin/chromium is missing.

Every page is fenced: a request to any origin but the server under test is refused and noted, so
a test can show that the console needs nothing from the internet.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Browser, Page, Route, sync_playwright

CHROMIUM = Path(os.environ.get("RELAY_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: `apt-get install -y chromium` (scripts/test.sh does)")
    # A flag of our own on the browser's command line, to find its process if it must be killed.
    marker = f"--relay-test-browser={uuid.uuid4().hex}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, marker])
        try:
            yield browser
        finally:
            # Closing once hung for over ten minutes in CI, a Chromium renderer spinning at full
            # CPU (the tests had passed): past CLOSE_SECONDS the browser is killed, which ends the
            # close as a lost connection would, and the suite goes on.
            watchdog = threading.Timer(CLOSE_SECONDS, _kill_browser, args=(marker,))
            watchdog.start()
            try:
                browser.close()
            finally:
                watchdog.cancel()


CLOSE_SECONDS = 60.0


def _kill_browser(marker: str) -> None:
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        if marker in (process.info["cmdline"] or []):
            for child in process.children(recursive=True):
                child.kill()
            process.kill()


@dataclass
class Fence:
    """The requests a page tried to make to any other origin than `origin`."""

    origin: str
    refused: list[str] = field(default_factory=list)

    def __call__(self, route: Route) -> None:
        url = route.request.url
        if url.startswith(self.origin + "/") or url == self.origin or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            self.refused.append(url)
            route.abort()


def fenced_page(browser: Browser, origin: str) -> tuple[Page, Fence]:
    """A fresh page (its own context: its own session storage) that may only talk to `origin`."""
    context = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 900})
    fence = Fence(origin)
    context.route("**/*", fence)
    page = context.new_page()
    page.set_default_timeout(60_000)
    return page, fence


def chart_points(page: Page, chart: str) -> int:
    """How many points a job page's chart shows (its `data-points`, set in the frame that draws one)."""
    return int(page.get_attribute(f"[data-chart={chart}]", "data-points") or 0)


def sign_in(page: Page, origin: str, key: str) -> None:
    page.goto(origin + "/")
    page.fill("#api-key", key)
    page.click("button[type=submit]")
    page.wait_for_selector("table[data-testid=jobs]")


def start_tiny_job_from_the_form(page: Page, dataset: Path, **fields: str) -> None:
    """Start a 20-step pi05-tiny job on `dataset` from the New fine-tune form, with `fields`
    typed into their boxes as they are, and wait for its page."""
    page.click("text=New fine-tune >> nth=0")
    page.select_option("#field-model", "pi05-tiny")
    page.fill("#field-dataset_name", str(dataset))
    page.fill("#field-batch_size", "2")
    page.fill("#field-steps", "20")
    for name, text in fields.items():
        page.fill(f"#field-{name}", text)
    page.click("button:has-text('Start fine-tune')")
    page.wait_for_url(re.compile(r".*#/jobs/ft-[0-9a-f]{12}$"))
