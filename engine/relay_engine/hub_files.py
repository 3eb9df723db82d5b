"""Files of model repositories on the Hugging Face Hub (pi05 and RT-J weights, ONNX graphs), fetched
into the Hub cache.

HF_ENDPOINT, HF_TOKEN and HF_HUB_CACHE are read at each call (huggingface_hub reads them once, at
import), so a process can be pointed at another Hub, or cache, after it has started.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_ENDPOINT = "https://huggingface.co"


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


# How long the Hub gets to accept a connection before a fetch reads the cache alone.
CONNECT_SECONDS = 5.0


def download(repo: str, filename: str, *, revision: str | None = None) -> Path:
    """The local path of `filename` of the model repository `repo` at `revision` (a branch, tag
    or commit; None: the default branch). huggingface_hub's errors pass through.

    Where the Hub cannot be reached at all (offline, a name that does not resolve), the cache is
    read at once: huggingface_hub would retry the request with back-off for most of a minute
    first (52 s were seen), while a dataset's fetch fails in a second."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    endpoint = hub_endpoint()
    why = unreachable(endpoint)
    try:
        return Path(
            hf_hub_download(
                repo,
                filename,
                revision=revision,
                endpoint=endpoint,
                token=os.environ.get("HF_TOKEN") or None,
                cache_dir=os.environ.get("HF_HUB_CACHE") or None,
                local_files_only=why is not None,
            )
        )
    except LocalEntryNotFoundError:
        if why is None:
            raise
        raise ConnectionError(f"cannot reach {endpoint} ({why}), and it is not in the Hub cache") from None


def unreachable(endpoint: str) -> str | None:
    """Why `endpoint` accepts no connection within CONNECT_SECONDS (None: it does)."""
    address = urlsplit(endpoint)
    port = address.port or (443 if address.scheme == "https" else 80)
    try:
        with socket.create_connection((address.hostname or "", port), timeout=CONNECT_SECONDS):
            return None
    except OSError as error:
        return str(error) or type(error).__name__
