"""Which revision of a Hub dataset is read, what is fetched and what is recorded, against a loopback
server that answers like the Hub (tests/hub.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay_engine.datasets import DatasetSource, locate_dataset, open_dataset, resolve_dataset
from relay_engine.datasets.hub import FETCH_PATTERNS
from relay_engine.errors import DatasetError
from tests.hub import FakeHub, Repo

REPO = "lerobot/synthetic_image"
# The files of a v3.0 layout the fetch must bring (besides meta/info.json); README.md is left out.
V30_FILES = (
    "meta/tasks.parquet",
    "meta/episodes/chunk-000/file-000.parquet",
    "data/chunk-000/file-000.parquet",
)


def write_v30_layout(root: Path) -> Path:
    """A LeRobot v3.0 layout in real parquet: tasks, one episode's row, its frames (what LeRobot's
    converter leaves on main). Relay's reader of v3.0 is tested elsewhere; here only what is fetched."""
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    (root / "data/chunk-000").mkdir(parents=True)
    info = {
        "codebase_version": "v3.0",
        "fps": 10,
        "total_episodes": 1,
        "total_frames": 3,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": None,
    }
    (root / "meta/info.json").write_text(json.dumps(info))
    pq.write_table(pa.table({"task_index": [0], "task": ["pick up the cube"]}), root / "meta/tasks.parquet")
    episodes = {"episode_index": [0], "length": [3], "data/chunk_index": [0], "data/file_index": [0]}
    pq.write_table(pa.table(episodes), root / "meta/episodes/chunk-000/file-000.parquet")
    frames = {
        "episode_index": [0, 0, 0],
        "frame_index": [0, 1, 2],
        "index": [0, 1, 2],
        "task_index": [0, 0, 0],
    }
    pq.write_table(pa.table(frames), root / "data/chunk-000/file-000.parquet")
    (root / "README.md").write_text("a v3.0 dataset\n")
    return root


def write_info_only(root: Path, version: str) -> Path:
    (root / "meta").mkdir(parents=True)
    (root / "meta/info.json").write_text(json.dumps({"codebase_version": version}))
    (root / "data").mkdir()
    (root / "data/never-fetched.parquet").write_bytes(b"not read: the format is refused first")
    return root


@pytest.fixture
def hub(synthetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    converted = write_v30_layout(tmp_path / "v30")  # main after a v3.0 conversion: no v2.1 layout left
    old = write_info_only(tmp_path / "v20", "v2.0")
    with FakeHub() as server:
        repo = Repo()
        repo.add_commit(old, tag="v2.0")
        repo.add_commit(synthetic, tag="v2.1")
        repo.add_commit(converted, branch="main", tag="v3.0")
        server.repos[REPO] = repo
        only_v30 = Repo()
        only_v30.add_commit(converted, branch="main", tag="v3.0")
        server.repos["lerobot/new_format"] = only_v30
        server.repos["lerobot/old_format"] = Repo.at(old)  # main is v2.0, no v2.1
        server.repos["someone/untagged"] = Repo.at(synthetic)  # main is v2.1, but not tagged so
        no_main = Repo()
        no_main.add_commit(converted, tag="v3.0")
        server.repos["lerobot/tags_only"] = no_main
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


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


def test_the_source_says_which_revision_and_commit_were_read(
    hub: FakeHub, synthetic: Path, cache_dir: Path
) -> None:
    source = locate_dataset(REPO, cache_dir=cache_dir)
    tag = hub.repos[REPO].tags["v2.1"]
    assert source == DatasetSource(REPO, source.root, repo=REPO, revision="v2.1", sha=tag, format="v2.1")
    assert source.root == resolve_dataset(REPO, cache_dir=cache_dir) and source.path is None
    assert source.describe() == f"{REPO} at v2.1 (commit {tag[:8]}), LeRobot v2.1"
    local = locate_dataset(str(synthetic))
    assert (local.repo, local.path, local.revision, local.sha, local.format) == (
        None,
        str(synthetic),
        None,
        None,
        "v2.1",
    )


def test_without_a_v21_revision_a_v30_default_branch_is_read(
    hub: FakeHub, tmp_path: Path, cache_dir: Path
) -> None:
    source = locate_dataset("lerobot/new_format", cache_dir=cache_dir)
    main = hub.repos["lerobot/new_format"].branches["main"]
    assert (source.revision, source.sha, source.format) == ("main", main, "v3.0")
    # v3.0's files are fetched: tasks.parquet, meta/episodes/**, data/chunk-*/file-*.parquet.
    assert files_under(source.root) == sorted(["meta/info.json", *V30_FILES])
    assert files_under(source.root) == [f for f in files_under(tmp_path / "v30") if f != "README.md"]


def test_the_fetch_patterns_take_both_layouts_and_videos() -> None:
    from huggingface_hub.utils import filter_repo_objects

    wanted = [
        *V30_FILES,
        "meta/info.json",
        "meta/stats.json",
        "videos/observation.images.top/chunk-000/file-000.mp4",  # v3.0
        "videos/chunk-000/observation.images.top/episode_000000.mp4",  # v2.1
        "meta/episodes.jsonl",
        "meta/tasks.jsonl",
        "data/chunk-000/episode_000000.parquet",
        "norm_stats.json",
    ]
    assert (
        list(filter_repo_objects([*wanted, "README.md", ".gitattributes"], allow_patterns=FETCH_PATTERNS))
        == wanted
    )


def test_the_revision_named_is_read(hub: FakeHub, cache_dir: Path) -> None:
    commits = hub.repos[REPO]
    main = locate_dataset(REPO, revision="main", cache_dir=cache_dir)
    assert (main.revision, main.sha, main.format) == ("main", commits.branches["main"], "v3.0")
    tagged = locate_dataset(REPO, revision="v2.1", cache_dir=cache_dir)
    assert (tagged.sha, tagged.format) == (commits.tags["v2.1"], "v2.1")
    by_sha = locate_dataset(REPO, revision=commits.tags["v2.1"], cache_dir=cache_dir)
    assert (by_sha.revision, by_sha.sha, by_sha.root) == (
        commits.tags["v2.1"],
        commits.tags["v2.1"],
        tagged.root,
    )
    # Untagged v2.1 on main is read when named (and only then: see the refusals).
    untagged = locate_dataset("someone/untagged", revision="main", cache_dir=cache_dir)
    assert (untagged.revision, untagged.format) == ("main", "v2.1")


def test_a_revision_the_repo_lacks_is_refused_naming_both(hub: FakeHub, cache_dir: Path) -> None:
    with pytest.raises(DatasetError) as caught:
        locate_dataset(REPO, revision="v9.9", cache_dir=cache_dir)
    assert caught.value.dataset == REPO
    assert caught.value.problem == (
        f"has no revision 'v9.9' (branch, tag or commit) on {hub.endpoint} "
        "(its revisions: main, v2.0, v2.1, v3.0)"
    )
    with pytest.raises(
        DatasetError,
        match=r"lerobot/tags_only: has no v2\.1 revision \(branch or tag\) and no default branch",
    ):
        locate_dataset("lerobot/tags_only", cache_dir=cache_dir)


def test_a_format_relay_does_not_read_is_refused_before_its_files_are_fetched(
    hub: FakeHub, cache_dir: Path
) -> None:
    old = hub.repos[REPO].tags["v2.0"]
    with pytest.raises(DatasetError) as caught:
        locate_dataset(REPO, revision="v2.0", cache_dir=cache_dir)
    assert str(caught.value) == (
        f"dataset {REPO}: revision 'v2.0' (commit {old[:8]}) on {hub.endpoint} holds LeRobot v2.0, "
        "a format Relay does not read (it reads LeRobot v2.1 and v3.0)"
    )
    assert f"{REPO}/data/never-fetched.parquet" not in hub.downloads

    with pytest.raises(DatasetError) as caught:
        locate_dataset("lerobot/old_format", cache_dir=cache_dir)
    problem = caught.value.problem
    assert problem.startswith(
        "has no v2.1 revision (branch or tag), and its default branch is read only when it is LeRobot v3.0: "
        f"revision 'main' (commit {hub.repos['lerobot/old_format'].branches['main'][:8]}) on {hub.endpoint} "
        "holds LeRobot v2.0, a format Relay does not read"
    ), problem
    assert problem.endswith("(its revisions: main)")
    assert "lerobot/old_format/data/never-fetched.parquet" not in hub.downloads

    with pytest.raises(
        DatasetError,
        match=r"holds LeRobot v2\.1; to read it anyway, name the revision: dataset_revision 'main'",
    ):
        locate_dataset("someone/untagged", cache_dir=cache_dir)


def test_a_local_directory_takes_no_revision(synthetic: Path, cache_dir: Path) -> None:
    with pytest.raises(DatasetError, match=r"is a local directory, which has no revisions; revision 'v2\.1'"):
        locate_dataset(str(synthetic), revision="v2.1", cache_dir=cache_dir)


def test_a_cached_v30_default_branch_needs_no_hub(hub: FakeHub, cache_dir: Path) -> None:
    first = locate_dataset("lerobot/new_format", cache_dir=cache_dir)
    hub.close()
    assert locate_dataset("lerobot/new_format", cache_dir=cache_dir) == first


def test_open_dataset_reads_the_revision_and_keeps_its_source(
    hub: FakeHub, synthetic: Path, cache_dir: Path
) -> None:
    dataset = open_dataset(REPO, revision="v2.1", cache_dir=cache_dir)
    assert dataset.source == locate_dataset(REPO, cache_dir=cache_dir)
    event = dataset.source.event(0, frames=dataset.summary.frames, episodes=dataset.summary.episodes)
    assert event.to_wire() == {
        "step": 0,
        "event": "dataset",
        "kind": "dataset",
        "repo": REPO,
        "path": None,
        "revision": "v2.1",
        "sha": hub.repos[REPO].tags["v2.1"],
        "format": "v2.1",
        "frames": len(dataset),
        "episodes": 6,
    }
    local = open_dataset(str(synthetic), cache_dir=cache_dir)
    assert local.source is not None and local.source.path == str(synthetic)


def test_datasets_check_prints_what_was_read(hub: FakeHub, cache_dir: Path) -> None:
    result = CliRunner().invoke(
        app, ["datasets", "check", REPO, "--revision", "v2.1", "--quick", "--cache-dir", str(cache_dir)]
    )
    assert result.exit_code == 0, result.output
    tag = hub.repos[REPO].tags["v2.1"]
    assert f"{REPO} at v2.1 (commit {tag[:8]}), LeRobot v2.1" in result.output
    result = CliRunner().invoke(
        app, ["datasets", "check", REPO, "--revision", "nope", "--cache-dir", str(cache_dir)]
    )
    assert result.exit_code == 1
    assert f"dataset {REPO}: has no revision 'nope'" in " ".join(result.output.split())


@pytest.mark.slow
def test_local_train_reads_the_revision_named_and_reports_it_first(
    hub: FakeHub, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_CACHE_DIR", str(cache_dir))
    args = ["local", "train", "--model", "pi05-tiny", "--dataset", REPO, "--dataset-revision", "v2.1"]
    args += [
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--device",
        "cpu",
        "--json",
        "--output-dir",
        str(tmp_path / "run"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    first = json.loads(result.stdout.splitlines()[0])  # stdout: JSON lines, the dataset event first
    assert (first["event"], first["repo"], first["revision"], first["sha"], first["format"]) == (
        "dataset",
        REPO,
        "v2.1",
        hub.repos[REPO].tags["v2.1"],
        "v2.1",
    )
