"""A real pi05-tiny run's output pushed to the loopback Hub with its model card (relay.hub_push,
relay.model_card), read back from the Hub, and used as a new recipe's from_checkpoint."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import relay
from relay.errors import ConfigError
from relay.events import WeightsEvent
from relay.hub_push import PUSH_RECORD, PushedRepo, output_files, push_output
from relay.hub_target import check_branch, check_repo_id
from relay.model_card import BASE_REPOS, facts_of_events, model_card
from relay.sft.config import SFTConfig
from relay_engine.families.smolvla import files as smolvla_files
from relay_engine.models import weights
from relay_engine.recipe import Recipe, run_recipe
from tests.hub import FakeHub, Repo, without_xet

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATASET = "team/synthetic"
TOKEN = "hf_push_secret_0123456789"


def config(**changes: Any) -> SFTConfig:
    fields: dict[str, Any] = dict(
        model="pi05-tiny", dataset_name=DATASET, batch_size=4, steps=2, finetune="full", name="pick cube"
    )
    return SFTConfig(**{**fields, **changes})


def train(sft: SFTConfig, work_dir: Path, cache: Path) -> tuple[Path, list[Any]]:
    events: list[Any] = []
    result = run_recipe(
        Recipe.from_config(sft, checkpoint_every=2, num_workers=0),
        work_dir,
        on_event=events.append,
        should_stop=lambda: False,
        dataset_cache_dir=cache,
    )
    assert result.status == "completed" and result.output_dir is not None
    return Path(result.output_dir), events


@pytest.fixture
def hub(synthetic_dataset_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The loopback Hub serving the synthetic dataset at v2.1, pushed to with TOKEN."""
    with FakeHub() as server:
        repo = Repo()
        repo.add_commit(synthetic_dataset_path, branch="main", tag="v2.1")
        server.repos[DATASET] = repo
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
        without_xet(monkeypatch)
        yield server


def front_matter(card: str) -> dict[str, Any]:
    assert card.startswith("---\n")
    meta = yaml.safe_load(card[4 : card.index("\n---\n", 4)])
    assert isinstance(meta, dict)
    return meta


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_output_pushed_with_its_card_is_the_next_jobs_from_checkpoint(
    hub: FakeHub, tmp_path: Path
) -> None:
    cache = tmp_path / "datasets"
    parent_config = config(validation_episodes=[7])
    output, events = train(parent_config, tmp_path / "parent", cache)
    dataset_sha = hub.repos[DATASET].tags["v2.1"]

    card = model_card(facts_of_events(parent_config, events, job_id="ft-0123456789ab"))
    meta = front_matter(card)
    assert meta["library_name"] == "lerobot" and meta["pipeline_tag"] == "robotics"
    assert meta["datasets"] == [DATASET] and "base_model" not in meta  # pi05-tiny ships with Relay
    assert {"relay", "pi05", "lerobot", "robotics"} <= set(meta["tags"]) and "license" not in meta
    assert f"| dataset | {DATASET} at v2.1 (commit {dataset_sha}), LeRobot v2.1, " in card
    assert f"| base | pi05-tiny, the base shipped with Relay {relay.__version__} |" in card
    assert f"| Relay | {relay.__version__} |" in card and "# pick cube" in card
    validation = next(e for e in events if e.kind == "validation")
    assert re.search(rf"\| best \| 2 \| {validation['validation_loss']:.4g} \| ", card), card
    assert "No closed-loop evaluation was run" in card
    recipe = json.loads(card[card.index("```json\n") + 8 : card.index("\n```\n", card.index("```json"))])
    assert recipe["dataset_name"] == DATASET and recipe["steps"] == 2 and recipe["validation_episodes"] == [7]

    # The push: one commit of the output and the card at a new branch of a new private repo.
    sent = output_files(output)
    assert "model.safetensors" in sent and not any(name.startswith("checkpoints/") for name in sent)
    pushed = push_output(output, "team/pick-cube", card=card, revision="v2")
    assert isinstance(pushed, PushedRepo) and pushed.checkpoint == "team/pick-cube@v2"
    assert hub.created == [
        {"name": "pick-cube", "organization": "team", "visibility": "private", "type": "model"}
    ]
    repo = hub.models["team/pick-cube"]
    assert repo.private and repo.branches["v2"] == pushed.commit
    assert hub.commits[-1]["paths"] == sorted([*sent, "README.md", PUSH_RECORD])
    assert pushed.files == tuple(sorted([*sent, "README.md"])) and pushed.removed == ()
    # Read back from the Hub: every file byte for byte, the weights through its LFS storage.
    on_hub = files_under(repo.commits[pushed.commit])
    assert on_hub.pop("README.md").decode() == card
    assert json.loads(on_hub.pop(PUSH_RECORD)) == {"files": list(pushed.files)}
    assert on_hub.pop(".gitattributes")  # the new repo's first commit, kept by the push
    assert on_hub == {name: (output / name).read_bytes() for name in sent}
    weights_oid = hashlib.sha256((output / "model.safetensors").read_bytes()).hexdigest()
    assert weights_oid in hub.lfs
    # The token went to the Hub in headers, and nowhere else.
    writes = [
        auth for (method, _), auth in zip(hub.requests, hub.authorizations, strict=True) if method == "POST"
    ]
    assert writes and set(writes) == {f"Bearer {TOKEN}"}
    assert all(TOKEN.encode() not in data for data in files_under(repo.commits[pushed.commit]).values())

    # A new job starts from the pushed repo at its branch, and says so.
    child_config = config(from_checkpoint=pushed.checkpoint, name=None)
    _, child_events = train(child_config, tmp_path / "child", cache)
    assert [e for e in child_events if isinstance(e, WeightsEvent)] == [
        WeightsEvent(
            step=0,
            model="pi05-tiny",
            repo="team/pick-cube",
            revision="v2",
            sha=pushed.commit,
            path=None,
            job=None,
        )
    ]
    child_meta = front_matter(model_card(facts_of_events(child_config, child_events)))
    assert child_meta["base_model"] == "team/pick-cube" and child_meta["datasets"] == [DATASET]
    child_card = model_card(facts_of_events(child_config, child_events))
    assert f"| base | pi05-tiny weights of team/pick-cube at v2 (commit {pushed.commit}) |" in child_card


def test_a_second_push_to_an_existing_repo_keeps_it_and_commits_on_main(hub: FakeHub, tmp_path: Path) -> None:
    folder = tmp_path / "output"
    folder.mkdir()
    (folder / "config.json").write_text('{"type": "pi05"}')
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "state.pt").write_bytes(b"resumption state, not a model")
    (folder / ".partial").write_bytes(b"an interrupted write")
    first = push_output(folder, "team/again", card=None, private=False, token="hf_other")
    (folder / "model.safetensors").write_bytes(b"better weights")
    second = push_output(folder, "team/again", card="# card\n", private=True, token="hf_other")
    assert (first.revision, second.revision) == ("main", "main") and first.commit != second.commit
    # The repo was created once, public: the second create call found it (409) and left it so.
    assert [body.get("visibility") for body in hub.created] == ["public", "private"]
    assert not hub.models["team/again"].private
    assert set(files_under(hub.models["team/again"].commits[second.commit])) == {
        ".gitattributes",
        ".relay_push.json",
        "README.md",
        "config.json",
        "model.safetensors",
    }
    assert hub.authorizations[-1] == "Bearer hf_other"  # the token passed beats HF_TOKEN


def output_folder(root: Path, **files: bytes) -> Path:
    """A model output folder holding config.json, model.safetensors and `files` (name: bytes)."""
    root.mkdir()
    (root / "config.json").write_text('{"type": "pi05"}')
    (root / "model.safetensors").write_bytes(b"weights")
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def test_a_push_replaces_what_the_last_push_wrote_and_keeps_the_teams_own_files(
    hub: FakeHub, tmp_path: Path
) -> None:
    from huggingface_hub import HfApi

    first = push_output(
        output_folder(tmp_path / "first", **{"policy_preprocessor.json": b"{}"}), "team/model", card="# one\n"
    )
    # A file the team adds by hand, beside the pushed ones.
    HfApi(endpoint=hub.endpoint, token=TOKEN).upload_file(
        path_or_fileobj=b"our notes", path_in_repo="notes.md", repo_id="team/model"
    )
    # The next output has another processor file, and is pushed without a card.
    second = push_output(
        output_folder(tmp_path / "second", **{"policy_postprocessor.json": b"{}"}), "team/model", card=None
    )
    assert first.removed == () and second.removed == ("README.md", "policy_preprocessor.json")
    assert hub.commits[-1]["deleted"] == ["README.md", "policy_preprocessor.json"]
    on_main = files_under(hub.models["team/model"].commits[second.commit])
    assert set(on_main) == {
        ".gitattributes",
        PUSH_RECORD,
        "config.json",
        "model.safetensors",
        "notes.md",
        "policy_postprocessor.json",
    }
    assert json.loads(on_main[PUSH_RECORD]) == {
        "files": ["config.json", "model.safetensors", "policy_postprocessor.json"]
    }

    # A new branch starts from main, record included: its first push replaces main's last push's
    # files there, and main keeps them.
    branch = push_output(output_folder(tmp_path / "third"), "team/model", card="# three\n", revision="v2")
    assert branch.removed == ("policy_postprocessor.json",)
    on_branch = files_under(hub.models["team/model"].commits[branch.commit])
    assert set(on_branch) == {
        ".gitattributes",
        PUSH_RECORD,
        "README.md",
        "config.json",
        "model.safetensors",
        "notes.md",
    }
    assert hub.models["team/model"].branches["main"] == second.commit


@pytest.mark.parametrize("record", [None, b"not json", b'{"files": "model.safetensors"}', b"[1, 2]"])
def test_nothing_is_deleted_without_a_record_that_reads(
    hub: FakeHub, tmp_path: Path, record: bytes | None
) -> None:
    # A repo made by hand (or by a Relay before records), or whose record was edited: its files stay.
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.endpoint, token=TOKEN)
    api.create_repo("team/by-hand")
    api.upload_file(path_or_fileobj=b"{}", path_in_repo="policy_preprocessor.json", repo_id="team/by-hand")
    if record is not None:
        api.upload_file(path_or_fileobj=record, path_in_repo=PUSH_RECORD, repo_id="team/by-hand")
    pushed = push_output(output_folder(tmp_path / "output"), "team/by-hand", card=None)
    assert pushed.removed == () and hub.commits[-1]["deleted"] == []
    on_hub = files_under(hub.models["team/by-hand"].commits[pushed.commit])
    assert "policy_preprocessor.json" in on_hub
    assert json.loads(on_hub[PUSH_RECORD]) == {"files": ["config.json", "model.safetensors"]}


@pytest.mark.parametrize("bad", ["no-owner", "a/b/c", "team/x..y", "team/x.git", "team/-x", "", "team/a b"])
def test_a_bad_repo_id_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(
        ConfigError, match=r"^bad repo_id: .* \(must be a Hub model repo id, owner/name"
    ) as refused:
        check_repo_id(bad)
    assert refused.value.param == "repo_id"


@pytest.mark.parametrize("bad", ["x..y", "-x", "x/", "x.lock", "a b", "a~1", ".x"])
def test_a_bad_branch_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^bad revision: .* \(must be a branch name") as refused:
        check_branch(bad)
    assert refused.value.param == "revision"
    assert check_branch("exp/lr-3e-5") == "exp/lr-3e-5"


def test_a_folder_without_a_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"holds no model\.safetensors; push a fine-tune's output"):
        output_files(tmp_path)


def test_the_cards_base_repos_are_the_engines() -> None:
    assert {"pi05": weights.BASE_REPO["pi05"], "smolvla": smolvla_files.BASE_REPO} == BASE_REPOS
