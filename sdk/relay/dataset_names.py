"""Which dataset names mean a directory on disk: one rule for the SDK, the API and the engine.

The API refuses local directories when the service does not read them (RELAY_LOCAL_DATASETS=false),
and the engine reads a local directory instead of asking the Hub; both ask this one predicate, so
nothing the API lets through as a Hub name is read from a worker's disk (`"."` once was).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

# A Hub dataset repo id, by the Hub's rules (huggingface_hub's validate_repo_id, in ASCII): `name` or
# `owner/name`, each part 1 to 96 letters, digits, `_`, `-` and `.`, starting and ending with a letter,
# digit or `_`; no `--` or `..`, and not ending in `.git`. Written so that the API's OpenAPI document
# can state it as the JSON Schema pattern it enforces.
_HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
HUB_REPO_ID_PATTERN = rf"(?!.*(?:--|\.\.))(?!.*\.git$){_HUB_PART}(?:/{_HUB_PART})?"
# The names that mean a local directory, as a pattern: an absolute path, `~...`, `./...`, `../...`,
# `.`, `..`, or a file: URL of this host (local_dataset_path).
LOCAL_NAME_PATTERN = r"(?:/|~|\./|\.\./|file:(?:///|//localhost/|/[^/\x00-\x1f\x7f]))[^\x00-\x1f\x7f]*|\.\.?"
# Every name a dataset may have: a Hub repo id or a local directory.
DATASET_NAME_PATTERN = rf"^(?:{HUB_REPO_ID_PATTERN}|{LOCAL_NAME_PATTERN})$"


def is_hub_repo_id(name: str) -> bool:
    """Whether `name` is a well-formed Hub dataset repo id (lerobot/pusht_image)."""
    return re.fullmatch(HUB_REPO_ID_PATTERN, name) is not None


def local_dataset_path(name_or_path: str) -> Path | None:
    """The directory a dataset name means, if it names one on this machine (it may not exist): an
    absolute path, ``~/...``, ``.``, ``..``, ``./...``, ``../...`` or a ``file://`` URL. Anything else
    (``lerobot/pusht_image``) is a Hub repo id, and None."""
    if name_or_path.startswith("file:"):
        url = urlparse(name_or_path)
        if url.netloc not in ("", "localhost"):
            return None
        return Path(unquote(url.path))
    if (
        os.path.isabs(name_or_path)
        or name_or_path in (".", "..")
        or name_or_path.startswith(("~", "./", "../"))
    ):
        try:
            return Path(name_or_path).expanduser().absolute()
        except RuntimeError:  # `~someone` with no such user (or no home directory): the name as it is
            return Path(name_or_path).absolute()
    return None


def names_local_directory(name_or_path: str) -> bool:
    """Whether a dataset name would be read from the disk of the machine that trains on it."""
    return name_or_path.startswith("file:") or local_dataset_path(name_or_path) is not None
