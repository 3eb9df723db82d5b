"""SFTConfig: defaults, every rule, and messages that name the field, the value and the rule."""

from __future__ import annotations

import math

import pytest

from relay import catalog
from relay.errors import ConfigError
from relay.sft.config import SFTConfig

BASE = {"model": "pi05", "dataset_name": "lerobot/pusht_image"}

# (fields, the field at fault, how the message starts)
BAD_CONFIGS: list[tuple[dict[str, object], str, str]] = [
    (
        {"model": "pi06"},
        "model",
        'bad model: "pi06" (must be one of pi05, pi05-tiny, smolvla, smolvla-tiny, rt-j, rt-j-tiny)',
    ),
    ({"model": 5}, "model", "bad model: 5"),
    ({"dataset_name": ""}, "dataset_name", 'bad dataset_name: ""'),
    ({"dataset_name": "a\nb"}, "dataset_name", "bad dataset_name:"),
    ({"dataset_name": "x" * 1025}, "dataset_name", "bad dataset_name:"),
    # Neither a Hub repo id nor a local directory (relay.dataset_names' one rule): refused whatever
    # the server reads, never taken for a Hub name or a path.
    ({"dataset_name": "lerobot/../../etc"}, "dataset_name", 'bad dataset_name: "lerobot/../../etc" (must be'),
    ({"dataset_name": "lerobot/.."}, "dataset_name", 'bad dataset_name: "lerobot/.." (must be'),
    ({"dataset_name": "a/./b"}, "dataset_name", 'bad dataset_name: "a/./b" (must be'),
    ({"dataset_name": "..\\..\\etc"}, "dataset_name", "bad dataset_name:"),
    ({"dataset_name": ".\\"}, "dataset_name", "bad dataset_name:"),
    ({"dataset_name": " /etc"}, "dataset_name", 'bad dataset_name: " /etc" (must be'),
    ({"batch_size": 0}, "batch_size", "bad batch_size: 0 (must be an integer from 1 to 512)"),
    ({"batch_size": 513}, "batch_size", "bad batch_size: 513 (must be an integer from 1 to 512)"),
    ({"batch_size": 32.5}, "batch_size", "bad batch_size: 32.5 (must be an integer from 1 to 512)"),
    ({"batch_size": "32"}, "batch_size", 'bad batch_size: "32" (must be an integer from 1 to 512)'),
    ({"batch_size": True}, "batch_size", "bad batch_size: true"),
    ({"learning_rate": 0}, "learning_rate", "bad learning_rate: 0 (must be a number greater than 0)"),
    ({"learning_rate": -1e-5}, "learning_rate", "bad learning_rate: -1e-05"),
    ({"learning_rate": math.nan}, "learning_rate", "bad learning_rate: nan"),
    ({"learning_rate": math.inf}, "learning_rate", "bad learning_rate: inf"),
    ({"steps": 0}, "steps", "bad steps: 0 (must be an integer from 1 to 100,000)"),
    ({"steps": 100_001}, "steps", "bad steps: 100001 (must be an integer from 1 to 100,000)"),
    ({"finetune": "qlora"}, "finetune", 'bad finetune: "qlora" (must be "lora" or "full")'),
    ({"lora_rank": 0}, "lora_rank", "bad lora_rank: 0 (must be an integer from 1 to 256)"),
    ({"lora_rank": 257}, "lora_rank", "bad lora_rank: 257 (must be an integer from 1 to 256)"),
    ({"lora_alpha": 0}, "lora_alpha", "bad lora_alpha: 0 (must be a number greater than 0"),
    ({"lora_alpha": -2.0}, "lora_alpha", "bad lora_alpha: -2.0"),
    ({"targets": ["vision", "wings"]}, "targets", """bad targets: ["vision", "wings"] (unknown target"""),
    ({"targets": []}, "targets", "bad targets: [] (targets must name at least one place"),
    ({"targets": ["heads", "heads"]}, "targets", 'bad targets: ["heads", "heads"] (each target may appear'),
    ({"targets": "all"}, "targets", 'bad targets: "all" (must be a list of targets from: all,'),
    ({"cameras": {"top": "observation.images.top"}}, "cameras", "bad cameras:"),
    ({"cameras": {"base_0_rgb": ""}}, "cameras", "bad cameras:"),
    ({"cameras": {}}, "cameras", "bad cameras: {}"),
    ({"cameras": ["base_0_rgb"]}, "cameras", "bad cameras:"),
    ({"name": "n" * 129}, "name", "bad name:"),
    ({"name": "tab\there"}, "name", "bad name:"),
    (
        {"batch_size": 4, "gpus": 8},
        "gpus",
        "bad gpus: 8 (must be at most batch_size, 4: each GPU needs at least one sample)",
    ),
    (
        {"dataset_revision": ""},
        "dataset_revision",
        'bad dataset_revision: "" (must name a branch, tag or commit',
    ),
    ({"dataset_revision": "v 2.1"}, "dataset_revision", 'bad dataset_revision: "v 2.1" (must name a branch'),
    ({"dataset_revision": "v2.1\n"}, "dataset_revision", "bad dataset_revision:"),
    ({"dataset_revision": "r" * 257}, "dataset_revision", "bad dataset_revision:"),
    ({"dataset_revision": 21}, "dataset_revision", "bad dataset_revision: 21"),
    (
        {"dataset_name": "/data/robot", "dataset_revision": "v2.1"},
        "dataset_revision",
        'bad dataset_revision: "v2.1" (dataset_name names a local directory, which has no revisions',
    ),
    (
        {"dataset_name": "file:///data/robot", "dataset_revision": "main"},
        "dataset_revision",
        'bad dataset_revision: "main" (dataset_name names a local directory',
    ),
    (
        {"model": "rt-j", "dataset_name": "/data/shop", "task": "user-churn", "dataset_revision": "main"},
        "dataset_revision",
        "bad dataset_revision: rt-j takes no dataset_revision (RT-J reads a database directory",
    ),
    ({"epochs": 3}, "epochs", "unknown field epochs (SFTConfig's fields: model, dataset_name,"),
]


def test_defaults_are_the_specs() -> None:
    config = SFTConfig(**BASE)
    assert (config.batch_size, config.learning_rate, config.steps) == (128, 2.5e-5, 6000)
    assert (config.finetune, config.lora_rank, config.lora_alpha) == ("lora", 32, 32.0)
    assert config.targets == list(catalog.DEFAULT_LORA_TARGETS)
    assert config.cameras is None and config.name is None


def test_defaults_follow_the_choices_made() -> None:
    assert SFTConfig(**BASE, finetune="full").targets == ["all"]
    assert SFTConfig(**BASE, lora_rank=8).lora_alpha == 8.0
    assert SFTConfig(**BASE, lora_rank=8, lora_alpha=16).lora_alpha == 16.0


def test_a_model_with_defaults_of_its_own_gets_them_for_the_fields_left_out() -> None:
    tiny = {"model": "pi05-tiny", "dataset_name": "lerobot/pusht_image"}
    config = SFTConfig(**tiny)
    assert (config.finetune, config.learning_rate, config.batch_size) == ("full", 1e-3, 16)
    assert config.targets == ["all"] and config.gpus is None  # full's gpus: the service's choice
    # SFTConfig.default answers the same, per model; without a model, the spec's (pi05's).
    assert [SFTConfig.default(f, "pi05-tiny") for f in ("finetune", "learning_rate", "batch_size")] == [
        "full",
        1e-3,
        16,
    ]
    assert (SFTConfig.default("learning_rate"), SFTConfig.default("learning_rate", "pi05")) == (
        2.5e-5,
        2.5e-5,
    )
    # What is given wins; a stored job's config (every field spelled out) reads back unchanged.
    chosen = SFTConfig(**tiny, finetune="lora", learning_rate=1e-4, batch_size=8)
    assert (chosen.finetune, chosen.learning_rate, chosen.batch_size) == ("lora", 1e-4, 8)
    assert chosen.targets == list(catalog.DEFAULT_LORA_TARGETS)
    assert SFTConfig.parse(chosen.model_dump()) == chosen and SFTConfig.parse(config.model_dump()) == config
    # The JSON schema (the API's, the console's form) carries them beside the spec's default.
    schema = SFTConfig.model_json_schema()["properties"]["learning_rate"]
    assert (schema["default"], schema["x-model-defaults"]) == (
        2.5e-5,
        {"pi05-tiny": 1e-3, "smolvla": 1e-4, "smolvla-tiny": 1e-3, "rt-j": 1e-4, "rt-j-tiny": 1e-3},
    )


def test_rt_j_models_train_at_their_own_rate_and_batch_not_pi05s() -> None:
    """At pi05's 2.5e-5 and 128 contexts an RT-J's loss sat at ln 2 (0.6931) at every event."""
    for model, rate, batch in (("rt-j-tiny", 1e-3, 16), ("rt-j", 1e-4, 32)):
        config = SFTConfig(model=model, dataset_name="/data/shop", task="user-churn")
        assert (config.finetune, config.learning_rate, config.batch_size) == ("full", rate, batch)
        assert SFTConfig.default("learning_rate", model) == rate


def test_limits_are_inclusive() -> None:
    for fields in (
        {"batch_size": 1},
        {"batch_size": 512},
        {"steps": 1},
        {"steps": 100_000},
        {"lora_rank": 1},
        {"lora_rank": 256},
        {"learning_rate": 1},
        {"name": "n" * 128},
    ):
        SFTConfig(**BASE, **fields)


def test_spec_examples_build() -> None:
    SFTConfig(model="pi05", dataset_name="lerobot/pusht_image", batch_size=32, learning_rate=2.5e-5)
    SFTConfig(model="pi05", dataset_name="x", finetune="full")
    SFTConfig(model="pi05", dataset_name="x", targets=["all"])
    SFTConfig(model="pi05", dataset_name="x", targets=["language.mlp", "action_expert.attn"])
    SFTConfig(model="pi05", dataset_name="x", cameras={"base_0_rgb": "observation.images.top"})


@pytest.mark.parametrize(("fields", "param", "message"), BAD_CONFIGS)
def test_each_rule_names_field_value_and_rule(fields: dict[str, object], param: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        SFTConfig(**{**BASE, **fields})
    assert caught.value.param == param
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_missing_field_is_named() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^missing model \(required; it must be one of pi05, pi05-tiny, smolvla, smolvla-tiny, "
        r"rt-j, rt-j-tiny\)",
    ):
        SFTConfig(dataset_name="x")  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"^missing dataset_name"):
        SFTConfig(model="pi05")  # type: ignore[call-arg]


def test_parse_refuses_what_is_not_an_object() -> None:
    with pytest.raises(ConfigError, match="must be an object"):
        SFTConfig.parse([1, 2])
    assert SFTConfig.parse(dict(BASE)).model == "pi05"


def test_a_config_round_trips_through_its_dump() -> None:
    config = SFTConfig(**BASE, targets=["all"], cameras={"base_0_rgb": "observation.images.top"}, name="x")
    assert SFTConfig.parse(config.model_dump()) == config


def test_dataset_revision_is_none_by_default_and_takes_a_branch_tag_or_sha() -> None:
    assert SFTConfig(**BASE).dataset_revision is None
    for revision in ("v2.1", "main", "refs/pr/1", "a" * 40, "r" * 256):
        config = SFTConfig(**BASE, dataset_revision=revision)
        assert config.dataset_revision == revision
        assert SFTConfig.parse(config.model_dump()) == config
    schema = SFTConfig.model_json_schema()["properties"]["dataset_revision"]
    text = next(choice for choice in schema["anyOf"] if choice.get("type") == "string")
    assert (text["minLength"], text["maxLength"], schema["default"]) == (1, 256, None)
    assert "pattern" in text


def test_the_revision_rule_means_the_same_to_the_json_schema_and_to_python() -> None:
    """The schema's pattern is read by JSON Schema tools with ECMAScript's `\\s`, and by the validator
    with Python's: they disagree on U+0085 (Python's whitespace, not ECMAScript's) and U+FEFF
    (ECMAScript's, not Python's). Both are named in the pattern, so both readings refuse them (the
    schema fuzz found a schema-valid revision with U+0085 that the API refused)."""
    import re

    from relay.sft.config import REVISION_PATTERN

    without_whitespace_class = REVISION_PATTERN.replace("\\s", "")
    for char in ("\x85", "\ufeff", "\x9f"):
        assert re.fullmatch(without_whitespace_class, f"v{char}") is None, repr(char)
        with pytest.raises(ValueError, match="bad dataset_revision"):
            SFTConfig(**BASE, dataset_revision=f"v{char}")


def test_every_recipe_field_is_every_family_s_or_one_some_families_name() -> None:
    """A new SFTConfig field must be classified: every family's, or in FAMILY_RECIPE_FIELDS, which
    a family takes only by naming it (FamilySpec.recipe_fields); so no family accepts another's
    field without saying so."""
    from relay import families

    every_family = {"model", "dataset_name", "batch_size", "learning_rate", "steps", "name", "gpus", "task"}
    every_family |= {"integrations"}
    every_family |= {"hub"}  # the worker pushes any family's output
    unclassified = set(SFTConfig.model_fields) - every_family - set(families.FAMILY_RECIPE_FIELDS)
    assert not unclassified, f"classify these SFTConfig fields: {sorted(unclassified)}"
    for spec in families.family_specs():
        assert spec.recipe_fields <= set(families.FAMILY_RECIPE_FIELDS), spec.name
