"""Resolve a dataset name to a directory on disk and say what was read: a local directory, or a
revision of a Hub dataset repo (`locate_dataset -> DatasetSource`; `resolve_dataset` is its root).

Which revision of a Hub repo is read (docs/datasets.md, "Which revision is read"):

1. the revision the user names (`dataset_revision`, `--revision`): a branch, a tag or a commit sha;
2. else the `v2.1` tag (or branch), where LeRobot keeps a dataset's v2.1 layout after converting
   its main branch to v3.0;
3. else the default branch, when its `meta/info.json` says `codebase_version` v3.0.

Each revision's `meta/info.json` is fetched first and its format checked, then the rest of that
commit's files; a format Relay does not read is refused before anything else is downloaded.

Hub datasets are fetched with huggingface_hub into `<cache>/hub` (its usual cache layout: blobs
written to a temporary name and renamed, snapshots of symlinks per commit). A file lock per repo
around the fetch makes a second worker wait for the first and then find every file in place, rather
than download the same files beside it. Once cached, a dataset needs the Hub only to learn whether
its revision still points at the same commit; without the Hub, the cached snapshot is used.

`HF_ENDPOINT` and `HF_TOKEN` are read at each call (huggingface_hub reads the endpoint only when it
is imported), so a worker's environment or a test's loopback Hub applies without a restart.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from relay.dataset_names import is_hub_repo_id, local_dataset_path
from relay.events import DatasetEvent
from relay_engine.errors import DatasetError
from relay_engine.paths import cache_dir_or_default

REVISION = "v2.1"
DEFAULT_BRANCH = "main"
# The formats (meta/info.json's codebase_version) Relay reads, and the one a default branch must hold
# to be read when the repo has no v2.1 revision.
READ_FORMATS = ("v2.1", "v3.0")
DEFAULT_BRANCH_FORMAT = "v3.0"
INFO = "meta/info.json"
# What training reads, in both layouts (fnmatch: `*` matches `/` too). v2.1: meta/*.jsonl,
# data/chunk-*/episode_*.parquet, videos/chunk-*/<camera>/episode_*.mp4. v3.0: meta/tasks.parquet,
# meta/episodes/chunk-*/file-*.parquet, data/chunk-*/file-*.parquet, videos/<camera>/chunk-*/file-*.mp4.
FETCH_PATTERNS = ["meta/*", "data/*", "videos/*", "norm_stats.json"]
# What describing a dataset reads (relay_engine.datasets.describe): info.json, the tasks, the episodes.
META_PATTERNS = ["meta/*"]
_DEFAULT_ENDPOINT = "https://huggingface.co"


@dataclass(frozen=True)
class DatasetSource:
    """What a dataset name was read as: its files (`root`), and for a Hub repo the revision and
    the commit read. `format` is meta/info.json's codebase_version (None where it has none)."""

    name: str
    root: Path
    repo: str | None = None  # the Hub repo id; None for a local directory
    revision: str | None = None  # the branch, tag or sha read (named, v2.1 or the default branch)
    sha: str | None = None  # the commit the revision pointed at
    format: str | None = None

    @property
    def path(self) -> str | None:
        """A local dataset's directory (None for a Hub repo, whose files are in the cache)."""
        return str(self.root) if self.repo is None else None

    def event(self, step: int, *, frames: int, episodes: int) -> DatasetEvent:
        """The job's report of what it read (relay.events.DatasetEvent), at the step it starts from."""
        return DatasetEvent(
            step=step,
            repo=self.repo,
            path=self.path,
            revision=self.revision,
            sha=self.sha,
            format=self.format,
            frames=frames,
            episodes=episodes,
        )

    def describe(self) -> str:
        """One line: `lerobot/pusht_image at v2.1 (commit 1a2b3c4d), LeRobot v2.1`."""
        where = (
            f"{self.repo} at {self.revision} (commit {(self.sha or '?')[:8]})"
            if self.repo
            else str(self.root)
        )
        return f"{where}, LeRobot {self.format}" if self.format else f"{where}, no codebase_version"


def resolve_dataset(
    name_or_path: str,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
) -> Path:
    """The dataset's root directory (`locate_dataset(...).root`)."""
    return locate_dataset(name_or_path, revision=revision, cache_dir=cache_dir, token=token).root


def locate_dataset(
    name_or_path: str,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
    meta_only: bool = False,
) -> DatasetSource:
    """Where the dataset's files are and what was read. Local: an absolute path, `~/...`, `./...` or
    a `file://` URL (which takes no revision). Anything else is a Hub dataset repo id, fetched into
    the cache (once) at `revision`, else v2.1, else its default branch if that is v3.0; with
    `meta_only`, only the revision's `meta/` files are fetched (what describing it reads)."""
    local = local_path(name_or_path)
    if local is not None:
        if revision is not None:
            raise DatasetError(
                name_or_path,
                f"is a local directory, which has no revisions; revision {revision!r} names a branch, "
                "tag or commit of a Hub dataset repo",
            )
        if not local.is_dir():
            raise DatasetError(name_or_path, f"no such directory: {local}", reason=DatasetError.NOT_FOUND)
        return DatasetSource(name_or_path, local, format=codebase_version(local))
    if not is_hub_repo_id(name_or_path):
        raise DatasetError(
            name_or_path,
            "is neither a Hub dataset repo id (like lerobot/pusht_image) nor a local directory "
            "(an absolute path or a file:// URL)",
            reason=DatasetError.BAD_NAME,
        )
    patterns = META_PATTERNS if meta_only else FETCH_PATTERNS
    return _Fetch(name_or_path, cache_dir_or_default(cache_dir), token, patterns).source(revision)


def local_path(name_or_path: str) -> Path | None:
    """The directory a name means, if it names a local one (it may not exist), else None."""
    return local_dataset_path(name_or_path)


def codebase_version(root: Path) -> str | None:
    """meta/info.json's codebase_version, or None where the file or the key is missing or broken."""
    try:
        info = json.loads((root / INFO).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    version = info.get("codebase_version") if isinstance(info, dict) else None
    return version if isinstance(version, str) else None


class _Fetch:
    """One repo's fetch: the revision chosen as the module says, its files downloaded under a lock."""

    def __init__(self, repo_id: str, cache: Path, token: str | None, patterns: list[str]) -> None:
        self.repo_id, self.cache, self.token, self.patterns = repo_id, cache, token, patterns
        self.endpoint = (os.environ.get("HF_ENDPOINT") or _DEFAULT_ENDPOINT).rstrip("/")

    def source(self, revision: str | None) -> DatasetSource:
        # Imported here: huggingface_hub is only needed for Hub datasets, and takes a while to import.
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )

        try:
            locks = self.cache / "locks"
            locks.mkdir(parents=True, exist_ok=True)
            with FileLock(locks / f"{self.repo_id.replace('/', '--')}.lock"):
                return self._choose(revision)
        except GatedRepoError:
            raise self._error(
                f"is gated on {self.endpoint}: accept its terms there and set HF_TOKEN to your token"
            ) from None
        except RepositoryNotFoundError:
            raise self._error(
                f"no such dataset repo on {self.endpoint} (a private one needs HF_TOKEN; "
                "a local directory needs an absolute path or a file:// URL)" + _local_hint(self.repo_id),
                DatasetError.NOT_FOUND,
            ) from None
        except LocalEntryNotFoundError:
            raise self._error(
                f"cannot reach {self.endpoint}, and it is not in the cache at {self.cache}"
                + _local_hint(self.repo_id),
                DatasetError.UNAVAILABLE,
            ) from None
        except HfHubHTTPError as error:
            raise self._error(f"{self.endpoint} answered: {error}", DatasetError.UNAVAILABLE) from None
        except HFValidationError as error:  # relay.dataset_names' rule is the Hub's: not expected
            raise self._error(f"is not a Hub repo id: {error}", DatasetError.BAD_NAME) from None
        except OSError as error:
            raise self._error(
                f"cannot be fetched into {self.cache}: {error}", DatasetError.UNAVAILABLE
            ) from None

    def _choose(self, revision: str | None) -> DatasetSource:
        """The named revision; else v2.1; else the default branch, if it is v3.0."""
        from huggingface_hub.errors import LocalEntryNotFoundError, RevisionNotFoundError

        if revision is not None:
            try:
                snapshot = self._snapshot(revision, [INFO])
            except RevisionNotFoundError:
                raise self._error(
                    f"has no revision {revision!r} (branch, tag or commit) on {self.endpoint}"
                    + self._revisions(),
                    DatasetError.NO_SUCH_REVISION,
                ) from None
            return self._download(revision, snapshot, READ_FORMATS)
        try:
            snapshot = self._snapshot(REVISION, [INFO])
        except RevisionNotFoundError:
            pass
        except LocalEntryNotFoundError:
            # No Hub, and no v2.1 in the cache: a default branch read before is there, or nothing is.
            return self._download(DEFAULT_BRANCH, self._snapshot(None, [INFO]), (DEFAULT_BRANCH_FORMAT,))
        else:
            return self._download(REVISION, snapshot, READ_FORMATS)
        try:
            snapshot = self._snapshot(None, [INFO])
        except RevisionNotFoundError:
            raise self._error(
                f"has no {REVISION} revision (branch or tag) and no default branch on {self.endpoint}"
                + self._revisions(),
                DatasetError.NOT_FOUND,
            ) from None
        return self._download(DEFAULT_BRANCH, snapshot, (DEFAULT_BRANCH_FORMAT,))

    def _download(self, revision: str, snapshot: Path, formats: tuple[str, ...]) -> DatasetSource:
        """The commit's files, once its meta/info.json says a format in `formats`."""
        sha = snapshot.name  # huggingface_hub's snapshots are named by commit
        found = codebase_version(snapshot)
        if found not in formats:
            raise self._error(self._refusal(revision, sha, found, formats))
        root = self._snapshot(sha, self.patterns)
        return DatasetSource(self.repo_id, root, repo=self.repo_id, revision=revision, sha=sha, format=found)

    def _refusal(self, revision: str, sha: str, found: str | None, formats: tuple[str, ...]) -> str:
        held = f"LeRobot {found}" if found else f"no {INFO} with a codebase_version"
        where = f"revision {revision!r} (commit {sha[:8]}) on {self.endpoint} holds {held}"
        if formats == READ_FORMATS:
            return f"{where}, a format Relay does not read (it reads LeRobot {' and '.join(READ_FORMATS)})"
        hint = (
            f"; to read it anyway, name the revision: dataset_revision {DEFAULT_BRANCH!r}"
            if found in READ_FORMATS
            else f", a format Relay does not read (it reads LeRobot {' and '.join(READ_FORMATS)})"
        )
        return (
            f"has no {REVISION} revision (branch or tag), and its default branch is read only when it "
            f"is LeRobot {DEFAULT_BRANCH_FORMAT}: {where}{hint}" + self._revisions()
        )

    def _snapshot(self, revision: str | None, patterns: list[str]) -> Path:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                self.repo_id,
                repo_type="dataset",
                revision=revision,
                cache_dir=self.cache / "hub",
                allow_patterns=patterns,
                endpoint=self.endpoint,
                token=self.token,
            )
        )

    def _error(self, problem: str, reason: str = DatasetError.REFUSED) -> DatasetError:
        return DatasetError(self.repo_id, problem, reason=reason)

    def _revisions(self) -> str:
        """` (its revisions: main, v3.0)`, a hint for a message; empty where the Hub will not say."""
        from huggingface_hub import HfApi

        try:
            refs = HfApi(endpoint=self.endpoint, token=self.token).list_repo_refs(
                self.repo_id, repo_type="dataset"
            )
        except Exception:  # only a hint for the message; the error stands on its own
            return ""
        names = sorted({ref.name for ref in (*refs.branches, *refs.tags)})
        return f" (its revisions: {', '.join(names)})" if names else ""


def _local_hint(repo_id: str) -> str:
    """A name read as a Hub repo id may have meant a directory here: say so, and how to name it."""
    if not Path(repo_id).is_dir():
        return ""
    return (
        f"; a local directory {repo_id} exists, but a relative name is read as a Hub repo id: "
        f"give its absolute path ({Path(repo_id).absolute()}) or ./{repo_id}"
    )
