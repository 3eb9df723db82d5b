"""Pushing a fine-tune's output to a Hugging Face Hub model repo, with its model card (relay.model_card).

The folder is pushed as lerobot and Relay's from_checkpoint read it (config.json, model.safetensors,
relay_config.json, norm_stats.json, the processors' and the tokenizer's files), in one commit
through huggingface_hub's upload API: `HfApi.create_repo` (private unless told otherwise),
`HfApi.create_branch` for a revision other than main, then `HfApi.create_commit`, which sends the
large files through the Hub's LFS (or Xet) storage. A local run's checkpoints/ and hidden files stay
behind. The folder itself is not touched: the card is added to the commit, not written into it.

A push to a branch that an earlier push wrote replaces that push's files: each push records the
files it wrote in `PUSH_RECORD`, and the next one deletes those of them it does not write again
(say a processor file the new output lacks), in the same commit, so the branch holds one model's
files, not two models' mixed. A file no push of Relay's wrote (the team's own) is never deleted,
nor is anything in a repo whose last push left no record (made by an older Relay, or by hand).

The Hub and the token are huggingface_hub's: HF_ENDPOINT (default https://huggingface.co) and
HF_TOKEN, read at each call (huggingface_hub reads them once, at import), else the token that
`hf auth login` saved. The token is sent to the Hub alone: never written to a file, an event or
a job's row, and never in a message.

huggingface_hub is imported when a push runs (it comes with the `engine` extra, or `pip install
huggingface_hub`); nothing here imports torch or the engine.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relay.errors import ConfigError
from relay.hub_target import DEFAULT_BRANCH, check_branch, check_repo_id
from relay.model_card import CARD_FILE, facts_of_job, model_card

if TYPE_CHECKING:
    from relay.sft.job import FineTuneJob

DEFAULT_ENDPOINT = "https://huggingface.co"
# What a pushed output leaves behind: a local run's checkpoints (resumption state, not a model),
# and hidden files (caches, temporaries of an interrupted write).
_LEFT_OUT_DIRS = frozenset({"checkpoints"})
# In the repo: which files the last push wrote (JSON: {"files": [...]}), which the next one may delete.
PUSH_RECORD = ".relay_push.json"


class HubPushError(RuntimeError):
    """The Hub refused the push or could not be reached; the message says which, without the token."""


@dataclass(frozen=True)
class PushedRepo:
    """Where a push went: the repo, the branch, the commit the Hub made and its URL, the files sent.
    ``private``: the visibility asked for, which a repo created by the push has (one that existed
    keeps its own)."""

    repo_id: str
    revision: str
    commit: str
    url: str
    private: bool
    files: tuple[str, ...]
    # Files an earlier push wrote that this one does not, deleted by its commit.
    removed: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "url": self.url,
            "private": self.private,
            "files": list(self.files),
            "removed": list(self.removed),
        }

    @property
    def checkpoint(self) -> str:
        """The from_checkpoint value a new recipe names it by (relay.checkpoints)."""
        at = "" if self.revision == DEFAULT_BRANCH else f"@{self.revision}"
        return f"{self.repo_id}{at}"


def hub_endpoint(endpoint: str | None = None) -> str:
    return (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def output_files(folder: Path) -> list[str]:
    """The files of `folder` a push sends, as paths relative to it: all but checkpoints/ and hidden
    files. ConfigError when it is no model output (no config.json or model.safetensors)."""
    if not folder.is_dir():
        raise ConfigError(f"bad folder: {folder} is not a directory", "folder")
    files = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or relative.parts[0] in _LEFT_OUT_DIRS:
            continue
        if any(part.startswith(".") for part in relative.parts):
            continue
        files.append(relative.as_posix())
    missing = [name for name in ("model.safetensors", "config.json") if name not in files]
    if missing:
        raise ConfigError(
            f"bad folder: {folder} holds no {' or '.join(missing)}; push a fine-tune's output folder",
            "folder",
        )
    return files


def push_output(
    folder: str | Path,
    repo_id: str,
    *,
    card: str | None,
    private: bool = True,
    revision: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    commit_message: str | None = None,
) -> PushedRepo:
    """Push the output in `folder` to the model repo `repo_id` (created, private unless `private` is
    False; an existing repo keeps its visibility) at the branch `revision` (None: main; created
    from main if absent), with `card` as its README.md, in one commit that also deletes what the
    last push there wrote and this one does not (see the module). `token` and `endpoint`: None
    reads HF_TOKEN and HF_ENDPOINT (then huggingface_hub's saved login)."""
    check_repo_id(repo_id)
    check_branch(revision)
    folder = Path(folder)
    files = output_files(folder)
    if card is not None and CARD_FILE in files:
        files.remove(CARD_FILE)  # the card written now replaces one the folder holds
    try:
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    except ImportError:
        raise HubPushError(
            "pushing to the Hub needs huggingface_hub: pip install huggingface_hub "
            "(or relay-intelligence[engine])"
        ) from None
    where = hub_endpoint(endpoint)
    api = HfApi(endpoint=where, token=token or os.environ.get("HF_TOKEN") or None)
    branch = revision or DEFAULT_BRANCH
    operations: list[CommitOperationAdd | CommitOperationDelete] = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name)) for name in files
    ]
    if card is not None:
        operations.append(CommitOperationAdd(path_in_repo=CARD_FILE, path_or_fileobj=card.encode()))
    written = sorted([*files, *([CARD_FILE] if card is not None else [])])
    record = json.dumps({"files": written}, indent=1).encode()
    operations.append(CommitOperationAdd(path_in_repo=PUSH_RECORD, path_or_fileobj=record))
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        if branch != DEFAULT_BRANCH:
            api.create_branch(repo_id, branch=branch, repo_type="model", exist_ok=True)
        removed = _left_from_last_push(api, repo_id, branch, set(written))
        operations += [CommitOperationDelete(path_in_repo=name) for name in removed]
        commit = api.create_commit(
            repo_id,
            operations,
            commit_message=commit_message or "Upload a Relay fine-tune",
            repo_type="model",
            revision=branch,
        )
    # Whatever huggingface_hub raises (its HfHubHTTPError, its HTTP client's errors: httpx2's in
    # 2.x, requests' before; ValueError for a refused card; RuntimeError around an LFS upload), the
    # push failed: one line saying why, no traceback.
    except Exception as error:
        raise HubPushError(f"cannot push to {repo_id} at {where}: {_short(error, token)}") from None
    return PushedRepo(
        repo_id=repo_id,
        revision=branch,
        commit=str(commit.oid),
        url=f"{where}/{repo_id}" + ("" if branch == DEFAULT_BRANCH else f"/tree/{branch}"),
        private=private,
        files=tuple(written),
        removed=tuple(removed),
    )


def _left_from_last_push(api: Any, repo_id: str, branch: str, written: set[str]) -> list[str]:
    """The files the branch's last push recorded (PUSH_RECORD) that are still there and that this
    push does not write: what it deletes. Nothing without a record, or with one that does not read
    as a list of file names (edited by hand: nothing is deleted on its word)."""
    present = set(api.list_repo_files(repo_id, revision=branch, repo_type="model"))
    if PUSH_RECORD not in present:
        return []
    with tempfile.TemporaryDirectory(prefix="relay-push-record-") as scratch:
        path = api.hf_hub_download(
            repo_id, PUSH_RECORD, revision=branch, repo_type="model", local_dir=scratch
        )
        try:
            recorded = json.loads(Path(path).read_text())["files"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return []
    if not isinstance(recorded, list) or not all(isinstance(name, str) for name in recorded):
        return []
    return sorted((set(recorded) & present) - written - {PUSH_RECORD})


def push_job(
    job: FineTuneJob,
    repo_id: str,
    *,
    private: bool = True,
    revision: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    param: str = "repo_id",
) -> PushedRepo:
    """Download a completed job's output through the API (sha256-checked) into a temporary folder,
    and push it with its model card (its record and results card: relay.model_card). The repo id
    and branch are checked before anything is downloaded; `param` names the repo id in a refusal."""
    check_repo_id(repo_id, param)
    check_branch(revision)
    with tempfile.TemporaryDirectory(prefix=f"relay-push-{job.id}-") as scratch:
        folder = job.download(Path(scratch) / "output", progress=False)
        card = model_card(facts_of_job(job.to_dict(), job.summary()), repo_id)
        return push_output(
            folder,
            repo_id,
            card=card,
            private=private,
            revision=revision,
            token=token,
            endpoint=endpoint,
            commit_message=f"Upload Relay fine-tune {job.id}",
        )


def _short(error: Exception, token: str | None) -> str:
    """huggingface_hub's message in one line (its own runs over several lines of advice), the token
    taken out should a server have echoed it."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    for secret in (token, os.environ.get("HF_TOKEN")):
        if secret:
            first = first.replace(secret, "***")
    return f"{type(error).__name__}: {first}"
