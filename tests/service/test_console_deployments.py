"""The console's deployments in a real browser (Debian's headless Chromium) against the real
service and a serving worker: a completed job is deployed from its page, its deployment's page
shows where robots connect, becomes ready, counts a robot's request, and is stopped; the list's
form shows the API's refusal of a bad model; another user's deployment is a 404 page."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from playwright.sync_api import Browser, expect
from websockets.sync.client import connect

from relay.http_client import Client
from relay.serving.images import observation_json
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_engine.serving import unpack
from tests.service.browser import fenced_page, sign_in
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def serving_worker(stack: Stack) -> Iterator[WorkerProcess]:
    worker = stack.start_standby_worker(queues=(stack.settings.serving_queue,))
    worker.wait_ready()
    yield worker
    worker.stop()


def test_a_completed_job_is_deployed_watched_and_stopped_from_the_console(
    browser: Browser,
    stack: Stack,
    worker: WorkerProcess,
    serving_worker: WorkerProcess,
    dataset: Path,
    user: tuple[str, str],
) -> None:
    client = Client(stack.api_url, user[1], max_retries=0)
    try:
        config = SFTConfig(
            model="pi05-tiny", dataset_name=str(dataset), batch_size=2, finetune="lora", steps=4
        )
        job = train(config, client=client).wait(poll=0.5)
    finally:
        client.close()
    assert job.status == "completed", job.error
    origin = stack.api_url
    page, fence = fenced_page(browser, origin)
    sign_in(page, origin, user[1])

    # The job's page offers to deploy it; the button opens the new deployment's page.
    page.goto(f"{origin}/#/jobs/{job.id}")
    page.click("[data-testid=deploy-job]")
    page.wait_for_url(re.compile(r".*#/deployments/dep-[0-9a-f]+$"))
    deployment_id = page.url.rsplit("/", 1)[1]
    details = page.locator("dl[data-testid=deployment]")
    expect(details).to_contain_text(job.id)
    expect(page.locator("[data-url=websocket]")).to_have_text(
        re.compile(rf"^ws://.*/v1/deployments/{deployment_id}/ws$")
    )
    expect(page.locator("pre[data-testid=connect]")).to_contain_text(f"/v1/deployments/{deployment_id}/ws")
    expect(page.locator("h1 .status")).to_have_text("ready", timeout=120_000)

    # What it loaded, as fields named as the deployment names its model: no JSON, no server path.
    page.reload()
    loaded = page.locator("dl[data-testid=deployment-model]")
    expect(loaded.locator("dd[data-field=model]")).to_have_text(job.id)
    expect(loaded.locator("dd[data-field=kind]")).to_have_text("pi05")
    expect(loaded.locator("dd[data-field=cameras]")).to_contain_text("observation.images.")
    expect(loaded.locator("dd[data-field=raw_units]")).to_have_text("yes")
    assert "{" not in loaded.inner_text() and str(stack.root) not in page.locator("main").inner_text()
    headers = {"authorization": f"Bearer {user[1]}"}
    shown = httpx.get(f"{origin}/v1/deployments/{deployment_id}", headers=headers).text
    assert json.loads(shown)["info"]["model"] == job.id and str(stack.root) not in shown
    ws_url = json.loads(shown)["websocket_url"]
    with connect(ws_url, additional_headers=headers) as websocket:  # openpi's metadata frame
        frame = unpack(websocket.recv())
    assert frame["model"] == job.id and str(stack.root) not in json.dumps(frame)

    # A robot's request, then its count on the page once the worker has reported it.
    info = httpx.get(
        f"{origin}/v1/deployments/{deployment_id}", headers={"authorization": f"Bearer {user[1]}"}
    ).json()["info"]
    rng = np.random.default_rng(0)
    observation = {
        "images": {camera: rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for camera in info["cameras"]},
        "state": rng.uniform(-1, 1, info["state_dim"] or 8).tolist(),
        "prompt": "move to the orange dot",
    }
    answer = httpx.post(
        f"{origin}/v1/deployments/{deployment_id}/actions",
        json={"observation": observation_json(observation), "seed": 1},
        headers={"authorization": f"Bearer {user[1]}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    expect(page.locator("[data-stat=Requests]")).to_have_text("1", timeout=30_000)
    expect(page.locator("[data-stat='Latency p50 / p90 / p99']")).to_contain_text("ms")

    # In the list, then stopped from its page.
    page.goto(f"{origin}/#/deployments")
    expect(page.locator(f"tr[data-deployment={deployment_id}]")).to_contain_text("ready")
    page.click(f"a[href='#/deployments/{deployment_id}']")
    page.click("button:has-text('Stop')")
    expect(page.locator("h1 .status")).to_have_text("stopped", timeout=60_000)
    expect(page.locator("table[data-testid=deployment-events] tbody tr").first).to_have_attribute(
        "data-event", "stopped"
    )

    # The form shows the API's refusal of a model that no worker could serve.
    page.goto(f"{origin}/#/deployments")
    page.fill("#deploy-model", "gpt-2")
    page.click("form[data-testid=deploy-form] button[type=submit]")
    expect(page.get_by_role("alert")).to_contain_text("model")

    # Another user's deployment is as absent as one that never was.
    other_page, other_fence = fenced_page(browser, origin)
    sign_in(other_page, origin, stack.new_user()[1])
    other_page.goto(f"{origin}/#/deployments/{deployment_id}")
    expect(other_page.locator("[data-testid=not-found]")).to_contain_text(deployment_id)
    assert fence.refused == [] and other_fence.refused == []
