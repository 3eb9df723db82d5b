"""The web console in a real browser (Debian's headless Chromium through Playwright) against the
real service: sign in, start a pi05-tiny job and watch its loss chart grow, read its events,
download its model, cancel a long job, see the API's 409 and a field's error, and find another
user's job and session absent. Every page is fenced to the server: none may reach the internet."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Route, expect
from sqlalchemy import update

from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.models import fine_tunes
from tests.service.browser import chart_points as points
from tests.service.browser import fenced_page, sign_in
from tests.service.stack import PARKED_QUEUE, ApiServer, Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow


def api_create(url: str, key: str, **fields: object) -> dict[str, object]:
    body = {"model": "pi05-tiny", "dataset_name": "lerobot/pusht_image", "steps": 20, **fields}
    answer = httpx.post(f"{url}/v1/fine-tunes", json=body, headers={"authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_sign_in_start_a_job_watch_its_loss_and_download_the_model(
    browser: Browser,
    stack: Stack,
    worker: WorkerProcess,
    dataset: Path,
    user: tuple[str, str],
    tmp_path: Path,
) -> None:
    origin = stack.api_url
    page, fence = fenced_page(browser, origin)

    # A wrong key is refused with the API's message and is not kept.
    page.goto(origin + "/")
    page.fill("#api-key", "relay-not-a-key")
    page.click("button[type=submit]")
    expect(page.get_by_role("alert")).to_contain_text("key")
    assert page.evaluate("sessionStorage.length") == 0

    sign_in(page, origin, user[1])
    assert page.evaluate("sessionStorage.getItem('relay.apiKey')") == user[1]
    expect(page.locator("table[data-testid=jobs] tbody")).to_contain_text("No fine-tunes yet")

    page.click("text=New fine-tune >> nth=0")
    page.select_option("#field-model", "pi05-tiny")
    page.fill("#field-dataset_name", str(dataset))
    page.fill("#field-batch_size", "2")
    page.fill("#field-steps", "20")
    page.fill("#field-name", "console-run")
    page.click("button:has-text('Start fine-tune')")
    page.wait_for_url(re.compile(r".*#/jobs/ft-[0-9a-f]{12}$"))
    job_id = page.url.rsplit("/", 1)[1]

    # The charts grow as the stream brings the metrics events (every 10 steps).
    wait_for(lambda: points(page, "loss") >= 1, 120, "the first loss point")
    wait_for(lambda: points(page, "loss") >= 2, 120, "a second loss point")
    expect(page.locator("h1 .status")).to_have_text("completed", timeout=60_000)
    assert points(page, "loss") == points(page, "grad_norm") == points(page, "lr") == 2

    events = page.locator("table[data-testid=events] tbody tr")
    expect(events.last).to_have_attribute("data-event", "finished")
    assert page.locator("table[data-testid=events] tr[data-event=checkpoint]").count() == 2
    expect(page.locator("[data-testid=timeline]")).to_contain_text("queued")
    expect(page.locator("[data-testid=timeline] .status").last).to_have_text("completed")
    expect(page.locator("[data-config=batch_size]")).to_have_text("2")
    # What the worker read, in one line: the local directory, its format and size.
    expect(page.locator("dd[data-field=read]")).to_have_text(
        re.compile(rf"^{re.escape(str(dataset))}, LeRobot v2\.1, 4 episodes, [\d,]+ frames$")
    )

    model = page.locator("tr[data-file='output/model.safetensors']")
    expect(model).to_be_visible()
    shown_sha = model.locator("td").nth(2).inner_text().strip()
    with page.expect_download() as started:
        model.locator("button:has-text('Download')").click()
    saved = tmp_path / "model.safetensors"
    started.value.save_as(saved)
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == shown_sha
    # A checkpoint's file too; its sha256 is the one shown.
    manifest = page.locator("tr[data-file$='manifest.json']").first
    with page.expect_download() as started:
        manifest.locator("button").click()
    started.value.save_as(tmp_path / "manifest.json")
    digest = hashlib.sha256((tmp_path / "manifest.json").read_bytes()).hexdigest()
    expect(manifest.locator("[data-sha256]")).to_have_text(digest)

    # The table lists it, newest first, with its progress and last loss.
    page.click("nav >> text=Fine-tunes")
    row = page.locator(f"tr[data-job={job_id}]")
    expect(row).to_contain_text("console-run")
    expect(row).to_contain_text("20 / 20")
    expect(row.locator(".status")).to_have_text("completed")

    page.click("#sign-out")
    expect(page.locator("#api-key")).to_be_visible()
    expect(page.locator("#nav")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    assert fence.refused == []


def test_cancel_a_long_job(
    browser: Browser,
    stack: Stack,
    worker: WorkerProcess,
    client: Client,
    dataset: Path,
    user: tuple[str, str],
) -> None:
    job = train(
        SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=100_000), client=client
    )
    page, fence = fenced_page(browser, stack.api_url)
    sign_in(page, stack.api_url, user[1])
    page.goto(f"{stack.api_url}/#/jobs/{job.id}")
    expect(page.locator("h1 .status")).to_have_text("running", timeout=120_000)
    page.click("h1 button:has-text('Cancel')")
    expect(page.locator("[data-testid=messages]")).to_contain_text("Cancel requested")
    expect(page.locator("h1 .status")).to_have_text("cancelled", timeout=60_000)
    expect(page.locator("table[data-testid=events] tbody tr").last).to_have_attribute(
        "data-event", "cancelled"
    )
    assert fence.refused == []


def test_a_cancel_that_comes_too_late_shows_the_apis_409(
    browser: Browser, stack: Stack, user: tuple[str, str]
) -> None:
    origin = stack.parked_api_url  # its jobs stay queued
    job = api_create(origin, user[1])
    page, _ = fenced_page(browser, origin)
    sign_in(page, origin, user[1])
    page.goto(f"{origin}/#/jobs/{job['id']}")
    cancel = page.locator("h1 button:has-text('Cancel')")
    expect(cancel).to_be_visible()

    def end_the_job_first(route: Route) -> None:
        # The job ends between the click and the API's answer, as a worker would end it; done as
        # the request leaves the page, so the page cannot notice the end and hide the button first.
        with stack.sessions() as session:
            session.execute(update(fine_tunes).where(fine_tunes.c.id == job["id"]).values(status="completed"))
            session.commit()
        route.continue_()

    page.route(f"**/v1/fine-tunes/{job['id']}/cancel", end_the_job_first)
    cancel.click()
    expect(page.locator("[data-testid=messages]")).to_contain_text(
        f"Could not cancel (409): fine-tune {job['id']} is already completed"
    )
    expect(page.locator("h1 .status")).to_have_text("completed")


def test_a_bad_batch_size_shows_the_apis_message_next_to_the_field(
    browser: Browser, stack: Stack, user: tuple[str, str]
) -> None:
    origin = stack.parked_api_url
    page, fence = fenced_page(browser, origin)
    sign_in(page, origin, user[1])
    page.goto(f"{origin}/#/new")
    page.select_option("#field-model", "pi05-tiny")
    page.fill("#field-batch_size", "0")
    page.click("button:has-text('Start fine-tune')")
    expect(page.locator("[data-error-for=batch_size]")).to_have_text(
        "bad batch_size: 0 (must be an integer from 1 to 512)"
    )
    expect(page.locator("[data-error-for=dataset_name]")).to_contain_text("missing dataset_name (required;")
    expect(page.locator("[data-error-for=steps]")).to_have_text("")
    assert "invalid" in (page.get_attribute("#field-batch_size", "class") or "")
    # Nothing was created.
    answer = httpx.get(f"{origin}/v1/fine-tunes", headers={"authorization": f"Bearer {user[1]}"})
    assert answer.json()["data"] == []
    assert fence.refused == []


def test_another_users_job_and_session_are_not_found(
    browser: Browser, stack: Stack, user: tuple[str, str]
) -> None:
    origin = stack.parked_api_url
    _, other_key = stack.new_user()
    theirs = api_create(origin, other_key)
    their_session = httpx.post(
        f"{origin}/v1/sessions",
        json={"base_model": "pi05-tiny"},
        headers={"authorization": f"Bearer {other_key}"},
    ).json()
    page, _ = fenced_page(browser, origin)
    sign_in(page, origin, user[1])
    page.goto(f"{origin}/#/jobs/{theirs['id']}")
    expect(page.locator("[data-testid=not-found]")).to_contain_text(f"no fine-tune {theirs['id']}")
    page.goto(f"{origin}/#/sessions/{their_session['id']}")
    expect(page.locator("[data-testid=not-found]")).to_contain_text(
        f"no training session {their_session['id']}"
    )


def test_sessions_table_and_page_with_close(browser: Browser, stack: Stack, user: tuple[str, str]) -> None:
    origin = stack.parked_api_url  # its sessions stay starting
    created = httpx.post(
        f"{origin}/v1/sessions",
        json={"base_model": "pi05-tiny"},
        headers={"authorization": f"Bearer {user[1]}"},
    ).json()
    page, fence = fenced_page(browser, origin)
    sign_in(page, origin, user[1])
    page.click("nav >> text=Sessions")
    row = page.locator(f"tr[data-session={created['id']}]")
    expect(row.locator(".status")).to_have_text("starting")
    row.locator("a").click()
    expect(page.locator("[data-testid=session]")).to_contain_text("pi05-tiny")
    expect(page.locator("[data-testid=session]")).to_contain_text("Optimizer steps")
    expect(page.locator("table[data-testid=states]")).to_contain_text("None saved yet")
    page.click("h1 button:has-text('Close')")
    expect(page.locator("h1 .status")).to_have_text("closed")
    assert fence.refused == []


def test_the_jobs_table_pages_with_the_cursor_and_refreshes_itself(
    browser: Browser, stack: Stack, user: tuple[str, str]
) -> None:
    origin = stack.parked_api_url
    created = [api_create(origin, user[1], name=f"job-{n}")["id"] for n in range(21)]
    page, fence = fenced_page(browser, origin)
    sign_in(page, origin, user[1])
    rows = page.locator("table[data-testid=jobs] tbody tr[data-job]")
    expect(rows).to_have_count(20)
    assert rows.first.get_attribute("data-job") == created[-1]  # newest first
    page.click("button:has-text('Older')")
    expect(rows).to_have_count(1)
    assert rows.first.get_attribute("data-job") == created[0]
    page.click("button:has-text('Newer')")
    expect(rows).to_have_count(20)
    newest = api_create(origin, user[1], name="while-watching")["id"]
    expect(rows.first).to_have_attribute("data-job", newest)  # no reload: the table refreshed itself
    assert fence.refused == []


def test_the_form_offers_the_datasets_cameras_and_sends_the_chosen_mapping(
    browser: Browser, stack: Stack, video_dataset: Path, user: tuple[str, str], tmp_path: Path
) -> None:
    # An API that sees the workers' disk (as `relay server`), so it may describe a local dataset;
    # its jobs stay queued.
    api = ApiServer(
        stack.settings.model_copy(update={"fine_tune_queue": PARKED_QUEUE, "api_shares_workers_disk": True})
    )
    try:
        origin = api.url
        page, fence = fenced_page(browser, origin)
        crashes: list[str] = []
        page.on("pageerror", lambda error: crashes.append(str(error)))
        sign_in(page, origin, user[1])
        page.goto(f"{origin}/#/new")
        page.select_option("#field-model", "pi05-tiny")
        page.fill("#field-dataset_name", str(video_dataset))
        page.press("#field-dataset_name", "Tab")
        frames = json.loads((video_dataset / "meta/info.json").read_text())["total_frames"]
        expect(page.locator("[data-testid=dataset-summary]")).to_have_text(
            f"LeRobot v3.0, 5 episodes, {frames} frames, 10 fps, video h264"
        )
        # Every model camera is offered the dataset's cameras, the default mapping chosen.
        features = ["", "observation.images.top", "observation.images.wrist"]
        for camera, chosen in (
            ("base_0_rgb", "observation.images.top"),
            ("left_wrist_0_rgb", "observation.images.wrist"),
            ("right_wrist_0_rgb", ""),
        ):
            select = page.locator(f"#camera-{camera}")
            expect(select).to_have_value(chosen)
            assert select.locator("option").evaluate_all("os => os.map(o => o.value)") == features
        expect(page.locator("#camera-base_0_rgb option").nth(1)).to_have_text(
            "observation.images.top (video, 32x32)"
        )
        expect(page.locator("#field-cameras")).to_be_hidden()  # the picker stands in for the text box

        page.select_option("#camera-base_0_rgb", "observation.images.wrist")
        page.select_option("#camera-left_wrist_0_rgb", "")
        page.select_option("#camera-right_wrist_0_rgb", "observation.images.top")
        page.fill("#field-batch_size", "2")
        page.fill("#field-steps", "20")
        page.click("button:has-text('Start fine-tune')")
        page.wait_for_url(re.compile(r".*#/jobs/ft-[0-9a-f]{12}$"))
        job_id = page.url.rsplit("/", 1)[1]
        job = httpx.get(f"{origin}/v1/fine-tunes/{job_id}", headers={"authorization": f"Bearer {user[1]}"})
        assert job.json()["cameras"] == {
            "base_0_rgb": "observation.images.wrist",
            "right_wrist_0_rgb": "observation.images.top",
        }
        assert job.json()["dataset_name"] == str(video_dataset)

        # A dataset that cannot be described shows the API's message, and the text box again.
        page.goto(f"{origin}/#/new")
        page.select_option("#field-model", "pi05-tiny")
        nowhere = tmp_path / "nowhere"
        page.fill("#field-dataset_name", str(nowhere))
        page.press("#field-dataset_name", "Tab")
        expect(page.locator("[data-testid=dataset-error]")).to_have_text(
            f"dataset {nowhere}: no such directory: {nowhere}"
        )
        expect(page.locator("[data-testid=camera-picker]")).to_be_hidden()
        expect(page.locator("#field-cameras")).to_be_visible()
        page.fill("#field-dataset_name", "not a dataset")  # typed: described after a pause
        expect(page.locator("[data-testid=dataset-error]")).to_contain_text(
            'bad name: "not a dataset" (must be a Hub dataset repo id'
        )
        # Back to a good one: its cameras are offered again.
        page.fill("#field-dataset_name", str(video_dataset))
        expect(page.locator("#camera-left_wrist_0_rgb")).to_have_value("observation.images.wrist")
        expect(page.locator("[data-testid=dataset-error]")).to_have_count(0)
        assert crashes == [] and fence.refused == []
    finally:
        api.stop()
