"""Fetching a dataset's v2.1 revision from the Hub, against a loopback server that answers like it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay_engine.datasets import open_dataset, resolve_dataset
from relay_engine.errors import DatasetError
from tests.hub import FakeHub, Repo

REPO = "lerobot/synthetic_image"


@pytest.fixture
def hub(synthetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    converted = tmp_path / "v30"  # main after a v3.0 conversion: no v2.1 layout left
    (converted / "meta").mkdir(parents=True)
    (converted / "meta/info.json").write_text(json.dumps({"codebase_version": "v3.0"}))
    with FakeHub() as server:
        repo = Repo()
        repo.add_commit(synthetic, tag="v2.1")
        repo.add_commit(converted, branch="main", tag="v3.0")
        server.repos[REPO] = repo
        only_v30 = Repo()
        only_v30.add_commit(converted, branch="main", tag="v3.0")
        server.repos["lerobot/new_format"] = only_v30
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server


def test_fetches_the_v21_revision_once(hub: FakeHub, synthetic: Path, cache_dir: Path) -> None:
    path = resolve_dataset(REPO, cache_dir=cache_dir)
    assert path.is_relative_to(cache_dir / "hub")
    assert json.loads((path / "meta/info.json").read_text())["codebase_version"] == "v2.1"
    fetched = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    expected = sorted(
        p.relative_to(synthetic).as_posix()
        for p in synthetic.rglob("*")
        if p.is_file() and p.name != "README.md"  # only what training reads is fetched
    )
    assert fetched == expected
    assert all(count == 1 for count in hub.downloads.values())
    downloads = sum(hub.downloads.values())
    assert resolve_dataset(REPO, cache_dir=cache_dir) == path
    assert sum(hub.downloads.values()) == downloads  # the second job reuses the cache


def test_a_cached_dataset_needs_no_hub(hub: FakeHub, cache_dir: Path) -> None:
    path = resolve_dataset(REPO, cache_dir=cache_dir)
    hub.close()
    assert resolve_dataset(REPO, cache_dir=cache_dir) == path


def test_the_token_is_sent(hub: FakeHub, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resolve_dataset(REPO, cache_dir=cache_dir, token="hf_given")
    assert "Bearer hf_given" in hub.authorizations
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    resolve_dataset(REPO, cache_dir=tmp_cache(cache_dir))
    assert "Bearer hf_from_env" in hub.authorizations


def tmp_cache(cache_dir: Path) -> Path:
    return cache_dir.with_name(cache_dir.name + "-2")


def test_a_repo_without_a_v21_revision_says_so(hub: FakeHub, cache_dir: Path) -> None:
    with pytest.raises(DatasetError) as caught:
        resolve_dataset("lerobot/new_format", cache_dir=cache_dir)
    problem = caught.value.problem
    assert caught.value.dataset == "lerobot/new_format"
    assert problem.startswith(f"has no v2.1 revision (branch or tag) on {hub.endpoint}")
    assert "v3.0 datasets are not supported yet" in problem
    assert problem.endswith("(its revisions: main, v3.0)")


def test_an_unknown_repo_and_a_bad_name(hub: FakeHub, cache_dir: Path) -> None:
    with pytest.raises(DatasetError, match=r"lerobot/nothing: no such dataset repo on http://127\.0\.0\.1"):
        resolve_dataset("lerobot/nothing", cache_dir=cache_dir)
    with pytest.raises(DatasetError, match="neither a Hub dataset repo id"):
        resolve_dataset("not a repo", cache_dir=cache_dir)
    with pytest.raises(DatasetError, match="no such directory"):
        resolve_dataset("file:///nowhere/at/all", cache_dir=cache_dir)


def test_open_dataset_by_repo_id(hub: FakeHub, synthetic: Path, cache_dir: Path) -> None:
    from_hub = open_dataset(REPO, cache_dir=cache_dir)
    local = open_dataset(str(synthetic), cache_dir=cache_dir)
    assert from_hub.name == REPO and from_hub.summary.name == REPO
    assert len(from_hub) == len(local)
    assert from_hub[5]["prompt"] == local[5]["prompt"]
    assert (from_hub[5]["actions"] == local[5]["actions"]).all()


FETCH = """
import json, sys
from relay_engine.datasets import resolve_dataset
print(json.dumps(str(resolve_dataset(sys.argv[1], cache_dir=sys.argv[2]))))
"""


def test_two_workers_fetching_at_once_share_one_download(hub: FakeHub, cache_dir: Path) -> None:
    # Real processes, each with HF_ENDPOINT in its environment before huggingface_hub is imported.
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", FETCH, REPO, str(cache_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [worker.communicate(timeout=120) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], outputs
    paths = {json.loads(out) for out, _ in outputs}
    assert len(paths) == 1
    assert hub.downloads and all(count == 1 for count in hub.downloads.values())
    dataset = open_dataset(REPO, cache_dir=cache_dir)
    assert len(dataset) > 0


def test_a_relative_name_that_exists_here_says_to_give_its_absolute_path(
    hub: FakeHub, synthetic: Path, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine" / "robot").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError, match=r"a local directory mine/robot exists.*absolute path") as caught:
        open_dataset("mine/robot", cache_dir=cache_dir)
    assert str(tmp_path / "mine" / "robot") in str(caught.value)
    assert resolve_dataset(".") == tmp_path  # "." is a local directory, never a Hub name
