"""A closed-loop evaluation's report: a policy run in a simulated environment for N episodes.

The engine's `relay_engine.envs.evaluate_in_env` returns it and `relay eval` prints it (a table,
or with `--json` this model's JSON). It lives in the SDK, beside the other reports shared by the
engine, the service and the CLI, so that anything reading a saved report (`EnvEvalReport.
model_validate_json`) needs no engine.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from relay.errors import ConfigError
from relay.rules import CheckedConfig, WholeNumber, whole_float_to_int


class EpisodeRecord(BaseModel):
    """One episode: its seed (the environment was reset with it), whether it succeeded (the
    environment's `info["is_success"]` at any step), the sum and the largest of its rewards, its
    length in environment steps and, for the first episodes, its video."""

    model_config = ConfigDict(frozen=True)

    episode: int = Field(description="Its number in the evaluation, from 0.")
    seed: int
    success: bool
    reward: float = Field(description="The sum of the episode's rewards.")
    max_reward: float = Field(description="The episode's largest single-step reward.")
    length: int = Field(description="Environment steps until it ended (success, failure or max_steps).")
    video: str | None = Field(default=None, description="The path of its mp4, when it was recorded.")


class EnvEvalReport(BaseModel):
    """N episodes of a policy in one environment: the rates and means, how long it took, and
    one record per episode (in episode order)."""

    model_config = ConfigDict(frozen=True)

    env_id: str
    env_options: dict[str, Any] = Field(
        default_factory=dict, description="The environment's constructor arguments given (a variant)."
    )
    model: str = Field(description="The model's name or directory, as given.")
    success_rate: float = Field(description="The fraction of episodes that succeeded, 0 to 1.")
    mean_reward: float = Field(description="The mean over episodes of each episode's summed reward.")
    mean_max_reward: float
    mean_length: float = Field(description="The mean episode length, in environment steps.")
    seconds: float = Field(description="Wall-clock time of the whole evaluation, loading excluded.")
    steps: int = Field(description="Environment steps taken in the episodes, all environments together.")
    forward_passes: int = Field(description="Batched model calls; each returns one chunk per waiting env.")
    seed: int
    max_steps: int
    num_envs: int
    actions_per_chunk: int
    episodes: list[EpisodeRecord]

    @property
    def steps_per_second(self) -> float:
        """Policy steps (environment steps with an action of the policy) per wall-clock second."""
        return self.steps / self.seconds if self.seconds > 0 else 0.0


# The environments a job's `eval` block may name: those with a ready mapping that a worker installs
# (relay/Dot-v0 with the engine; gym-pusht's PushT with the `pusht` extra, in `dev`). gym-aloha's
# need MuJoCo with EGL, which workers do not have; `relay eval` runs them on a machine that does.
JOB_ENVS = ("relay/Dot-v0", "gym_pusht/PushT-v0")
# Each one's registered episode limit (`max_episode_steps`), the steps an episode takes at most when
# the block names no max_steps (tests/engine/envs check them against the registrations).
JOB_ENV_STEP_LIMITS: dict[str, int] = {"relay/Dot-v0": 50, "gym_pusht/PushT-v0": 300}
JOB_EVAL_EPISODES_MAX = 1000
JOB_EVAL_MAX_STEPS_MAX = 100_000
JOB_EVAL_VIDEOS_MAX = 10
# Episode k is reset with seed + k, which environments (NumPy's legacy seeding among them) and
# torch's generators take as a 32- or 64-bit number: the seed is a 31-bit one, so seed + k always fits.
JOB_EVAL_SEED_MAX = 2**31 - 1
# What a job's evaluations may cost, in episode-steps (episodes x the steps each may take): one
# evaluation, and all of a job's together (with at_checkpoints, one after each checkpoint). An
# evaluation stops on a cancel between two steps, but runs to its end otherwise, and the job waits.
EVAL_EPISODE_STEPS_MAX = 100_000
JOB_EVAL_EPISODE_STEPS_MAX = 1_000_000


class JobEval(CheckedConfig):
    """A recipe's `eval` block: run the tuned policy in a simulated environment when training ends
    (and at each checkpoint with ``at_checkpoints``), as ``relay eval`` does."""

    RULES: ClassVar[dict[str, str]] = {
        "env": f"must be one of the environments a worker runs: {', '.join(JOB_ENVS)}",
        "episodes": f"must be an integer from 1 to {JOB_EVAL_EPISODES_MAX}",
        "seed": f"must be an integer from 0 to {JOB_EVAL_SEED_MAX:,}; episode k is reset with seed + k",
        "max_steps": (
            f"must be an integer from 1 to {JOB_EVAL_MAX_STEPS_MAX}, or null for the environment's limit"
        ),
        "at_checkpoints": "must be true or false",
        "videos": f"must be an integer from 0 to {JOB_EVAL_VIDEOS_MAX}: the first episodes recorded as mp4",
    }
    BUDGET_RULE: ClassVar[str] = (
        f"an evaluation may take at most {EVAL_EPISODE_STEPS_MAX:,} episode-steps (episodes x max_steps, "
        "the environment's limit where max_steps is null): fewer episodes, or a lower max_steps"
    )
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"env": JOB_ENVS}
    WHAT: ClassVar[str] = "eval"
    BODY_MESSAGE: ClassVar[str] = "bad eval: must be an object of {fields} (env required), or null"

    env: str = Field(description="The Gymnasium environment's id.")
    episodes: WholeNumber = Field(10, strict=True, ge=1, le=JOB_EVAL_EPISODES_MAX)
    seed: WholeNumber = Field(0, strict=True, ge=0, le=JOB_EVAL_SEED_MAX)
    # The bounds inside the Annotated, so that they stay in the JSON Schema of the optional field.
    max_steps: (
        Annotated[
            int, Field(strict=True, ge=1, le=JOB_EVAL_MAX_STEPS_MAX), BeforeValidator(whole_float_to_int)
        ]
        | None
    ) = None
    at_checkpoints: bool = Field(False, strict=True, description="Also evaluate at each checkpoint.")
    videos: WholeNumber = Field(2, strict=True, ge=0, le=JOB_EVAL_VIDEOS_MAX)

    @field_validator("env")
    @classmethod
    def _a_job_env(cls, value: str) -> str:
        if value not in JOB_ENVS:
            raise ValueError(cls.RULES["env"])
        return value

    @property
    def episode_steps(self) -> int:
        """What one evaluation costs at most: episodes x the steps each may take."""
        return self.episodes * (self.max_steps or JOB_ENV_STEP_LIMITS[self.env])

    def evaluations(self, steps: int, checkpoint_every: int) -> int:
        """How many evaluations a job of `steps` runs, checkpointing every `checkpoint_every` steps:
        one after each checkpoint with at_checkpoints (the last is at the end), else one at the end."""
        return -(-steps // checkpoint_every) if self.at_checkpoints else 1

    @model_validator(mode="after")
    def _within_the_budget(self) -> JobEval:
        if self.episode_steps > EVAL_EPISODE_STEPS_MAX:
            raise ConfigError(
                f"bad episodes: {self.episodes} episodes of up to {self.episode_steps // self.episodes:,} "
                f"steps are {self.episode_steps:,} episode-steps ({self.BUDGET_RULE})",
                "episodes",
                "over_budget",
            )
        return self


def check_job_eval_budget(spec: JobEval | None, steps: int, checkpoint_every: int) -> None:
    """Refuse a job whose evaluations add up to more than JOB_EVAL_EPISODE_STEPS_MAX episode-steps:
    the one rule, asked by SFTConfig (at the default checkpoint cadence), by the API (at its own) and
    by the engine's Recipe (at the run's). A ConfigError naming eval.at_checkpoints."""
    if spec is None:
        return
    evaluations = spec.evaluations(steps, checkpoint_every)
    total = evaluations * spec.episode_steps
    if total > JOB_EVAL_EPISODE_STEPS_MAX:
        raise ConfigError(
            f"bad eval.at_checkpoints: true (a job of {steps:,} steps checkpointing every "
            f"{checkpoint_every:,} evaluates {evaluations:,} times, up to {spec.episode_steps:,} "
            f"episode-steps each: {total:,} in all; a job's evaluations may take at most "
            f"{JOB_EVAL_EPISODE_STEPS_MAX:,} episode-steps together: fewer episodes, a lower "
            "max_steps, or at_checkpoints false)",
            "eval.at_checkpoints",
            "over_budget",
        )


def job_eval_value(value: Any) -> JobEval | None:
    """SFTConfig's `eval`: None, or a JobEval whose errors name their field as ``eval.FIELD``."""
    if value is None or isinstance(value, JobEval):
        return value
    try:
        return JobEval.parse(value)
    except ConfigError as error:
        field = f"eval.{error.param}" if error.param else "eval"
        message = error.message.replace(f"bad {error.param}:", f"bad {field}:", 1)
        message = message.replace(f"missing {error.param} ", f"missing {field} ", 1)
        raise ConfigError(message, field, error.code) from None
