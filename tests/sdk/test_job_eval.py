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


PUSHT = "gym_pusht/PushT-v0"


@pytest.mark.parametrize(
    ("block", "steps", "param", "words"),
    [
        # What a fault probe sent: within each field's limits, 100 million episode-steps, and a cancel
        # waited 4 min 20 s before its process was killed.
        ({"env": DOT, "episodes": 1000, "max_steps": 100_000}, 10, "eval.episodes", "are 100,000,000 episode-steps"),  # noqa: E501
        ({"env": DOT, "episodes": 1, "max_steps": 100_000}, 10, None, None),  # just the budget
        ({"env": DOT, "episodes": 2001}, 10, "eval.episodes", "from 1 to 1000)"),  # its field's rule first
        ({"env": DOT, "episodes": 1000}, 10, None, None),  # 50,000: Dot's limit where max_steps is null
        ({"env": PUSHT, "episodes": 334}, 10, "eval.episodes", "are 100,200 episode-steps"),  # PushT's 300
        ({"env": PUSHT, "episodes": 333}, 10, None, None),
        # Summed over a job's evaluations: one after each checkpoint (every 1,000 steps by default).
        ({"env": DOT, "episodes": 1000, "max_steps": 100, "at_checkpoints": True}, 10_000, None, None),
        ({"env": DOT, "episodes": 1000, "max_steps": 100, "at_checkpoints": True}, 10_001, "eval.at_checkpoints", "evaluates 11 times, up to 100,000 episode-steps each: 1,100,000 in all"),  # noqa: E501
        ({"env": DOT, "episodes": 1000, "max_steps": 100}, 100_000, None, None),  # once, at the end
    ],
)  # fmt: skip
def test_an_eval_block_over_its_budget_is_refused_naming_the_field_and_the_budget(
    block: dict[str, object], steps: int, param: str | None, words: str | None
) -> None:
    config = dict(model="pi05-tiny", dataset_name="lerobot/pusht_image", steps=steps, eval=block)
    if param is None:
        assert SFTConfig(**config).eval is not None  # type: ignore[arg-type]
        return
    with pytest.raises(ConfigError) as raised:
        SFTConfig(**config)  # type: ignore[arg-type]
    assert raised.value.param == param and words in raised.value.message, raised.value.message
    if raised.value.code == "over_budget":
        assert ("100,000 episode-steps" if param == "eval.episodes" else "1,000,000 episode-steps") in str(
            raised.value
        )


def test_the_budget_is_the_same_at_every_cadence_a_caller_checkpoints_at() -> None:
    """The API and the engine ask the one rule at the cadence they checkpoint at."""
    from relay.env_evaluation import JobEval, check_job_eval_budget

    block = JobEval.parse({"env": DOT, "episodes": 100, "max_steps": 50, "at_checkpoints": True})
    check_job_eval_budget(block, 2000, 10)  # 200 evaluations of 5,000: 1,000,000
    with pytest.raises(ConfigError) as raised:
        check_job_eval_budget(block, 2001, 10)
    assert raised.value.param == "eval.at_checkpoints" and "201 times" in raised.value.message
