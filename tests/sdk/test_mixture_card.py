"""The model card (relay.model_card) of a fine-tune trained on a mixture of datasets: a row per
dataset with its share of the samples and what was read of it (a Hub dataset's commit), a local
directory shown by its last part only, and the front matter's ``datasets`` naming the Hub repos
alone. A fine-tune of one dataset keeps its single ``dataset`` row."""

from __future__ import annotations

import json
import re
from typing import Any

from relay.events import DatasetEvent, MetricsEvent, ValidationEvent
from relay.model_card import datasets_of, facts_of_events, front_matter, model_card, recipe_of
from relay.sft.config import SFTConfig

HUB = "team/pick-fork"
LOCAL = "/data/other"
SHA = "0123456789abcdef0123456789abcdef01234567"


def mixture_config() -> SFTConfig:
    return SFTConfig.parse(
        {
            "model": "pi05-tiny",
            "datasets": [{"name": HUB, "weight": 3}, {"name": LOCAL, "weight": 1}],
            "steps": 20,
            "batch_size": 4,
            "validation_episodes": [0],
        }
    )


def mixture_events() -> list[Any]:
    """A run's events as the engine reports a mixture: the read of each dataset, a step's metrics,
    and a validation that scored each dataset (named by its full path, as the engine names it)."""
    hub = {
        "repo": HUB,
        "path": "/root/.cache/huggingface/hub/datasets--team--pick-fork/snapshots/" + SHA,
        "revision": "v2.1",
        "sha": SHA,
        "format": "v2.1",
        "frames": 1200,
        "episodes": 20,
    }
    local = {
        "repo": None,
        "path": LOCAL,
        "revision": None,
        "sha": None,
        "format": "v3.0",
        "frames": 800,
        "episodes": 10,
    }
    figures = {"validation_loss": 0.2, "mean_action_mse": 0.05, "blind_mse": 0.1, "seconds": 1.0}
    return [
        DatasetEvent(step=0, **hub, mixture=[{**hub, "share": 0.75}, {**local, "share": 0.25}]),
        MetricsEvent(step=20, loss=0.125, grad_norm=1.0, lr=1e-4, skipped=0.0),
        ValidationEvent(
            step=20,
            **figures,
            frames=90,
            episodes=2,
            datasets=[
                {"dataset": HUB, **figures, "frames": 60, "episodes": 1},
                {"dataset": LOCAL, **figures, "frames": 30, "episodes": 1},
            ],
        ),
    ]


def table_rows(card: str) -> dict[str, str]:
    """The card's first table, by its first column."""
    rows: dict[str, str] = {}
    for line in card.splitlines():
        match = re.fullmatch(r"\| ([^|]+?) \| (.*) \|", line)
        if match and match.group(1) not in rows:
            rows[match.group(1)] = match.group(2)
    return rows


def meta_of(card: str) -> dict[str, Any]:
    """The front matter: a line a key, each value written as JSON (which is YAML too)."""
    assert card.startswith("---\n")
    block = card[4 : card.index("\n---\n", 4)]
    return {key: json.loads(value) for key, _, value in (line.partition(": ") for line in block.splitlines())}


def test_a_mixtures_card_has_a_row_per_dataset_with_its_share() -> None:
    config = mixture_config()
    assert config.dataset_name == HUB
    facts = facts_of_events(config, mixture_events(), job_id="ft-0123456789ab")
    card = model_card(facts, repo_id="team/pick-fork-pi05")
    rows = table_rows(card)

    assert "dataset" not in rows  # numbered rows, one per dataset
    first, second = rows["dataset 1"], rows["dataset 2"]
    assert "dataset 3" not in rows
    assert first.startswith(f"{HUB} at v2.1 (commit {SHA})")
    assert "LeRobot v2.1" in first and "20 episodes" in first and "1,200 frames" in first
    assert first.endswith("; 75% of samples")
    assert second == "a local LeRobot dataset (other); 25% of samples"
    assert [line for _, line in datasets_of(facts)] == [first, second]
    assert rows["final training loss"].startswith("0.125")

    # The local directory is named by its last part only, in the table and the recipe alike.
    assert LOCAL not in card
    assert "/data" not in card
    assert "/root/.cache" not in card  # nor the Hub dataset's place on the training machine
    shown = recipe_of(config)
    assert [entry["name"] for entry in shown["datasets"]] == [HUB, "(local) other"]
    assert [entry["weight"] for entry in shown["datasets"]] == [3, 1]
    assert shown["dataset_name"] == HUB

    # The Hub indexes the repo by the Hub dataset alone: a local directory is no Hub dataset.
    meta = meta_of(card)
    assert meta["datasets"] == [HUB]
    assert meta == front_matter(facts)


def test_a_mixture_with_the_local_dataset_first_names_no_path() -> None:
    config = SFTConfig.parse(
        {"model": "pi05-tiny", "datasets": [{"name": LOCAL + "/", "weight": 1}, {"name": HUB, "weight": 3}]}
    )
    assert config.dataset_name == LOCAL + "/"
    card = model_card(facts_of_events(config, []))
    rows = table_rows(card)
    assert rows["dataset 1"] == "a local LeRobot dataset (other); 25% of samples"
    # Not read (no dataset event): the Hub dataset at the revision the engine would choose.
    assert rows["dataset 2"] == f"{HUB} at the revision the engine chose; 75% of samples"
    assert LOCAL not in card
    assert '"dataset_name": "(local) other"' in card
    assert meta_of(card)["datasets"] == [HUB]


def test_a_mixture_of_local_datasets_lists_no_hub_dataset() -> None:
    config = SFTConfig.parse({"model": "pi05-tiny", "datasets": [{"name": LOCAL}, {"name": "/data/more"}]})
    card = model_card(facts_of_events(config, []))
    rows = table_rows(card)
    assert rows["dataset 1"] == "a local LeRobot dataset (other); 50% of samples"
    assert rows["dataset 2"] == "a local LeRobot dataset (more); 50% of samples"
    assert "datasets" not in meta_of(card)
    assert "/data/" not in card


def test_a_single_datasets_card_keeps_one_dataset_row() -> None:
    config = SFTConfig(model="pi05-tiny", dataset_name="lerobot/pusht_image", steps=20)
    read = DatasetEvent(
        step=0,
        repo="lerobot/pusht_image",
        path=None,
        revision="v2.1",
        sha=SHA,
        format="v2.1",
        frames=25650,
        episodes=206,
    )
    card = model_card(facts_of_events(config, [read]))
    rows = table_rows(card)
    assert rows["dataset"] == (
        f"lerobot/pusht_image at v2.1 (commit {SHA}), LeRobot v2.1, 206 episodes, 25,650 frames"
    )
    assert not any(re.fullmatch(r"dataset \d+", key) for key in rows)
    assert card.count("| dataset |") == 1
    assert "of samples" not in card
    assert meta_of(card)["datasets"] == ["lerobot/pusht_image"]
