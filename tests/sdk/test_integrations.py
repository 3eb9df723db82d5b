"""A recipe's integrations in the SDK: typed, checked where they are built, each problem naming its
place; a key never taken (nor shown back); the CLI's options; the JSON Schema's "one of each"."""

from __future__ import annotations

from typing import Any

import pytest

from relay.errors import ConfigError
from relay.integrations import (
    TensorBoardIntegration,
    WandbIntegration,
    integrations_of_options,
)
from relay.sft.config import SFTConfig

BASE: dict[str, Any] = {"model": "pi05-tiny", "dataset_name": "lerobot/pusht_image"}


def test_integrations_are_typed_and_kept_through_a_round_trip() -> None:
    config = SFTConfig(
        **BASE,
        integrations=[
            {"type": "wandb", "wandb": {"project": "pick", "entity": "team", "name": "run 1", "tags": ["a"]}},
            {"type": "tensorboard"},
        ],
    )
    wandb, board = config.integrations
    assert isinstance(wandb, WandbIntegration) and wandb.wandb.project == "pick" and wandb.wandb.tags == ["a"]
    assert isinstance(board, TensorBoardIntegration)
    dumped = config.model_dump(mode="json")
    assert dumped["integrations"][1] == {"type": "tensorboard"}
    assert SFTConfig.parse(dumped) == config
    assert SFTConfig(**BASE).integrations == []
    # RT-J's runs report the same events: every family takes them.
    relational = SFTConfig(
        model="rt-j-tiny", dataset_name="/data/shop", task="churn", integrations=[{"type": "tensorboard"}]
    )
    assert relational.integrations[0].type == "tensorboard"


def wandb(**settings: Any) -> list[dict[str, Any]]:
    return [{"type": "wandb", "wandb": {"project": "p", **settings}}]


W0 = "integrations[0].wandb"


@pytest.mark.parametrize(
    ("integrations", "param", "start"),
    [
        ({"type": "tensorboard"}, "integrations", "bad integrations: "),
        (wandb(project=""), f"{W0}.project", f"bad {W0}.project"),
        (wandb(entity="a b"), f"{W0}.entity", f"bad {W0}.entity"),
        (wandb(name="\x07"), f"{W0}.name", f"bad {W0}.name"),
        (wandb(tags=["t"] * 21), f"{W0}.tags", f"bad {W0}.tags"),
        (wandb(colour="red"), f"{W0}.colour", f"unknown field {W0}.colour"),
        ([{"type": "wandb"}], W0, f"missing {W0}"),
        ([{"type": "tensorboard", "log_dir": "/x"}], "integrations[0].log_dir", "unknown field"),
        ([{"wandb": {"project": "p"}}], "integrations[0].type", "bad integrations[0].type"),
        ([{"type": "comet"}], "integrations[0].type", 'bad integrations[0].type: "comet"'),
        ([{"type": "mlflow"}], "integrations[0].type", 'bad integrations[0].type: "mlflow"'),
        (wandb() + wandb(project="b"), "integrations", "bad integrations: wandb is named 2 times"),
    ],
)
def test_a_broken_integration_names_its_place(integrations: Any, param: str, start: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SFTConfig(**BASE, integrations=integrations)
    assert raised.value.param == param
    assert raised.value.message.startswith(start), raised.value.message


@pytest.mark.parametrize("field", ["api_key", "token", "password"])
def test_a_key_is_never_taken_nor_shown_back(field: str) -> None:
    secret = "s3cr3t-" + "9" * 30
    with pytest.raises(ConfigError) as raised:
        SFTConfig(**BASE, integrations=[{"type": "wandb", "wandb": {"project": "p", field: secret}}])
    assert raised.value.param == f"integrations[0].wandb.{field}"
    assert "WANDB_API_KEY" in raised.value.message and secret not in raised.value.message


def test_the_cli_options_make_integrations() -> None:
    assert integrations_of_options(None, None) is None
    assert integrations_of_options(["tensorboard"], "pick") == [
        {"type": "tensorboard"},
        {"type": "wandb", "wandb": {"project": "pick"}},
    ]
    given = '{"type": "wandb", "wandb": {"project": "p", "entity": "t"}}'
    assert integrations_of_options([given], None) == [
        {"type": "wandb", "wandb": {"project": "p", "entity": "t"}}
    ]
    for bad, words in (("wandb", "needs a project"), ("{nope", "not JSON"), ("comet", "'comet'")):
        with pytest.raises(ValueError, match=words):
            integrations_of_options([bad], None)


def test_the_json_schema_gives_the_two_types_and_says_one_of_each() -> None:
    """What a reader of the document (the console, the API's fuzz) sees."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    schema = SFTConfig.model_json_schema()
    field = schema["properties"]["integrations"]
    assert field["maxItems"] == 2 and "at most one integration of each type" in field["description"]
    checker = jsonschema_rs.Draft202012Validator({**field, "$defs": schema["$defs"]})
    assert checker.is_valid([{"type": "tensorboard"}, {"type": "wandb", "wandb": {"project": "p"}}])
    assert not checker.is_valid([{"type": "mlflow"}])
    assert not checker.is_valid([{"type": "wandb", "wandb": {"project": "a/b"}}])
