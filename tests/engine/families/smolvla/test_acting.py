"""SmolVLA acting on observations: a recipe's eval block runs the policy as it trains in
relay/Dot-v0, and `relay eval` runs a job's output there, reading its cameras by name and
normalizing by its own mean and std; a base by name is refused with what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay.env_evaluation import EnvEvalReport
from relay.events import eval_report_path
from relay.sft.config import SFTConfig
from relay_engine.datasets import NormStats, write_synthetic_dataset
from relay_engine.envs import evaluate_in_env
from relay_engine.errors import ConfigError
from relay_engine.recipe import Recipe, run_recipe

pytestmark = pytest.mark.slow


def test_a_job_s_eval_block_and_relay_eval_run_a_tuned_smolvla(tmp_path: Path) -> None:
    dataset = write_synthetic_dataset(tmp_path / "dataset", episodes=4, episode_length=(6, 8), seed=4)
    block = {"env": "relay/Dot-v0", "episodes": 2, "max_steps": 5, "videos": 1}
    config = SFTConfig.parse(
        {"model": "smolvla-tiny", "dataset_name": str(dataset), "steps": 3, "batch_size": 2, "eval": block}
    )
    events: list[dict[str, object]] = []
    result = run_recipe(Recipe(config), tmp_path / "run", on_event=events.append, should_stop=lambda: False)
    assert result.status == "completed"
    evaluated = [e for e in events if e.get("event") == "eval"]
    assert len(evaluated) == 1 and evaluated[0]["step"] == 3 and evaluated[0]["episodes"] == 2
    report = EnvEvalReport.model_validate_json((tmp_path / "run" / eval_report_path(3)).read_text())
    assert report.max_steps == 5 and len(report.episodes) == 2
    # The output says it is normalized by mean and std, and acting reads it so.
    stats = NormStats.from_json((result.output_dir / "norm_stats.json").read_text())
    assert stats.method == "mean_std"

    scored = CliRunner().invoke(
        app,
        ["eval", str(result.output_dir), "--env", "relay/Dot-v0", "--episodes", "2", "--max-steps", "5",
         "--json"],
    )  # fmt: skip
    assert scored.exit_code == 0, scored.output
    assert json.loads(scored.output.strip().splitlines()[-1])["episodes"][0]["length"] <= 5

    with pytest.raises(ConfigError, match="smolvla-tiny acts once a job has tuned it"):
        evaluate_in_env("smolvla-tiny", "relay/Dot-v0", episodes=1, max_steps=2)
