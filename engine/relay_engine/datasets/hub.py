"""Resolve a dataset name to a directory on disk: a local directory, or a Hub repo's `v2.1` revision.

Hub datasets are fetched with huggingface_hub into `<cache>/hub` (its usual cache layout: blobs
written to a temporary name and renamed, snapshots of symlinks per commit). A file lock per repo
around the fetch makes a second worker wait for the first and then find every file in place, rather
than download the same files beside it. Once cached, a dataset needs the Hub only to learn whether
`v2.1` still points at the same commit; without the Hub, the cached snapshot is used.

`HF_ENDPOINT` and `HF_TOKEN` are read at each call (huggingface_hub reads the endpoint only when it
is imported), so a worker's environment or a test's loopback Hub applies without a restart.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from filelock import FileLock

from relay.dataset_names import local_dataset_path
from relay_engine.errors import DatasetError
from relay_engine.paths import cache_dir_or_default

REVISION = "v2.1"
# What training reads. Videos are never fetched: a dataset that stores them is refused anyway.
FETCH_PATTERNS = ["meta/*", "data/*", "norm_stats.json"]
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")
_DEFAULT_ENDPOINT = "https://huggingface.co"


def resolve_dataset(
    name_or_path: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
) -> Path:
    """The dataset's root directory. Local: an absolute path, `~/...`, `./...` or a `file://` URL.
    Anything else is a Hub dataset repo id, fetched at revision v2.1 into the cache (once)."""
    local = local_path(name_or_path)
    if local is not None:
        if not local.is_dir():
            raise DatasetError(name_or_path, f"no such directory: {local}")
        return local
    if not _REPO_ID.fullmatch(name_or_path) or ".." in name_or_path:
        raise DatasetError(
            name_or_path,
            "is neither a Hub dataset repo id (like lerobot/pusht_image) nor a local directory "
            "(an absolute path or a file:// URL)",
        )
    return _fetch(name_or_path, cache_dir_or_default(cache_dir), token)


def local_path(name_or_path: str) -> Path | None:
    """The directory a name means, if it names a local one (it may not exist), else None."""
    return local_dataset_path(name_or_path)


def _fetch(repo_id: str, cache: Path, token: str | None) -> Path:
    # Imported here: huggingface_hub is only needed for Hub datasets, and takes a while to import.
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = (os.environ.get("HF_ENDPOINT") or _DEFAULT_ENDPOINT).rstrip("/")
    locks = cache / "locks"
    try:
        locks.mkdir(parents=True, exist_ok=True)
        with FileLock(locks / f"{repo_id.replace('/', '--')}.lock"):
            path = snapshot_download(
                repo_id,
                repo_type="dataset",
                revision=REVISION,
                cache_dir=cache / "hub",
                allow_patterns=FETCH_PATTERNS,
                endpoint=endpoint,
                token=token,
            )
    except RevisionNotFoundError:
        raise DatasetError(repo_id, _no_v21_revision(repo_id, endpoint, token)) from None
    except GatedRepoError:
        raise DatasetError(
            repo_id, f"is gated on {endpoint}: accept its terms there and set HF_TOKEN to your token"
        ) from None
    except RepositoryNotFoundError:
        raise DatasetError(
            repo_id,
            f"no such dataset repo on {endpoint} (a private one needs HF_TOKEN; "
            "a local directory needs an absolute path or a file:// URL)" + _local_hint(repo_id),
        ) from None
    except LocalEntryNotFoundError:
        raise DatasetError(
            repo_id, f"cannot reach {endpoint}, and it is not in the cache at {cache}" + _local_hint(repo_id)
        ) from None
    except HfHubHTTPError as error:
        raise DatasetError(repo_id, f"{endpoint} answered: {error}") from None
    except OSError as error:
        raise DatasetError(repo_id, f"cannot be fetched into {cache}: {error}") from None
    return Path(path)


def _local_hint(repo_id: str) -> str:
    """A name read as a Hub repo id may have meant a directory here: say so, and how to name it."""
    if not Path(repo_id).is_dir():
        return ""
    return (
        f"; a local directory {repo_id} exists, but a relative name is read as a Hub repo id: "
        f"give its absolute path ({Path(repo_id).absolute()}) or ./{repo_id}"
    )


def _no_v21_revision(repo_id: str, endpoint: str, token: str | None) -> str:
    message = (
        f"has no {REVISION} revision (branch or tag) on {endpoint}; Relay reads LeRobot v2.1 datasets, "
        "and v3.0 datasets are not supported yet"
    )
    from huggingface_hub import HfApi

    try:
        refs = HfApi(endpoint=endpoint, token=token).list_repo_refs(repo_id, repo_type="dataset")
    except Exception:  # only a hint for the message; the error above stands on its own
        return message
    names = sorted({ref.name for ref in (*refs.branches, *refs.tags)})
    return f"{message} (its revisions: {', '.join(names)})" if names else message
