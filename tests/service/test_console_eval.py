"""The console's closed-loop evaluation in a real browser (Debian's headless Chromium through
Playwright) against the real service: a job started from the form with an `eval` block shows its
success rate over checkpoints beside the loss, each evaluation's figures, and its videos playing
in the page from the job's files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.service.browser import chart_points as points
from tests.service.browser import fenced_page, sign_in, start_tiny_job_from_the_form
from tests.service.stack import Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow

# A decoded frame is on hand (HAVE_CURRENT_DATA) and it is not black: drawn into a canvas, over
# a tenth of its pixels are lit.
SHOWS_A_FRAME = """v => {
  if (v.readyState < 2) return false;
  const canvas = document.createElement("canvas");
  canvas.width = v.videoWidth;
  canvas.height = v.videoHeight;
  const context = canvas.getContext("2d");
  context.drawImage(v, 0, 0);
  const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
  let lit = 0;
  for (let i = 0; i < pixels.length; i += 4) if (pixels[i] + pixels[i + 1] + pixels[i + 2] > 60) lit++;
  return lit > pixels.length / 40;
}"""

EVAL = {"env": "relay/Dot-v0", "episodes": 2, "max_steps": 10, "at_checkpoints": True, "videos": 1}


def test_a_job_with_an_eval_block_charts_its_success_rate_and_plays_its_videos(
    browser: Browser, stack: Stack, worker: WorkerProcess, dataset: Path, user: tuple[str, str]
) -> None:
    origin = stack.api_url
    page, fence = fenced_page(browser, origin)
    sign_in(page, origin, user[1])

    start_tiny_job_from_the_form(page, dataset, eval=json.dumps(EVAL))

    expect(page.locator("[data-chart=success_rate] h3")).to_have_text("closed-loop success rate")
    expect(page.locator("h1 .status")).to_have_text("completed", timeout=120_000)
    wait_for(lambda: points(page, "success_rate") == 2, 20, "a success-rate point per checkpoint")

    blocks = page.locator("[data-testid=evaluations] [data-evaluation]")
    expect(blocks).to_have_count(2)
    expect(blocks.nth(1)).to_contain_text(
        re.compile(r"step 20: relay/Dot-v0: success \d+% of 2 episodes, mean reward [\d.e-]+, mean length")
    )
    # Each evaluation's first episode, decoded and playable by the browser.
    video = blocks.nth(1).locator("video")
    expect(video).to_have_count(1)
    expect(video).to_have_attribute("data-video", "eval/step-00000020/episode_0000.mp4")
    expect(video).to_have_attribute("src", re.compile(r"^blob:"))
    wait_for(lambda: video.evaluate("v => v.readyState") >= 1, 20, "the video's metadata")
    assert video.evaluate("v => v.error === null && v.duration > 0 && v.videoWidth > 0")
    # Its first frame shows before anyone presses play (it was a black box until played).
    wait_for(lambda: video.evaluate(SHOWS_A_FRAME), 20, "the video's first frame, unplayed")
    assert video.evaluate("v => v.paused")
    expect(page.locator("[data-result=eval]")).to_contain_text("at step 20")
    assert fence.refused == []
