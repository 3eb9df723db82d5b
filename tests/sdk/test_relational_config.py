"""SFTConfig for the two families: rt-j needs a task and refuses what only pi05 has, pi05 refuses
a task; each refusal names the field and the rule."""

from __future__ import annotations

import pytest

from relay.errors import ConfigError
from relay.sft.config import SFTConfig


def test_an_rt_j_recipe_is_tuned_in_full() -> None:
    config = SFTConfig(model="rt-j", dataset_name="/data/shop", task="user-churn")
    assert config.finetune == "full" and config.targets == ["all"] and config.task == "user-churn"
    # What a job stores and the SDK sends back reads the same.
    assert SFTConfig.parse(config.model_dump(mode="json")) == config


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"model": "rt-j"}, "task", "missing task (required for rt-j"),
        ({"model": "rt-j", "task": "t", "cameras": {"base_0_rgb": "x"}}, "cameras", "takes no cameras"),
        ({"model": "rt-j-tiny", "task": "t", "finetune": "lora"}, "finetune", 'must be "full"'),
        ({"model": "rt-j", "task": "t", "targets": ["vision"]}, "targets", "every weight trains"),
        ({"model": "pi05", "task": "t"}, "task", "pi05 takes no task"),
        ({"model": "rt-j", "task": "t", "gpus": 2}, "gpus", "one process"),
        ({"model": "rt-j", "task": "bad\ntask"}, "task", "no control characters"),
        ({"model": "rt-x", "task": "t"}, "model", "pi05, pi05-tiny, rt-j, rt-j-tiny"),
    ],
)
def test_fields_of_the_other_family_are_refused(fields: dict[str, object], param: str, words: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SFTConfig(dataset_name="/data/shop", **fields)
    assert raised.value.param == param and words in str(raised.value)
