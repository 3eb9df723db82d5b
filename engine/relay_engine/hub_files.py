"""Files of model repositories on the Hugging Face Hub (pi05 and RT-J weights, ONNX graphs), fetched
into the Hub cache.

HF_ENDPOINT, HF_TOKEN and HF_HUB_CACHE are read at each call (huggingface_hub reads them once, at
import), so a process can be pointed at another Hub, or cache, after it has started.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def download(repo: str, filename: str, *, revision: str | None = None) -> Path:
    """The local path of `filename` of the model repository `repo` at `revision` (a branch, tag
    or commit; None: the default branch). huggingface_hub's errors pass through."""
    from huggingface_hub import hf_hub_download

    return Path(
        hf_hub_download(
            repo,
            filename,
            revision=revision,
            endpoint=hub_endpoint(),
            token=os.environ.get("HF_TOKEN") or None,
            cache_dir=os.environ.get("HF_HUB_CACHE") or None,
        )
    )
