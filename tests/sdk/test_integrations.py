"""A recipe's integrations in the SDK: typed, checked where they are built, each problem naming its
place; a key never taken (nor shown back); the CLI's options; the JSON Schema's "one of each"."""

from __future__ import annotations

from typing import Any

import pytest

from relay.errors import ConfigError
from relay.integrations import (
    MlflowIntegration,
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
            {"type": "mlflow", "mlflow": {"tracking_uri": "https://mlflow.example:5000/base"}},
        ],
    )
    wandb, board, mlflow = config.integrations
    assert isinstance(wandb, WandbIntegration) and wandb.wandb.project == "pick" and wandb.wandb.tags == ["a"]
    assert isinstance(board, TensorBoardIntegration)
    assert isinstance(mlflow, MlflowIntegration) and mlflow.mlflow.experiment == "relay"  # the default
    dumped = config.model_dump(mode="json")
    assert dumped["integrations"][1] == {"type": "tensorboard"}
    assert dumped["integrations"][2] == {
        "type": "mlflow",
        "mlflow": {"tracking_uri": "https://mlflow.example:5000/base", "experiment": "relay"},
    }
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
M0 = "integrations[0].mlflow"


def mlflow(**settings: Any) -> list[dict[str, Any]]:
    return [{"type": "mlflow", "mlflow": {"tracking_uri": "http://127.0.0.1:5000", **settings}}]


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
        ([{"type": "mlflow"}], M0, f"missing {M0}"),
        ([{"type": "mlflow", "mlflow": {}}], f"{M0}.tracking_uri", f"missing {M0}.tracking_uri"),
        (mlflow(tracking_uri="file:///tmp/mlruns"), f"{M0}.tracking_uri", f"bad {M0}.tracking_uri"),
        (mlflow(tracking_uri="http://"), f"{M0}.tracking_uri", f"bad {M0}.tracking_uri"),
        (mlflow(tracking_uri="https://me:pw@x.example"), f"{M0}.tracking_uri", f"bad {M0}.tracking_uri"),
        (mlflow(experiment=""), f"{M0}.experiment", f"bad {M0}.experiment"),
        (mlflow(run_id="r"), f"{M0}.run_id", f"unknown field {M0}.run_id"),
        (mlflow() + mlflow(), "integrations", "bad integrations: mlflow is named 2 times"),
        (wandb() + wandb(project="b"), "integrations", "bad integrations: wandb is named 2 times"),
    ],
)
def test_a_broken_integration_names_its_place(integrations: Any, param: str, start: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SFTConfig(**BASE, integrations=integrations)
    assert raised.value.param == param
    assert raised.value.message.startswith(start), raised.value.message


# The secrets each block takes; any other one it names is refused.
TAKEN = {("wandb", "api_key"), ("mlflow", "token")}


@pytest.mark.parametrize(
    ("kind", "field"),
    [
        (kind, field)
        for kind in ("wandb", "mlflow")
        for field in ("api_key", "token", "password")
        if (kind, field) not in TAKEN
    ],
)
def test_a_key_a_block_does_not_take_is_refused_and_not_shown_back(field: str, kind: str) -> None:
    secret = "s3cr3t-" + "9" * 30
    settings = {"project": "p"} if kind == "wandb" else {"tracking_uri": "http://127.0.0.1:5000"}
    with pytest.raises(ConfigError) as raised:
        SFTConfig(**BASE, integrations=[{"type": kind, kind: {**settings, field: secret}}])
    assert raised.value.param == f"integrations[0].{kind}.{field}"
    assert "wandb.api_key" in raised.value.message and "mlflow.token" in raised.value.message
    assert "WANDB_API_KEY" in raised.value.message and secret not in raised.value.message


@pytest.mark.parametrize(
    ("kind", "field", "variable"),
    [("wandb", "api_key", "WANDB_API_KEY"), ("mlflow", "token", "MLFLOW_TRACKING_TOKEN")],
)
def test_a_key_given_is_held_as_a_secret(kind: str, field: str, variable: str) -> None:
    from relay.integrations import REVEAL_SECRETS, tracker_secrets, without_secrets

    secret = "s3cr3t-" + "9" * 30
    settings = {"project": "p"} if kind == "wandb" else {"tracking_uri": "http://127.0.0.1:5000"}
    config = SFTConfig(**BASE, integrations=[{"type": kind, kind: {**settings, field: secret}}])
    # Masked wherever a config is shown or dumped, revealed only where the SDK sends it.
    assert secret not in repr(config) and secret not in config.model_dump_json()
    assert config.model_dump(mode="json")["integrations"][0][kind][field] == "**********"
    sent = config.model_dump(mode="json", context={REVEAL_SECRETS: True})
    assert sent["integrations"][0][kind][field] == secret
    assert tracker_secrets(config.integrations) == {variable: secret}
    kept = without_secrets(config.integrations)
    assert field not in kept[0].model_dump(mode="json")[kind] and tracker_secrets(kept) == {}
    # A malformed key is refused without being shown back.
    for bad in (secret + " x", "x" * 513, ""):
        with pytest.raises(ConfigError) as raised:
            SFTConfig(**BASE, integrations=[{"type": kind, kind: {**settings, field: bad}}])
        assert raised.value.param == f"integrations[0].{kind}.{field}"
        assert "not shown" in raised.value.message and (not bad or bad not in raised.value.message)


def test_a_password_in_the_tracking_uri_is_refused_and_not_shown_back() -> None:
    with pytest.raises(ConfigError) as raised:
        SFTConfig(**BASE, integrations=mlflow(tracking_uri="https://me:s3cr3t-pw@x.example"))
    assert "s3cr3t-pw" not in raised.value.message and "MLFLOW_TRACKING_PASSWORD" in raised.value.message


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
    assert integrations_of_options(None, None, "http://127.0.0.1:5000", "pick") == [
        {"type": "mlflow", "mlflow": {"tracking_uri": "http://127.0.0.1:5000", "experiment": "pick"}}
    ]
    assert integrations_of_options(None, None, "http://127.0.0.1:5000") == [
        {"type": "mlflow", "mlflow": {"tracking_uri": "http://127.0.0.1:5000"}}
    ]
    for bad, words in (
        ("wandb", "needs a project"),
        ("mlflow", "needs a tracking server"),
        ("{nope", "not JSON"),
        ("comet", "'comet'"),
    ):
        with pytest.raises(ValueError, match=words):
            integrations_of_options([bad], None)
    with pytest.raises(ValueError, match="needs --mlflow-uri"):
        integrations_of_options(None, None, None, "pick")


def test_the_json_schema_gives_the_three_types_and_says_one_of_each() -> None:
    """What a reader of the document (the console, the API's fuzz) sees."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    schema = SFTConfig.model_json_schema()
    field = schema["properties"]["integrations"]
    assert field["maxItems"] == 3 and "at most one integration of each type" in field["description"]
    checker = jsonschema_rs.Draft202012Validator({**field, "$defs": schema["$defs"]})
    assert checker.is_valid([{"type": "tensorboard"}, {"type": "wandb", "wandb": {"project": "p"}}])
    assert checker.is_valid([{"type": "mlflow", "mlflow": {"tracking_uri": "http://127.0.0.1:5000"}}])
    assert not checker.is_valid([{"type": "mlflow"}])
    assert not checker.is_valid([{"type": "mlflow", "mlflow": {"tracking_uri": "ftp://x"}}])
    assert not checker.is_valid([{"type": "wandb", "wandb": {"project": "a/b"}}])
