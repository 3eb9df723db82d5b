"""`relay models info`: counts on the meta device, clear errors, tensor listing."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from relay.cli import app
from relay_engine.models import build_policy

runner = CliRunner()


def test_info_counts_the_default_lora_of_pi05() -> None:
    result = runner.invoke(app, ["models", "info", "pi05", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["trainable_params"] == 16_026_656
    assert report["total_params"] == 3_353_433_872
    assert report["targets"] == ["action_expert.attn", "action_expert.mlp", "heads"]
    assert report["lora_rank"] == 32 and report["lora_alpha"] == 32.0
    assert report["modules"]["heads"]["trainable"] == 2_165_792
    text = runner.invoke(app, ["models", "info", "pi05"]).output
    assert "16,026,656" in text and "action_expert.attn" in text


def test_info_shows_the_recipe_defaults_of_each_model() -> None:
    # pi05-tiny's own (full fine-tuning at 1e-3, batch 16), and what they train by default.
    report = json.loads(runner.invoke(app, ["models", "info", "pi05-tiny", "--json"]).output)
    assert report["recipe_defaults"] == {
        "finetune": "full",
        "learning_rate": 1e-3,
        "batch_size": 16,
        "steps": 6000,
    }
    assert report["finetune"] == "full" and report["trainable_params"] == report["total_params"]
    text = runner.invoke(app, ["models", "info", "pi05-tiny"]).output
    assert "finetune full, learning_rate 0.001, batch_size 16" in " ".join(text.split())
    pi05 = json.loads(runner.invoke(app, ["models", "info", "pi05", "--json"]).output)
    assert pi05["recipe_defaults"] == {
        "finetune": "lora",
        "learning_rate": 2.5e-5,
        "batch_size": 128,
        "steps": 6000,
    }


def test_info_takes_targets_and_settings() -> None:
    result = runner.invoke(
        app, ["models", "info", "pi05-tiny", "--finetune", "full", "--targets", "vision,heads", "--json"]
    )
    report = json.loads(result.output)
    modules = report["modules"]
    assert report["trainable_params"] == modules["vision"]["params"] + modules["heads"]["params"]


def test_info_rejects_bad_settings_without_a_traceback() -> None:
    result = runner.invoke(app, ["models", "info", "pi05", "--targets", "lm"])
    assert result.exit_code == 1
    assert "unknown target 'lm'" in result.output and "action_expert.attn" in result.output
    assert "Traceback" not in result.output
    assert runner.invoke(app, ["models", "info", "pi05", "--lora-rank", "0"]).exit_code == 1
    assert runner.invoke(app, ["models", "info", "pi05", "--finetune", "half"]).exit_code == 1
    assert runner.invoke(app, ["models", "info", "pi9"]).exit_code == 1


def test_keys_lists_every_tensor(tmp_path: Path) -> None:
    build_policy("pi05-tiny").save_pretrained(tmp_path / "out")
    result = runner.invoke(app, ["models", "info", str(tmp_path / "out"), "--keys", "--json"])
    rows = json.loads(result.output)
    names = {row["name"]: row for row in rows}
    base = "model.paligemma_with_expert.gemma_expert.model.layers.0.self_attn.q_proj"
    assert names[base + ".base_layer.weight"] == {
        "name": base + ".base_layer.weight",
        "shape": [128, 64],
        "trainable": False,
    }
    assert names[base + ".lora_A.default.weight"]["trainable"]
    assert len([r for r in rows if not r["name"].count(".lora_")]) == len(
        build_policy("pi05-tiny").state_dict()
    )
