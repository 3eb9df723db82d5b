"""`relay eval`: run a policy in a simulated environment and report its success rate.

The engine does the work (`relay_engine.envs.evaluate_in_env`), imported when the command runs,
so the CLI keeps working with the SDK alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from relay.cli._common import fail, out, show_table
from relay.cli._extras import require
from relay.env_evaluation import EnvEvalReport, EpisodeRecord
from relay.formatting import duration_text
from relay.progress import ProgressReport


def evaluate(
    model: str = typer.Argument(
        ..., help="A base model's name (pi05-tiny), a model directory or a job's output directory."
    ),
    env: str = typer.Option(..., "--env", help="A Gymnasium environment id, like relay/Dot-v0."),
    episodes: int = typer.Option(10, help="How many episodes to run."),
    max_steps: int | None = typer.Option(
        None, help="An episode's limit in environment steps (default: the environment's)."
    ),
    seed: int = typer.Option(0, help="Episode k is reset with seed + k."),
    videos: Path | None = typer.Option(None, help="Write mp4s of the first episodes into this directory."),
    video_episodes: int = typer.Option(4, help="How many of the first episodes get a video."),
    num_envs: int | None = typer.Option(
        None, help="Environments stepped at once, one batched forward pass (default: min(episodes, 8))."
    ),
    async_envs: bool = typer.Option(
        False, "--async-envs", help="Step each environment in a process of its own (slow simulators)."
    ),
    actions_per_chunk: int | None = typer.Option(
        None, help="Actions executed from each sampled chunk (default: half the model's chunk)."
    ),
    env_option: list[str] = typer.Option(
        [],
        "--env-option",
        help="KEY=VALUE for the environment's constructor, repeatable; the value is read as JSON "
        "when it is JSON (colours='[\"orange\"]', distractors=2), else as text.",
    ),
    norm_stats: Path | None = typer.Option(
        None,
        help="The normalization: a norm_stats.json, a model or a dataset directory "
        "(default: the model's norm_stats.json, else the environment's defaults).",
    ),
    prompt: str | None = typer.Option(
        None, help="The task given to the policy (default: the episode's own, else the mapping's)."
    ),
    num_steps: int = typer.Option(10, help="Euler steps of the sampler."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    json_output: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Run MODEL in a Gymnasium environment for N episodes: success rate, reward, episode length."""
    options = _env_options(env_option)
    envs = require("relay_engine.envs")
    errors = require("relay_engine.errors")
    progress = _EpisodeProgress(episodes, shown=not json_output)
    try:
        report = envs.evaluate_in_env(
            model,
            env,
            episodes=episodes,
            max_steps=max_steps,
            seed=seed,
            videos=videos,
            video_episodes=video_episodes,
            num_envs=num_envs,
            asynchronous=async_envs,
            actions_per_chunk=actions_per_chunk,
            env_options=options,
            norm_stats=norm_stats,
            prompt=prompt,
            num_steps=num_steps,
            device=device,
            on_episode=progress.update,
        )
    except (errors.EngineError, ValueError) as error:
        fail(str(error))
    finally:
        progress.close()
    if json_output:
        print(report.model_dump_json())
        return
    show_report(report)


def _env_options(pairs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--env-option")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def show_report(report: EnvEvalReport) -> None:
    """One row per episode, then the totals."""
    table = Table(title=f"{escape(report.model)} in {escape(report.env_id)}")
    for column in ("episode", "seed", "success", "reward", "max reward", "length", "video"):
        table.add_column(column, justify="right" if column not in ("success", "video") else "left")
    for record in report.episodes:
        table.add_row(
            str(record.episode),
            str(record.seed),
            "[green]yes[/green]" if record.success else "[red]no[/red]",
            f"{record.reward:.3g}",
            f"{record.max_reward:.3g}",
            str(record.length),
            escape(record.video or ""),
        )
    show_table(table, json_hint=True)
    successes = sum(record.success for record in report.episodes)
    out.print(
        f"success rate {report.success_rate:.0%} ({successes} of {len(report.episodes)}), "
        f"mean reward {report.mean_reward:.3g}, mean length {report.mean_length:.1f} steps; "
        f"{report.steps} steps in {duration_text(report.seconds)} ({report.steps_per_second:.1f} steps/s, "
        f"{report.num_envs} environments, {report.actions_per_chunk} actions per chunk)",
        highlight=False,
    )


class _EpisodeProgress:
    """Episodes done, on stderr, as the other long commands show progress (from the first one on:
    loading the model and the environments comes before)."""

    def __init__(self, episodes: int, shown: bool) -> None:
        self.episodes = episodes
        self.shown = shown
        self.report: ProgressReport | None = None
        self.done = 0

    def update(self, record: EpisodeRecord) -> None:
        self.done += 1
        if not self.shown:
            return
        if self.report is None:
            self.report = ProgressReport("evaluating", self.episodes, stream=sys.stderr, unit="episode")
        self.report.update(self.done)

    def close(self) -> None:
        if self.report is not None:
            self.report.close()
