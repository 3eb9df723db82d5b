"""The web console in a real browser (Debian's headless Chromium through Playwright) against the
real service: sign in, start a pi05-tiny job and watch its loss chart grow, read its events and
its results card, download its model, see a running job's ETA and cancel it, a queued job's empty
charts say why, a long log newest first with the validation and closed-loop figures, see the
API's 409 and a field's error, and find another user's job and session absent. Every page is
fenced to the server: none may reach the internet."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, expect
from sqlalchemy import update

from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.db import utcnow
from relay_api.event_rows import insert_event_row
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
    # Newest first: the output written after the loop's last step, in words.
    expect(events.first).to_have_attribute("data-event", "stage")
    expect(events.first.locator("td").last).to_have_text("writing the output")
    expect(events.nth(1)).to_have_attribute("data-event", "finished")
    assert page.locator("table[data-testid=events] tr[data-event=checkpoint]").count() == 2
    assert_the_results_card(page, origin, user[1], job_id)
    expect(page.locator("[data-testid=timeline]")).to_contain_text("queued")
    expect(page.locator("[data-testid=timeline] .status").last).to_have_text("completed")
    expect(page.locator("[data-config=batch_size]")).to_have_text("2")
    # What the worker read, in one line: the local directory, its format and size.
    expect(page.locator("dd[data-field=read]")).to_have_text(
        re.compile(rf"^{re.escape(str(dataset))}, LeRobot v2\.1, 4 episodes, [\d,]+ frames$")
    )

    model = page.locator("tr[data-file='output/model.safetensors']")
    expect(model).to_be_visible()
    # The files table (64-digit sha256s, long checkpoint paths) fits a 1,280 px window.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
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


def figures(text: str) -> list[float]:
    return [float(found) for found in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text)]


def assert_the_results_card(page: Page, origin: str, key: str, job_id: str) -> None:
    """The card of a completed 20-step job shows the API's summary of it."""
    card = httpx.get(
        f"{origin}/v1/fine-tunes/{job_id}/summary", headers={"authorization": f"Bearer {key}"}
    ).json()
    results = page.locator("[data-testid=results]")
    expect(results.locator("[data-result=progress]")).to_have_text("20 / 20 steps (100%)")
    expect(results.locator("[data-result=duration]")).to_contain_text("(queued ")
    expect(results.locator("[data-result=eta]")).to_have_count(0)  # it has ended
    loss = results.locator("[data-result=loss]")
    expect(loss).to_have_text(
        re.compile(r"^first \S+ \(step 10\), last \S+ \(step 20\), best \S+ \(step (10|20)\)$")
    )
    shown = figures(loss.inner_text())
    for at, name in ((0, "first"), (2, "last"), (4, "best")):
        assert shown[at] == pytest.approx(card["loss"][name]["loss"], rel=1e-3)
    pace = figures(results.locator("[data-result=pace]").inner_text())
    assert pace[0] == pytest.approx(card["steps_per_second"], rel=1e-2)
    # Each checkpoint's figures, in its table and beside its files.
    rows = page.locator("table[data-testid=checkpoint-figures] tbody tr")
    expect(rows).to_have_count(2)
    for row, checkpoint in zip(rows.all(), card["checkpoints"], strict=True):
        assert figures(row.locator("[data-figure=loss]").inner_text())[0] == pytest.approx(
            checkpoint["loss"], rel=1e-3
        )
    expect(page.locator("tr[data-folder='checkpoints/step-00000020']")).to_contain_text("step 20 · loss ")
    expect(page.locator("tr[data-folder=output]")).to_contain_text("trained 20 steps, last loss ")
    # Use this model, with the job's id in every command.
    expect(page.locator("[data-use=download]")).to_have_text(
        f"relay fine-tunes download {job_id} --dir {job_id}"
    )
    expect(page.locator("[data-use=note]")).to_have_count(0)  # completed: nothing to wait for
    expect(page.locator("[data-testid=use]")).not_to_contain_text("null")
    expect(page.locator("[data-use=python]")).to_contain_text(f'policy = load_policy("{job_id}")')
    expect(page.locator("[data-use=lerobot]")).to_contain_text("refuses a pi05-tiny output")
    expect(page.locator("[data-use=deploy]")).to_contain_text(f"relay local eval --model {job_id} --dataset ")
    # The charts' x axis spans the job's steps.
    assert page.evaluate("[relayConsole.plots.loss.scales.x.min, relayConsole.plots.loss.scales.x.max]") == [
        0,
        20,
    ]


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
    # While it runs: the time since it started and an ETA at its latest pace; the charts span all
    # 100,000 steps from their first point.
    expect(page.locator("[data-result=eta]")).to_contain_text(" left at ", timeout=120_000)
    expect(page.locator("[data-result=elapsed]")).to_contain_text("(queued ")
    wait_for(lambda: points(page, "loss") >= 1, 120, "the first loss point")
    assert page.evaluate("relayConsole.plots.loss.scales.x.max") == 100_000
    page.click("h1 button:has-text('Cancel')")
    expect(page.locator("[data-testid=messages]")).to_contain_text("Cancel requested")
    expect(page.locator("h1 .status")).to_have_text("cancelled", timeout=60_000)
    expect(page.locator("table[data-testid=events] tbody tr").first).to_have_attribute(
        "data-event", "cancelled"
    )
    expect(page.locator("[data-result=duration]")).to_be_visible()
    expect(page.locator("[data-result=eta]")).to_have_count(0)
    expect(page.locator("[data-use=note]")).to_contain_text("This job ended cancelled, so it has no output")
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
    # A queued job's charts say why they are empty.
    for chart in ("loss", "grad_norm", "lr"):
        expect(page.locator(f"[data-chart={chart}] [data-empty]")).to_have_text(
            "No metrics yet: the job is queued, waiting for a worker"
        )
    expect(page.locator("[data-result=queued]")).to_be_visible()

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


def test_a_long_log_newest_first_and_the_validation_and_closed_loop_figures(
    browser: Browser, stack: Stack, user: tuple[str, str]
) -> None:
    """Events as a worker writes them (the one writer, event_rows.insert_event_row) for a job that
    stays queued: 60 metrics windows, two checkpoints, and a validation and an evaluation report at
    each. The card shows their figures (the summary's validation and eval slots), the log its newest
    50 events until Show all."""
    origin = stack.parked_api_url
    job = api_create(origin, user[1], steps=1000)
    written = utcnow()
    with stack.sessions() as session:
        for n in range(1, 61):
            window = {
                "loss": 1 / n,
                "grad_norm": 1.0,
                "lr": 1e-3,
                "steps_per_second": 2.0,
                "samples_per_second": 40.0,
            }
            insert_event_row(session, job["id"], 10 * n, "metrics", 0, window, written)
        # Step 200's validation as stored before the mean of chunks (one chunk's error alone),
        # step 400's as scored since: a job resumed across the change has both.
        scorings = (
            {"action_mse": 0.012},
            {"mean_action_mse": 0.015, "action_spread": 0.002, "action_mse": 0.017, "chunks": 4},
        )
        for step, scores, success_rate in ((200, scorings[0], 0.6), (400, scorings[1], 0.55)):
            insert_event_row(session, job["id"], step, "checkpoint", 0, {"seconds": 1.5}, written)
            figures = {
                "validation_loss": 0.1,
                **scores,
                "blind_mse": 0.028,
                "frames": 48,
                "episodes": 4,
                "seconds": 0.5,
            }
            insert_event_row(session, job["id"], step, "validation", 0, figures, written)
            insert_event_row(session, job["id"], step, "eval", 0, {"success_rate": success_rate}, written)
        session.execute(update(fine_tunes).where(fine_tunes.c.id == job["id"]).values(step=600))
        session.commit()
    page, fence = fenced_page(browser, origin)
    sign_in(page, origin, user[1])
    page.goto(f"{origin}/#/jobs/{job['id']}")

    results = page.locator("[data-testid=results]")
    expect(results.locator("[data-result=validation] [data-validation=best]")).to_have_text(
        "best at step 200: action error 0.012 (one chunk) vs blind 0.028 (2.33x better), validation "
        "loss 0.1, 48 frames of 4 episodes"
    )
    expect(results.locator("[data-result=validation] [data-validation=last]")).to_have_text(
        "last at step 400: action error 0.015 (mean of 4 chunks) vs blind 0.028 (1.87x better), one "
        "chunk 0.017, spread 0.002, validation loss 0.1, 48 frames of 4 episodes"
    )
    expect(results.locator("[data-result=eval]")).to_have_text(
        "success 55% at step 400 (best 60% at step 200)"
    )
    expect(results.locator("[data-result=loss]")).to_have_text(
        "first 1 (step 10), last 0.01667 (step 600), best 0.01667 (step 600)"
    )
    rows = page.locator("table[data-testid=checkpoint-figures] tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first.locator("[data-figure=validation]")).to_have_text("0.012")
    expect(rows.nth(1).locator("[data-figure=validation]")).to_have_text("0.015")  # the headline
    expect(rows.first.locator("[data-figure=success]")).to_have_text("60%")
    expect(rows.first.locator("[data-figure=loss]")).to_have_text("0.05")
    expect(rows.first).to_contain_text("pruned")  # no files on this disk

    wait_for(lambda: points(page, "loss") == 60, 30, "every loss point")
    assert page.evaluate("[relayConsole.plots.loss.scales.x.min, relayConsole.plots.loss.scales.x.max]") == [
        0,
        1000,
    ]
    log = page.locator("table[data-testid=events] tbody tr")
    expect(log).to_have_count(50)
    expect(page.locator("h2:has-text('Events')")).to_contain_text("(newest 50 of 66)")
    expect(log.first).to_have_attribute("data-event", "eval")  # the last written
    page.click("[data-testid=show-all]")
    expect(log).to_have_count(66)
    expect(log.last.locator("td").nth(2)).to_have_text("10")  # the oldest, at the bottom
    page.click("[data-testid=show-all]")
    expect(log).to_have_count(50)
    assert fence.refused == []


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


def test_a_job_page_shows_no_stray_text_code_as_code_and_one_point_over_the_jobs_steps(
    browser: Browser, stack: Stack, user: tuple[str, str]
) -> None:
    """A job without an eval block leaves no trace of the section it lacks (the page once said
    "nullnull" under its charts); the Deploy paragraph shows its commands as code, not between
    backticks; a chart of one point (an evaluation at the last step only) spans the job's steps."""
    origin = stack.parked_api_url
    plain = api_create(origin, user[1], steps=60)
    evaluated = api_create(
        origin, user[1], steps=60, eval={"env": "relay/Dot-v0", "episodes": 2, "max_steps": 10}
    )
    written = utcnow()
    with stack.sessions() as session:
        for job in (plain, evaluated):
            for step in range(10, 61, 10):
                window = {"loss": 1 / step, "grad_norm": 1.0, "lr": 1e-3, "steps_per_second": 2.0}
                insert_event_row(session, job["id"], step, "metrics", 0, window, written)
        insert_event_row(session, evaluated["id"], 60, "eval", 0, {"success_rate": 0.5}, written)
        session.commit()
    page, fence = fenced_page(browser, origin)
    sign_in(page, origin, user[1])

    page.goto(f"{origin}/#/jobs/{plain['id']}")
    wait_for(lambda: points(page, "loss") == 6, 30, "every loss point")
    expect(page.locator("[data-testid=evaluations]")).to_have_count(0)
    assert "null" not in page.locator("#view").inner_text()
    deploy = page.locator("[data-use=deploy]")
    expect(deploy.locator("code").first).to_have_text(f"relay deployments create {plain['id']}")
    assert "`" not in deploy.inner_text()

    page.goto(f"{origin}/#/jobs/{evaluated['id']}")
    wait_for(lambda: points(page, "success_rate") == 1, 30, "the one success-rate point")
    x_range = "[relayConsole.plots.success_rate.scales.x.min, relayConsole.plots.success_rate.scales.x.max]"
    assert page.evaluate(x_range) == [0, 60]
    assert fence.refused == []
