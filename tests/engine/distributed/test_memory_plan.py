"""`relay models info --memory`: the per-GPU plan, counted without allocating anything."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay_engine.distributed.memory import plan_memory
from relay_engine.models import build_policy
from relay_engine.tuning import apply_tuning

PARTS = ("weights", "gradients", "optimizer", "activations", "overhead")


def plan(finetune: str, gpus: int, batch_size: int = 8, strategy: str = "auto") -> dict[str, int]:
    policy = apply_tuning(build_policy("pi05-tiny", device="meta"), finetune)
    return plan_memory(policy, batch_size=batch_size, gpus=gpus, strategy=strategy).to_dict()


def test_the_cli_prints_every_part_and_the_smallest_gpu() -> None:
    done = CliRunner().invoke(
        app,
        [
            "models",
            "info",
            "pi05-tiny",
            "--finetune",
            "full",
            "--batch-size",
            "8",
            "--gpus",
            "2",
            "--memory",
            "--json",
        ],
    )
    assert done.exit_code == 0, done.output
    printed = json.loads(done.output)
    assert printed["strategy"] == "fsdp" and printed["per_gpu_batch"] == 4
    assert printed["total"] == sum(printed[part] for part in PARTS)
    assert all(printed[part] > 0 for part in PARTS)
    assert printed["smallest_gpu"].startswith("24 GB")


def test_sharding_divides_the_full_model_and_ddp_does_not() -> None:
    one, four = plan("full", 1), plan("full", 4)
    # FSDP: each GPU keeps a quarter of the moments (AdamW's two fp32 copies of every weight).
    assert four["optimizer"] == pytest.approx(one["optimizer"] / 4, rel=0.01)
    assert four["activations"] < one["activations"]  # 2 samples a GPU instead of 8
    lora_one, lora_four = plan("lora", 1), plan("lora", 4)
    assert lora_four["weights"] == lora_one["weights"] and lora_four["optimizer"] == lora_one["optimizer"]


def test_bad_flags_name_the_flag_and_the_rule() -> None:
    done = CliRunner().invoke(
        app, ["models", "info", "pi05-tiny", "--memory", "--batch-size", "4", "--gpus", "8"]
    )
    assert done.exit_code == 1
    assert "bad --gpus: 8 (must be at most --batch-size, 4" in done.output
