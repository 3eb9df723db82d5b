"""Outages of what the service stands on, while a job trains: PostgreSQL cut off (through a TCP
proxy) for longer than the worker's old retries lasted (about 3 s)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from relay._http import Client
from relay.sft.config import SFTConfig
from relay.sft.train import train
from tests.service.proxy import CuttableProxy
from tests.service.stack import ApiServer, Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow

OUTAGE_SECONDS = 8.0  # well past the old ~3 s of retries, well inside the 30 s lease below
LEASE_SECONDS = 30.0


def test_a_database_outage_costs_a_training_job_nothing(stack: Stack, dataset: Path) -> None:
    parts = urlsplit(stack.database_url)
    proxy = CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    proxied_url = stack.database_url.replace(parts.netloc, f"{parts.username}@127.0.0.1:{proxy.port}")
    queue = "relay.outage"
    settings = stack.settings.model_copy(
        update={
            "database_url": proxied_url.replace("postgresql://", "postgresql+psycopg://", 1),
            "fine_tune_queue": queue,
            "session_queue": queue + "-sessions",
            "lease_seconds": LEASE_SECONDS,
        }
    )
    api = ApiServer(settings)
    env = {
        **os.environ,
        **stack.env_settings,
        "RELAY_DATABASE_URL": proxied_url,
        "RELAY_FINE_TUNE_QUEUE": queue,
        "RELAY_SESSION_QUEUE": queue + "-sessions",
        "RELAY_LEASE_SECONDS": str(LEASE_SECONDS),
    }
    worker = WorkerProcess(env, stack.root / "worker-outage.log")
    worker.start()
    _, key = stack.new_user()
    client = Client(api.url, key, max_retries=0)
    try:
        worker.wait_ready()
        config = SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=60)
        job = train(config, client=client)
        wait_for(lambda: job.refresh().step >= 10, 300, "the job's first events", every=0.2)

        proxy.cut()
        cut_at = time.monotonic()
        answers: list[httpx.Response] = []
        with httpx.Client(base_url=api.url, headers={"authorization": f"Bearer {key}"}) as http:
            while time.monotonic() - cut_at < OUTAGE_SECONDS:
                answers.append(http.get(f"/v1/fine-tunes/{job.id}", timeout=30))
                time.sleep(0.5)
        proxy.restore()

        statuses = {answer.status_code for answer in answers}
        assert 503 in statuses and not {s for s in statuses if s >= 500} - {503}, statuses
        refused = next(answer for answer in answers if answer.status_code == 503)
        assert refused.headers["retry-after"].isdigit()
        assert refused.json()["error"]["code"] == "database_unavailable"

        wait_for(lambda: job.refresh().status in ("completed", "error"), 300, "the job to end", every=0.5)
        assert job.status == "completed", (job.error, worker.log_tail())
        assert job.to_dict()["attempts"] == 1
        events = job.events()
        kinds = [(e["step"], e.get("event", "metrics")) for e in events]
        assert [s for s, kind in kinds if kind == "metrics"] == [10, 20, 30, 40, 50, 60], kinds
        assert [s for s, kind in kinds if kind == "checkpoint"] == [10, 20, 30, 40, 50, 60], kinds
        assert not [kind for _, kind in kinds if kind in ("retry", "resumed", "error")], kinds
        assert "the database is unreachable" in worker.log_since_start()
    finally:
        client.close()
        worker.stop()
        api.stop()
        proxy.close()
