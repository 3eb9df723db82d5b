"""A closed-loop evaluation's report: a policy run in a simulated environment for N episodes.

The engine's `relay_engine.envs.evaluate_in_env` returns it and `relay eval` prints it (a table,
or with `--json` this model's JSON). It lives in the SDK, beside the other reports shared by the
engine, the service and the CLI, so that anything reading a saved report (`EnvEvalReport.
model_validate_json`) needs no engine.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
