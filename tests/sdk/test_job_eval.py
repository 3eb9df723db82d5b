"""A recipe's `eval` block as SFTConfig checks it: defaults, errors naming `eval.FIELD`, and the
models that refuse it."""

from __future__ import annotations

import pytest

from relay.env_evaluation import JOB_ENVS
from relay.errors import ConfigError
from relay.sft.config import SFTConfig


def test_an_eval_block_takes_its_defaults() -> None:
    config = SFTConfig(model="pi05-tiny", dataset_name="lerobot/pusht_image", eval={"env": "relay/Dot-v0"})
    assert config.eval is not None
    assert config.model_dump(mode="json")["eval"] == {
        "env": "relay/Dot-v0",
        "episodes": 10,
        "seed": 0,
        "max_steps": None,
        "at_checkpoints": False,
        "videos": 2,
    }
    assert SFTConfig(model="pi05-tiny", dataset_name="lerobot/pusht_image").eval is None


ENVS = ", ".join(JOB_ENVS)
DOT = "relay/Dot-v0"


@pytest.mark.parametrize(
    ("block", "param", "message"),
    [
        ({"env": "CartPole-v1"}, "eval.env", f'bad eval.env: "CartPole-v1" (must be one of the environments a worker runs: {ENVS})'),  # noqa: E501
        ({"env": DOT, "max_steps": 0}, "eval.max_steps", "bad eval.max_steps: 0 (must be an integer from 1 to 100000"),  # noqa: E501
        ({"env": DOT, "videos": 11}, "eval.videos", "bad eval.videos: 11 (must be an integer from 0 to 10"),
        ({"env": DOT, "at_checkpoints": "yes"}, "eval.at_checkpoints", 'bad eval.at_checkpoints: "yes"'),
        ({}, "eval.env", "missing eval.env"),
        (DOT, "eval", "bad eval: must be an object"),
    ],
)  # fmt: skip
def test_a_bad_eval_block_names_its_field(block: object, param: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SFTConfig(model="pi05-tiny", dataset_name="lerobot/pusht_image", eval=block)
    assert raised.value.param == param and raised.value.message.startswith(message)


def test_rtj_models_refuse_an_eval_block() -> None:
    with pytest.raises(ConfigError) as raised:
        SFTConfig(model="rt-j-tiny", dataset_name="db", task="churn", eval={"env": "relay/Dot-v0"})
    assert raised.value.param == "eval" and "rt-j-tiny takes no eval" in raised.value.message
