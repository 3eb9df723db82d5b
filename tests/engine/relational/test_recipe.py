"""RT-J recipe jobs in the engine: the shared loop's events, checkpoints and exact resume, the
output reloading as an RT-J model, and `relay local eval` on a task's split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from relay.cli import app
from relay.sft.config import SFTConfig
from relay_engine.families.rtj.synth import write_fake_shop
from relay_engine.recipe import Recipe, run_recipe
from relay_engine.relational import RelationalTransformer


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_shop(tmp_path_factory.mktemp("shop"), customers=40, reviews=240)


def recipe(shop: Path, **fields: Any) -> Recipe:
    settings = {"batch_size": 8, "steps": 6, "learning_rate": 1e-3, **fields}
    config = SFTConfig(model="rt-j-tiny", dataset_name=str(shop), task="user-churn", **settings)
    return Recipe.from_config(config, checkpoint_every=2, log_every=2, device="cpu")


def test_a_stopped_job_resumes_exactly(shop: Path, tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    whole = run_recipe(recipe(shop), tmp_path / "whole", on_event=events.append, should_stop=lambda: False)
    assert whole.status == "completed" and whole.step == 6 and whole.output_dir is not None
    assert [e["step"] for e in events if e.get("event") == "checkpoint"] == [2, 4, 6]
    assert [e["step"] for e in events if "loss" in e] == [2, 4, 6]

    seen: list[dict[str, Any]] = []
    stop_after_4 = lambda: any(e.get("event") == "checkpoint" and e["step"] == 4 for e in seen)  # noqa: E731
    first = run_recipe(recipe(shop), tmp_path / "split", on_event=seen.append, should_stop=stop_after_4)
    assert first.status == "stopped" and first.step == 4
    second = run_recipe(recipe(shop), tmp_path / "split", on_event=seen.append, should_stop=lambda: False)
    assert second.status == "completed" and second.resumed_from == 4

    a = load_file(str(whole.output_dir / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "output" / "model.safetensors"))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a), "the resumed run differs"
    assert second.loss == whole.loss

    tuned = RelationalTransformer(str(whole.output_dir), device="cpu")
    assert tuned.problem_type == "binary" and tuned.config["relay"]["task"] == "user-churn"


def test_a_changed_recipe_does_not_resume(shop: Path, tmp_path: Path) -> None:
    run_recipe(recipe(shop, steps=2), tmp_path, on_event=lambda e: None, should_stop=lambda: False)
    with pytest.raises(ValueError, match="different recipe"):
        run_recipe(recipe(shop, steps=3), tmp_path, on_event=lambda e: None, should_stop=lambda: False)


def test_local_eval_reports_auroc_and_the_baseline(shop: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["local", "eval", "--model", "rt-j-tiny", "--dataset", str(shop), "--task", "user-churn", "--json"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["split"] == "val" and report["problem_type"] == "binary"
    assert report["auroc"] == 0.5  # a fresh RT-J scores every context 0
    assert 0 <= report["label_frequency_auroc"] <= 1
    regression = CliRunner().invoke(
        app, ["local", "eval", "--model", "rt-j-tiny", "--dataset", str(shop), "--task", "user-ltv", "--json"]
    )
    assert regression.exit_code == 0, regression.output
    figures = json.loads(regression.stdout.strip().splitlines()[-1])
    assert figures["mae"] > 0 and figures["nmae"] == pytest.approx(figures["mae"] / _train_std(shop))
    # The median baseline, by hand: the train split's median label for every val row.
    train, val = (_labels(shop, "user-ltv", "ltv", split) for split in ("train", "val"))
    assert figures["median_baseline_mae"] == pytest.approx(float(np.abs(val - np.median(train)).mean()))
    assert figures["below_baseline"] == (figures["mae"] > figures["median_baseline_mae"])


def test_local_eval_says_when_the_model_is_below_the_baseline(shop: Path) -> None:
    """A fresh RT-J scores every context 0 (AUROC 0.5); the fake shop's churners churn again, so each
    customer's past label frequency ranks the val rows better, and the report says the model is below."""
    args = ["local", "eval", "--model", "rt-j-tiny", "--dataset", str(shop), "--task", "user-churn"]
    report = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout.strip().splitlines()[-1])
    assert report["label_frequency_auroc"] > 0.5 and report["below_baseline"] is True
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Below the baseline: the model ranks the rows worse than each entity's past label" in result.output


def _labels(shop: Path, task: str, column: str, split: str) -> np.ndarray:
    import pyarrow.parquet as pq

    table = pq.read_table(shop / "tasks" / task / f"{split}.parquet")
    return np.asarray(table.column(column).to_pylist(), float)


def _train_std(shop: Path) -> float:
    return float(np.std(_labels(shop, "user-ltv", "ltv", "train")))


def test_local_train_refuses_fields_of_the_other_family(shop: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "local",
            "train",
            "--model",
            "rt-j-tiny",
            "--dataset",
            str(shop),
            "--task",
            "user-churn",
            "--output-dir",
            str(tmp_path),
            "--camera",
            "base_0_rgb=cam",
        ],
    )
    assert result.exit_code == 1
    assert "bad cameras" in result.output and "not camera images" in result.output


def test_datasets_check_and_stats_understand_databases(tmp_path: Path) -> None:
    runner = CliRunner()
    made = runner.invoke(
        app, ["datasets", "synth-db", str(tmp_path / "db"), "--customers", "20", "--reviews", "100"]
    )
    assert made.exit_code == 0, made.output
    checked = runner.invoke(app, ["datasets", "check", str(tmp_path / "db")])
    assert checked.exit_code == 0, checked.output
    assert "can be trained on (rt-j)" in checked.output and "task user-churn (binary" in checked.output
    stats = runner.invoke(app, ["datasets", "stats", str(tmp_path / "db"), "--json"])
    report = json.loads(stats.stdout)
    assert report["columns"]["customer"]["age"]["type"] == "number"
    assert report["tasks"]["user-ltv"]["splits"]["train"]["label_std"] > 0

    (tmp_path / "db" / "tasks" / "user-churn" / "train.parquet").unlink()
    broken = runner.invoke(app, ["datasets", "check", str(tmp_path / "db")])
    assert broken.exit_code == 1 and "task user-churn has no train split" in broken.output
