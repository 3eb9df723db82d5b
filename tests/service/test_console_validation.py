"""The console's validation curves in a real browser (Debian's headless Chromium through Playwright)
against the real service: a job started from the form with validation episodes shows its held-out
action error (with the blind baseline) and validation loss beside the training loss, a point per
checkpoint, and its best and last scores in the summary; a job without a split shows neither."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.service.browser import chart_points as points
from tests.service.browser import fenced_page, sign_in, start_tiny_job_from_the_form
from tests.service.stack import Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow


def test_a_job_with_validation_episodes_draws_its_held_out_curves_beside_the_loss(
    browser: Browser, stack: Stack, worker: WorkerProcess, dataset: Path, user: tuple[str, str]
) -> None:
    origin = stack.api_url
    page, fence = fenced_page(browser, origin)
    sign_in(page, origin, user[1])

    start_tiny_job_from_the_form(page, dataset, validation_episodes="3")  # episode 3 of 0 to 3, as text

    # Beside the loss, in the same grid: the held-out action error, then the validation loss.
    charts = page.locator(".grid [data-chart]")
    expect(charts).to_have_count(5)
    assert [charts.nth(i).get_attribute("data-chart") for i in range(3)] == [
        "loss",
        "action_error",
        "validation_loss",
    ]
    expect(page.locator("[data-chart=action_error] h3")).to_have_text("held-out action error")

    # A point per checkpoint (every 10 steps here), as the validation events arrive.
    wait_for(lambda: points(page, "action_error") >= 1, 120, "the first validation point")
    expect(page.locator("h1 .status")).to_have_text("completed", timeout=60_000)
    wait_for(lambda: points(page, "action_error") == 2, 10, "the second validation point")
    assert points(page, "validation_loss") == 2 and points(page, "loss") == 2
    expect(page.locator("[data-chart=action_error] .legend")).to_contain_text("blind baseline")
    assert page.locator("table[data-testid=events] tr[data-event=validation]").count() == 2

    # The results card: the best scores with their step (and the last, when another step's).
    best = page.locator("[data-testid=results] [data-result=validation] [data-validation=best]")
    expect(best).to_have_text(
        re.compile(
            r"^best at step (10|20): action error [\d.e-]+ \(mean of 4 chunks\) vs blind [\d.e-]+ "
            r"\([\d.]+x (better|worse)\), one chunk [\d.e-]+, spread [\d.e-]+, validation loss [\d.e-]+, "
            r"\d+ frames of 1 episode$"
        )
    )
    expect(page.locator("[data-config=validation_episodes]")).to_have_text("3")

    # A job without a split: no validation charts, no validation line.
    answer = httpx.post(
        f"{origin}/v1/fine-tunes",
        json={"model": "pi05-tiny", "dataset_name": str(dataset), "steps": 1, "batch_size": 2},
        headers={"authorization": f"Bearer {user[1]}"},
    )
    assert answer.status_code == 200, answer.text
    page.goto(f"{origin}/#/jobs/{answer.json()['id']}")
    expect(page.locator(".grid [data-chart]")).to_have_count(3)
    expect(page.locator("[data-chart=action_error]")).to_have_count(0)
    expect(page.locator("[data-result=validation]")).to_have_count(0)
    assert fence.refused == []
