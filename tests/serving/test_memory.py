"""The serving process's memory under the largest requests the limits allow, measured on a policy
server in a process of its own, as a deployment's worker runs it (its resident set, sampled with
psutil while each request runs).

A fault probe's request (16 observations of two one-colour 4096x4096 PNGs, a 2.4 MiB body) cost a
serving worker 1.65 GB and 51 s: every image was decoded at full size and kept until the batch was
collated. Now each image is made the model's 224x224 input as it is decoded, and a request's images
may hold MAX_REQUEST_PIXELS decoded pixels together, counted from their headers first."""

from __future__ import annotations

import base64
import io
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
from PIL import Image

from relay_engine.serving import MAX_REQUEST_PIXELS

from .conftest import KEY

pytestmark = pytest.mark.slow

AUTH = {"Authorization": f"Bearer {KEY}"}
# What a request may add to the process at its peak: one image being decoded at the largest size
# (about 16 bytes a pixel: its uint8 RGB, the float copy and the resize), the kept 224x224 inputs of
# 192 images (0.6 MB each), the batch and the model's activations. The probe's request cost 1.65 GB.
PEAK_GROWTH_MAX = 600 << 20


def one_colour_png(width: int, height: int, colour: tuple[int, int, int]) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


SERVER = f"""
import threading
from relay_worker.serving.server import ServingOptions, start_policy_server
server = start_policy_server(
    "pi05-tiny", port=0, token={KEY!r}, options=ServingOptions(max_batch=64, device="cpu")
)
print(server.url, flush=True)
threading.Event().wait()
"""


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, psutil.Process]]:
    """A policy server of pi05-tiny (a base model: any of the three cameras, no stats)."""
    process = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://"), "the policy server ended before it served"
        yield url, psutil.Process(process.pid)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def peak_growth(process: psutil.Process, request: Any) -> tuple[httpx.Response, int]:
    """The answer to `request()`, and how far the process's resident set rose above where it was
    before, at its highest while the request ran (sampled every 2 ms)."""
    before = process.memory_info().rss
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.002):
            peak = max(peak, process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        answer = request()
    finally:
        done.set()
        sampler.join()
    return answer, max(peak, process.memory_info().rss) - before


def test_the_largest_requests_the_limits_allow_cost_the_server_bounded_memory(
    served: tuple[str, psutil.Process],
) -> None:
    url, process = served

    def post(observations: list[dict[str, Any]]) -> Any:
        body = {"observations": observations, "seeds": list(range(len(observations)))}
        return lambda: httpx.post(f"{url}/actions", json=body, headers=AUTH, timeout=600)

    warm = {"images": {"base_0_rgb": one_colour_png(32, 32, (1, 2, 3))}, "prompt": "warm up"}
    assert post([warm] * 64)().status_code == 200  # the first batch's allocations are not a request's

    # The probe's request: refused, naming the limit, once its images reach it (the image past it is
    # not decoded; those before it were, one at a time).
    big = one_colour_png(4096, 4096, (200, 40, 10))
    probe = [{"images": {"base_0_rgb": big, "left_wrist_0_rgb": big}, "prompt": "p"}] * 16
    answer, growth = peak_growth(process, post(probe))
    assert answer.status_code == 400, (answer.status_code, answer.text[:300])
    error = answer.json()["error"]
    assert error["code"] == "too_many_pixels" and "MAX_REQUEST_PIXELS" in error["message"], error
    print(f"\nthe probe's request: {answer.status_code}, peak +{growth >> 20} MB")
    assert growth < PEAK_GROWTH_MAX, growth

    # The largest allowed: 64 observations of three 640x480 cameras (MAX_REQUEST_PIXELS exactly),
    # and three cameras at the largest image size.
    cameras = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
    small = one_colour_png(640, 480, (10, 200, 40))
    many = [{"images": dict.fromkeys(cameras, small), "prompt": "p"}] * 64
    assert MAX_REQUEST_PIXELS == 64 * 3 * 640 * 480
    few_big = [{"images": dict.fromkeys(cameras, big), "prompt": "p"}]
    for name, observations in (("64 x 3 x 640x480", many), ("3 x 4096x4096", few_big)):
        answer, growth = peak_growth(process, post(observations))
        print(
            f"{name}: {answer.status_code} in {answer.elapsed.total_seconds():.1f} s, peak +{growth >> 20} MB"
        )
        assert answer.status_code == 200, answer.text[:300]
        assert len(answer.json()["actions"]) == len(observations)
        assert growth < PEAK_GROWTH_MAX, (name, growth)
