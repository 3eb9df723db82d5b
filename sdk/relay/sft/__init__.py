"""Recipe jobs: ``from relay.sft.config import SFTConfig``, ``from relay.sft.train import train``.

``list_jobs`` and ``retrieve`` find jobs again. ``relay.sft.train(config)`` works too: the package
exports the function under its module's name (``from relay.sft.train import train`` still finds it).
"""

from __future__ import annotations

from relay import http_client
from relay.sft.config import SFTConfig
from relay.sft.job import FINE_TUNES, Event, FineTuneJob
from relay.sft.train import train

__all__ = ["Event", "FineTuneJob", "SFTConfig", "list_jobs", "retrieve", "train"]

JOBS_PAGE = 100


def retrieve(id: str, *, client: http_client.Client | None = None) -> FineTuneJob:
    """The job `id` (``"ft-..."``), as the API reports it now."""
    client = client or http_client.default_client()
    return FineTuneJob(client.request("GET", f"{FINE_TUNES}/{id}"), client)


def list_jobs(limit: int | None = None, *, client: http_client.Client | None = None) -> list[FineTuneJob]:
    """Your jobs, newest first: all of them, or the newest `limit`."""
    client = client or http_client.default_client()
    jobs: list[FineTuneJob] = []
    after: str | None = None
    while limit is None or len(jobs) < limit:
        page_size = JOBS_PAGE if limit is None else min(JOBS_PAGE, limit - len(jobs))
        page = client.request("GET", FINE_TUNES, params={"after": after, "limit": page_size})
        jobs.extend(FineTuneJob(item, client) for item in page["data"])
        if not page.get("has_more") or not page["data"]:
            break
        after = jobs[-1].id
    return jobs
