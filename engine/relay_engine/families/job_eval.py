"""A recipe's `eval` block on a robot policy (pi05's, SmolVLA's): the policy as it trains, run in a
simulated environment at the end of the job (and at each checkpoint if asked) by `relay eval`'s
harness (relay_engine.envs).

The report goes into the work directory as the job's files (`eval/step-N.json`, the first
episodes' videos under `eval/step-N/`) and comes back as an EvalEvent. The policy is scored in the
units it trains in: the dataset's normalization stats, which the output's norm_stats.json holds too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from relay.env_evaluation import JobEval
from relay.events import EvalEvent, eval_report_path, eval_videos_dir
from relay_engine.acting import ActingPolicy
from relay_engine.datasets import NormStats


class JobEvaluator:
    """`evaluator(step, should_stop)` -> an EvalEvent, its report and videos written under
    `work_dir`; None when `should_stop()` turned true between two environment steps."""

    def __init__(
        self,
        policy: ActingPolicy,
        norm_stats: NormStats,
        spec: JobEval,
        work_dir: Path,
        context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        self.policy = policy
        self.norm_stats = norm_stats
        self.spec = spec
        self.work_dir = work_dir
        self.context = context  # where the policy runs as it trains (the learner's autocast)

    def __call__(self, step: int, should_stop: Callable[[], bool] = lambda: False) -> EvalEvent | None:
        from relay_engine.envs import EvaluationStopped, evaluate_in_env

        report_file = self.work_dir / eval_report_path(step)
        videos = self.work_dir / eval_videos_dir(step)
        shutil.rmtree(videos, ignore_errors=True)  # a resumed attempt's half-written videos
        try:
            with self.context():
                report = evaluate_in_env(
                    self.policy,
                    self.spec.env,
                    episodes=self.spec.episodes,
                    max_steps=self.spec.max_steps,
                    seed=self.spec.seed,
                    videos=videos if self.spec.videos else None,
                    video_episodes=min(self.spec.videos, self.spec.episodes),
                    norm_stats=self.norm_stats,
                    should_stop=should_stop,
                )
        except EvaluationStopped:
            shutil.rmtree(videos, ignore_errors=True)  # no report: its videos are no step's files
            return None
        # Paths among the job's files, not this machine's.
        episodes = [
            record.model_copy(update={"video": f"{eval_videos_dir(step)}/{Path(record.video).name}"})
            if record.video
            else record
            for record in report.episodes
        ]
        report = report.model_copy(update={"model": f"step {step}", "episodes": episodes})
        # The report last, whole (a rename): its presence says the step's files are complete.
        report_file.parent.mkdir(parents=True, exist_ok=True)
        partial = report_file.with_suffix(".json.partial")
        partial.write_text(report.model_dump_json(indent=1))
        os.replace(partial, report_file)
        return EvalEvent(
            step=step,
            env=report.env_id,
            success_rate=report.success_rate,
            mean_reward=report.mean_reward,
            mean_length=report.mean_length,
            episodes=len(report.episodes),
            seconds=report.seconds,
            videos=[record.video for record in episodes if record.video],
        )
