"""`train`: start a recipe job on Relay's GPUs."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from relay import http_client
from relay.dataset_names import local_dataset_path
from relay.integrations import REVEAL_SECRETS
from relay.sft.config import SFTConfig
from relay.sft.job import FINE_TUNES, FineTuneJob


def train(
    config: SFTConfig | Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    client: http_client.Client | None = None,
) -> FineTuneJob:
    """Start a fine-tune and return at once with the job (``queued``); ``job.wait()`` waits for it.

    A plain mapping is sent as it is and checked by the API. The request carries an Idempotency-Key
    (a fresh one unless given), so a retry after a dropped connection cannot start a second job.
    """
    client = client or http_client.default_client()
    # JSON as the API reads it, with any tracker key as given (every other dump of a config masks it).
    body = (
        config.model_dump(mode="json", context={REVEAL_SECRETS: True})
        if isinstance(config, SFTConfig)
        else dict(config)
    )
    # ./dots is the caller's, not relative to wherever the service runs: a mixture's names too, so
    # that its dataset_name is still its first dataset's.
    if "dataset_name" in body:
        body["dataset_name"] = _named_here(body["dataset_name"])
    for entry in body.get("datasets") or ():
        if isinstance(entry, dict):
            entry["name"] = _named_here(entry.get("name"))
    headers = {"idempotency-key": idempotency_key or uuid.uuid4().hex}
    created = client.request("POST", FINE_TUNES, json_body=body, headers=headers, retry=True)
    return FineTuneJob(created, client)


def _named_here(name: Any) -> Any:
    """A local dataset directory by its absolute path on this machine; any other name as it is."""
    local = local_dataset_path(name) if isinstance(name, str) and not name.startswith("file:") else None
    return str(local) if local is not None else name
