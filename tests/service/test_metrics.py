"""/metrics scraped from the served API while a real worker trains a job, and the offline API docs."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from relay_api.app import create_app
from tests.service.stack import Stack, WorkerProcess, wait_for


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    answer = httpx.get(url + "/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.mark.slow
def test_metrics_while_a_job_runs(stack: Stack, worker: WorkerProcess, client: Client, dataset: Path) -> None:
    job = train(
        SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=100_000), client=client
    )
    # The first metrics event (step 10) carries the job's speed; a checkpoint event follows it.
    wait_for(
        lambda: any(e.get("event") == "checkpoint" for e in job.events()), 120, "the job's first checkpoint"
    )
    client.request("GET", f"/v1/fine-tunes/{job.id}")

    samples = scrape(stack.api_url)
    job.cancel()
    assert value(samples, "relay_fine_tunes", status="running") >= 1
    assert value(samples, "relay_workers_alive") >= 1
    assert value(samples, "relay_queue_depth") >= 0 and value(samples, "relay_queue_oldest_age_seconds") >= 0
    assert value(samples, "relay_fine_tune_steps_per_second", job=job.id) > 0
    # batch_size 2: twice as many samples as steps.
    assert value(samples, "relay_fine_tune_samples_per_second", job=job.id) == pytest.approx(
        2 * value(samples, "relay_fine_tune_steps_per_second", job=job.id)
    )
    assert 0 <= value(samples, "relay_fine_tune_data_wait_ratio", job=job.id) <= 1
    assert value(samples, "relay_fine_tune_checkpoint_seconds", job=job.id) > 0
    assert ("relay_fine_tune_gpu_memory_bytes", frozenset({("job", job.id)})) not in samples  # CPU only
    # Requests are counted under their route template, not the job's own path.
    route = {"method": "GET", "route": "/v1/fine-tunes/{job_id}", "status": "200"}
    assert value(samples, "relay_http_requests_total", **route) >= 1
    assert not any(job.id in dict(labels).get("route", "") for _, labels in samples)
    assert (
        value(
            samples,
            "relay_http_request_duration_seconds_count",
            method="GET",
            route="/v1/fine-tunes/{job_id}",
        )
        >= 1
    )
    wait_for(lambda: job.refresh().status == "cancelled", 60, "the job to stop")


def test_metrics_are_off_unless_enabled(stack: Stack) -> None:
    with TestClient(create_app(stack.settings.model_copy(update={"metrics": False}))) as api:
        answer = api.get("/metrics")
    assert answer.status_code == 404
    assert (
        answer.json()["error"]["message"]
        == "metrics are off on this server (RELAY_METRICS=true turns them on)"
    )


EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.IGNORECASE)


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/"])
def test_docs_and_console_load_nothing_from_other_sites(stack: Stack, path: str) -> None:
    with TestClient(create_app(stack.settings)) as api:
        page = api.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "http://" not in page.text and "https://" not in page.text
        assert not EXTERNAL.search(page.text)
        # Every file the page names is served from the package.
        for asset in re.findall(r"""(?:src|href)=["'](/[^"']+)["']""", page.text):
            assert api.get(asset).status_code == 200, asset
