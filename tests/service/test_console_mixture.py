"""A mixture of datasets (a recipe's `datasets`) in the console, in a real browser (Debian's headless
Chromium through Playwright) against the real service: the form takes the list as JSON with the
Dataset name left empty and shows the API's refusal of a dataset's weight next to the list; the job
page lists each dataset with its weight and share of the samples, what the engine read of each,
and each dataset's validation figures under the overall ones."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import Browser, expect

from relay.events import dataset_line
from tests.service.browser import fenced_page, sign_in
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow

# Hub names: the parked API queues the job without reading either.
FIRST = "team/pick-fork"
SECOND = "lerobot/aloha_pick"


def test_the_form_takes_a_mixture_and_the_job_page_shows_each_dataset_with_its_share(
    browser: Browser, stack: Stack, user: tuple[str, str]
) -> None:
    origin = stack.parked_api_url  # a queue no worker reads: the job stays queued
    page, fence = fenced_page(browser, origin)
    sign_in(page, origin, user[1])
    page.goto(f"{origin}/#/new")

    # The list as JSON, shown by an example of a mixture; the Dataset name may be left for it.
    example = re.compile(r'^\[\{"name": "team/pick-fork"')
    expect(page.locator("#field-datasets")).to_have_attribute("placeholder", example)
    expect(page.locator("label[for=field-dataset_name]")).to_contain_text("dataset_name * (or datasets)")
    page.select_option("#field-model", "pi05-tiny")
    page.fill("#field-steps", "20")
    cameras = '{"base_0_rgb": "observation.images.top"}'
    first = f'{{"name": "{FIRST}", "revision": "v2.1", "weight": 3}}'
    page.fill(
        "#field-datasets",
        f'[{first}, {{"name": "{SECOND}", "weight": 0}}]',
    )
    page.click("button:has-text('Start fine-tune')")
    refused = "bad datasets[1].weight: 0 (must be a number above 0"
    expect(page.locator("[data-error-for=datasets]")).to_contain_text(refused)
    expect(page.locator("#field-datasets")).to_have_class(re.compile(r"\binvalid\b"))
    expect(page.locator("[data-error-for=dataset_name]")).to_have_text("")

    page.fill(
        "#field-datasets",
        f'[{first}, {{"name": "{SECOND}", "cameras": {cameras}}}]',
    )
    page.click("button:has-text('Start fine-tune')")
    page.wait_for_url(re.compile(r".*#/jobs/ft-[0-9a-f]{12}$"))

    # Each dataset, its weight and its share of the samples (3 of 4, 1 of 4).
    mixture = page.locator("dd[data-field=dataset] [data-testid=mixture]")
    expect(mixture.locator("li")).to_have_count(2)
    expect(mixture.locator("li[data-mixture='0']")).to_have_text(f"{FIRST} at v2.1: weight 3, 75% of samples")
    expect(mixture.locator("li[data-mixture='1']")).to_have_text(
        f"{SECOND}: weight 1, 25% of samples, cameras base_0_rgb = observation.images.top"
    )
    # dataset_name, filled in by the API: the first dataset's.
    expect(page.locator("dd[data-config=dataset_name]")).to_have_text(FIRST)
    expect(page.locator("dd[data-field=read]")).to_have_count(0)  # nothing read while queued
    assert fence.refused == []


def test_a_mixture_job_shows_what_was_read_of_each_dataset_and_each_ones_validation(
    browser: Browser, stack: Stack, worker: WorkerProcess, user: tuple[str, str]
) -> None:
    images = stack.dataset("mixture-images", episodes=4, episode_length=(8, 10))
    overhead = {"observation.images.overhead": (32, 32)}
    video = stack.dataset(
        "mixture-video",
        episodes=4,
        episode_length=(8, 10),
        cameras=overhead,
        format="v3.0",
        video=True,
        seed=2,
    )
    origin = stack.api_url
    recipe = {
        "model": "pi05-tiny",
        "datasets": [
            {"name": str(images), "weight": 3},
            {"name": str(video), "cameras": {"base_0_rgb": "observation.images.overhead"}},
        ],
        "steps": 10,
        "batch_size": 2,
        "validation_episodes": [0],
    }
    headers = {"authorization": f"Bearer {user[1]}"}
    answer = httpx.post(f"{origin}/v1/fine-tunes", json=recipe, headers=headers)
    assert answer.status_code == 200, answer.text

    page, fence = fenced_page(browser, origin)
    sign_in(page, origin, user[1])
    page.goto(f"{origin}/#/jobs/{answer.json()['id']}")
    expect(page.locator("h1 .status")).to_have_text("completed", timeout=300_000)

    # What the engine read of each, a line each with its share.
    read = page.locator("dd[data-field=read] [data-testid=mixture-read]")
    expect(read.locator("li")).to_have_count(2)
    expect(read.locator("li[data-read='0']")).to_have_text(
        re.compile(rf"^{re.escape(str(images))}, LeRobot v2\.1, 4 episodes, \d+ frames \(75% of samples\)$")
    )
    expect(read.locator("li[data-read='1']")).to_have_text(
        re.compile(rf"^{re.escape(str(video))}, LeRobot v3\.0, 4 episodes, \d+ frames \(25% of samples\)$")
    )
    # The whole, in the one line the CLI prints (relay.events.dataset_line), on hover.
    job = httpx.get(f"{origin}/v1/fine-tunes/{answer.json()['id']}", headers=headers).json()
    expect(read).to_have_attribute("title", dataset_line(job["dataset"]))
    assert dataset_line(job["dataset"]).endswith("(75% of samples), mixed with 1 more dataset")

    # The overall scoring, then each dataset's headline figures under it.
    best = page.locator("[data-testid=results] [data-result=validation] [data-validation=best]")
    # Over both datasets' held-out episodes: episode 0 of each.
    overall = (
        r"^best at step 10: action error [\d.e-]+ \(mean of \d+ chunks\) vs blind .*, "
        r"\d+ frames of 2 episodes$"
    )
    expect(best).to_have_text(re.compile(overall))
    parts = page.locator("[data-testid=results] [data-validation-datasets=best] li")
    expect(parts).to_have_count(2)
    for index, name in enumerate((images, video)):
        expect(parts.nth(index)).to_have_attribute("data-dataset", str(name))
        expect(parts.nth(index)).to_have_text(
            re.compile(
                rf"^{re.escape(str(name))}: action error [\d.e-]+ vs blind [\d.e-]+ "
                r"\([\d.]+x (better|worse)\), \d+ frames of 1 episode$"
            )
        )
    assert fence.refused == []
