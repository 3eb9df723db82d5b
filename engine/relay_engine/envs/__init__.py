"""Simulated environments for closed-loop evaluation, and the harness that runs a policy in them.

Importing this package registers `relay/Dot-v0` with Gymnasium (the synthetic task of
`relay datasets synth`, `relay_engine.envs.dot`), so `gymnasium.make("relay/Dot-v0")` works after
`import relay_engine.envs`; `gymnasium.make("relay_engine.envs:relay/Dot-v0")` imports it itself.

    from relay_engine.envs import evaluate_in_env
    report = evaluate_in_env("pi05-tiny", "relay/Dot-v0", episodes=10, videos="videos/")
    report.success_rate, report.mean_reward, report.mean_length, report.episodes[0]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium

from relay.env_evaluation import JOB_ENV_STEP_LIMITS

DOT_ENV_ID = "relay/Dot-v0"
# Long enough for the expert from any start (at most about 14 steps) and a slower policy; the SDK
# budgets a job's evaluations with it.
DOT_MAX_EPISODE_STEPS = JOB_ENV_STEP_LIMITS[DOT_ENV_ID]

if DOT_ENV_ID not in gymnasium.registry:
    gymnasium.register(
        id=DOT_ENV_ID,
        entry_point="relay_engine.envs.dot:DotEnv",
        max_episode_steps=DOT_MAX_EPISODE_STEPS,
    )

if TYPE_CHECKING:
    from relay_engine.envs.evaluate import EvaluationStopped, evaluate_in_env

__all__ = ["DOT_ENV_ID", "DOT_MAX_EPISODE_STEPS", "EvaluationStopped", "evaluate_in_env"]


def __getattr__(name: str) -> Any:
    # The harness needs torch and the model; registering the environment does not.
    if name in ("evaluate_in_env", "EvaluationStopped"):
        from relay_engine.envs import evaluate

        return getattr(evaluate, name)
    raise AttributeError(f"module 'relay_engine.envs' has no attribute {name!r}")
