"""One recipe on 2 processes (torch.distributed.run, gloo on the CPU) trains as it does on 1.

One launch of 2 processes runs every 2-process recipe here (starting processes is the slow part);
the 1-process runs happen in the test process. Compared: every step's loss (within 1e-5), the
merged weights (within 1e-5), resuming on the same number of processes, resharding a checkpoint
from 2 processes to 1 and from 1 to 2, and (full fine-tuning, under FSDP) the validation split's
scores, which every process computes in step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from relay.sft.config import SFTConfig
from relay_engine import Trainer, TrainingArguments
from relay_engine.core.checkpoint import POINTER, CheckpointStore, write_atomic
from relay_engine.datasets import open_dataset
from relay_engine.models import load_policy
from relay_engine.recipe import Recipe, run_recipe

STEPS = 4
CHECKPOINT_EVERY = 2
TOLERANCE = 1e-5
# Gradient norms after a few AdamW steps: one process and two round differently (their matmuls run
# on different thread counts), and Adam turns that into small weight differences. Seen: 2.1e-5
# relative at step 3 in one whole-suite run, under 1e-5 in others. A wrong reduction (a rank's
# samples weighed wrongly) is off by percents.
GRAD_NORM_TOLERANCE = 1e-4
LEARNING_RATE = 1e-3
# Full fine-tuning's share of weights where AdamW turns rounding noise into steps (see assert_same_weights).
FULL_NOISE_SHARE = 1e-3
# LoRA's share: fewer weights train, but the expert's own (time_mlp_in) can meet the same noise. Seen:
# 2 of 528,576 elements off by 1.1e-4 (a tenth of a step) once pi05's camera images were rounded to
# uint8 after their resize, which changed the inputs. A wrong reduction moves nearly every weight.
LORA_NOISE_SHARE = 1e-5
RUN_RECIPES = Path(__file__).with_name("run_recipes.py")


def recipe_for(dataset: Path, finetune: str) -> Recipe:
    config = SFTConfig(
        model="pi05-tiny",
        dataset_name=str(dataset),
        # 5 does not split evenly: one process reads 3 samples a step, the other 2.
        batch_size=5 if finetune == "lora" else 4,
        learning_rate=LEARNING_RATE,
        steps=STEPS,
        finetune=finetune,
        # Sharded weights need every process in each forward pass: FSDP's runs score a split.
        validation_episodes=[7] if finetune == "full" else None,
    )
    return Recipe.from_config(
        config,
        checkpoint_every=CHECKPOINT_EVERY,
        log_every=1,
        num_workers=0,
    )


def rewind(source: Path, target: Path, step: int) -> Path:
    """A copy of a run's directory whose last checkpoint is `step` (as if it had stopped there)."""
    shutil.copytree(source / "checkpoints", target / "checkpoints")
    store = CheckpointStore(target / "checkpoints")
    for path in store.complete():
        if int(path.name.removeprefix("step-")) > step:
            shutil.rmtree(path)
    write_atomic(target / "checkpoints" / POINTER, store.name_of(step).encode())
    return target


def noise(kind: str) -> float:
    return FULL_NOISE_SHARE if kind == "full" else LORA_NOISE_SHARE


def run_here(recipe: Recipe, work_dir: Path, cache: Path) -> tuple[Any, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    result = run_recipe(
        recipe, work_dir, on_event=events.append, should_stop=lambda: False, dataset_cache_dir=cache
    )
    return result, events


def assert_same_weights(expected_dir: Path, actual_dir: Path, *, noise_share: float = 0.0) -> None:
    """Every merged weight within 1e-5, but for at most `noise_share` of the elements.

    Those are elements whose gradient is rounding noise (SigLIP's key biases have a gradient of
    exactly zero in exact arithmetic: softmax ignores a shift shared by all keys). AdamW divides
    a gradient by its own running size, so noise there moves a weight by up to the learning rate
    a step, in whichever direction the rounding of each run's sums happens to point.
    """
    expected = load_file(str(expected_dir / "model.safetensors"))
    actual = load_file(str(actual_dir / "model.safetensors"))
    assert expected.keys() == actual.keys()
    off = total = 0
    where: list[str] = []
    for name, tensor in expected.items():
        difference = (actual[name] - tensor).abs()
        assert float(difference.max()) <= 2 * LEARNING_RATE * STEPS, name
        differing = int((difference > TOLERANCE).sum())
        if differing:
            where.append(f"{name} ({differing}, up to {float(difference.max()):.2e})")
        off += differing
        total += tensor.numel()
    assert off <= noise_share * total, (
        f"{off} of {total} weights differ by more than {TOLERANCE}: {', '.join(where)}"
    )


def assert_same_losses(expected: list[dict[str, Any]], actual: list[dict[str, Any]], steps: range) -> None:
    """The same loss and gradient norm at every step."""
    by_step = {e["step"]: e for e in expected if "loss" in e}
    got = {e["step"]: e for e in actual if "loss" in e}
    assert sorted(got) == list(steps)
    for step in steps:
        assert got[step]["loss"] == pytest.approx(by_step[step]["loss"], abs=TOLERANCE), f"step {step}"
        assert got[step]["grad_norm"] == pytest.approx(by_step[step]["grad_norm"], rel=GRAD_NORM_TOLERANCE), (
            f"step {step}"
        )


@pytest.fixture(scope="module")
def runs(
    synthetic_dataset_path: Path, dataset_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("distributed")
    lora, full = recipe_for(synthetic_dataset_path, "lora"), recipe_for(synthetic_dataset_path, "full")
    alone: dict[str, Any] = {
        "lora": run_here(lora, root / "lora-1", dataset_cache),
        "full": run_here(full, root / "full-1", dataset_cache),
    }
    rewind(root / "full-1", root / "full-1to2", CHECKPOINT_EVERY)

    plan_runs = [
        ("lora", lora, root / "lora-2", None),
        ("lora-stopped", lora, root / "lora-2-stopped", 3),
        ("lora-resumed", lora, root / "lora-2-stopped", None),
        ("full", full, root / "full-2", None),
        ("lora-fsdp", replace(lora, strategy="fsdp"), root / "lora-fsdp-2", None),
        ("full-1to2", full, root / "full-1to2", None),
    ]
    trainer_args = {
        "max_steps": 2,
        "learning_rate": LEARNING_RATE,
        "finetune": "lora",  # pi05-tiny's own default is full; this test is of LoRA under DDP
        "seed": 5,
        "logging_steps": 1,
    }
    plan = {
        "cache": str(dataset_cache),
        "trainer": {
            "dataset": str(synthetic_dataset_path),
            "args": {**trainer_args, "output_dir": str(root / "trainer-2"), "per_device_train_batch_size": 2},
            "result": str(root / "trainer-2.json"),
        },
        "runs": [
            {
                "recipe": recipe.to_dict(),
                "work_dir": str(work),
                "stop_after": stop,
                "events": str(root / f"{name}.json"),
            }
            for name, recipe, work, stop in plan_runs
        ],
    }
    (root / "plan.json").write_text(json.dumps(plan))
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RELAY_COLLECTIVE_TIMEOUT_S": "120"}
    done = subprocess.run(
        [*launch, str(RUN_RECIPES), str(root / "plan.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    two = {name: json.loads((root / f"{name}.json").read_text()) for name, *_ in plan_runs}

    # Resharded the other way: the 2-process runs' step-3 checkpoints resumed by one process.
    resharded = {
        kind: run_here(
            recipe, rewind(root / f"{kind}-2", root / f"{kind}-2to1", CHECKPOINT_EVERY), dataset_cache
        )
        for kind, recipe in (("lora", lora), ("full", full))
    }
    # The local trainer alone, with the mini-batch that 2 processes of 2 samples each read.
    trainer = Trainer(
        model=load_policy("pi05-tiny"),
        args=TrainingArguments(
            **trainer_args, output_dir=str(root / "trainer-1"), per_device_train_batch_size=4
        ),
        train_dataset=open_dataset(str(synthetic_dataset_path), cache_dir=dataset_cache),
    )
    trainer.train()
    return {
        "root": root,
        "alone": alone,
        "two": two,
        "resharded": resharded,
        "trainer": (trainer.losses, json.loads((root / "trainer-2.json").read_text())),
    }


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_two_processes_train_as_one(runs: dict[str, Any], kind: str) -> None:
    """DDP (LoRA) and FSDP (full): the same per-step losses and merged weights as one process."""
    alone_result, alone_events = runs["alone"][kind]
    two = runs["two"][kind]
    assert two["result"]["status"] == "completed"
    assert_same_losses(alone_events, two["events"], range(1, STEPS + 1))
    assert_same_weights(
        alone_result.output_dir, runs["root"] / f"{kind}-2" / "output", noise_share=noise(kind)
    )


def test_two_processes_resume_loss_exactly(runs: dict[str, Any]) -> None:
    stopped, resumed = runs["two"]["lora-stopped"], runs["two"]["lora-resumed"]
    assert stopped["result"]["status"] == "stopped" and stopped["result"]["step"] == 3
    assert resumed["result"]["resumed_from"] == CHECKPOINT_EVERY
    expected = runs["alone"]["lora"][1]
    assert_same_losses(expected, resumed["events"], range(CHECKPOINT_EVERY + 1, STEPS + 1))
    assert_same_weights(
        runs["alone"]["lora"][0].output_dir,
        runs["root"] / "lora-2-stopped" / "output",
        noise_share=LORA_NOISE_SHARE,
    )


def test_a_checkpoint_of_one_process_resumes_on_two(runs: dict[str, Any]) -> None:
    resumed = runs["two"]["full-1to2"]
    assert resumed["result"]["resumed_from"] == CHECKPOINT_EVERY
    alone_result, alone_events = runs["alone"]["full"]
    assert_same_losses(alone_events, resumed["events"], range(CHECKPOINT_EVERY + 1, STEPS + 1))
    assert_same_weights(
        alone_result.output_dir, runs["root"] / "full-1to2" / "output", noise_share=FULL_NOISE_SHARE
    )


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_a_checkpoint_of_two_processes_resumes_on_one(runs: dict[str, Any], kind: str) -> None:
    result, events = runs["resharded"][kind]
    assert result.resumed_from == CHECKPOINT_EVERY
    manifest = CheckpointStore.manifest(runs["root"] / f"{kind}-2" / "checkpoints" / "step-00000002")
    assert manifest["world_size"] == 2
    alone_result, alone_events = runs["alone"][kind]
    assert_same_losses(alone_events, events, range(CHECKPOINT_EVERY + 1, STEPS + 1))
    assert_same_weights(alone_result.output_dir, result.output_dir, noise_share=noise(kind))


def test_the_trainer_under_torchrun_trains_as_one_process(runs: dict[str, Any]) -> None:
    """2 processes of per_device_train_batch_size 2 make the steps of one process with 4."""
    alone_losses, two = runs["trainer"]
    assert two["result"]["steps"] == 2
    assert two["losses"] == pytest.approx(alone_losses, abs=TOLERANCE)
    # A handful of weights with a near-zero gradient (one element of time_mlp_in, measured) may
    # take AdamW's noise step; see assert_same_weights.
    assert_same_weights(runs["root"] / "trainer-1", runs["root"] / "trainer-2", noise_share=1e-5)


def test_two_processes_score_the_validation_split_as_one(runs: dict[str, Any]) -> None:
    """FSDP: both processes score the held-out frames in step; rank 0 reports what one process does."""
    alone = [e for e in runs["alone"]["full"][1] if e.get("event") == "validation"]
    two = [e for e in runs["two"]["full"]["events"] if e.get("event") == "validation"]
    assert [e["step"] for e in alone] == [e["step"] for e in two] == [CHECKPOINT_EVERY, STEPS]
    for expected, got in zip(alone, two, strict=True):
        assert got["frames"] == expected["frames"] and got["blind_mse"] == expected["blind_mse"]
        assert got["chunks"] == expected["chunks"]
        for figure in ("validation_loss", "mean_action_mse", "action_mse"):
            assert got[figure] == pytest.approx(expected[figure], rel=1e-3), figure
    resumed = [e["step"] for e in runs["two"]["full-1to2"]["events"] if e.get("event") == "validation"]
    assert resumed == [STEPS]


def test_the_strategy_can_be_chosen(runs: dict[str, Any]) -> None:
    """LoRA under FSDP (--strategy fsdp) trains as LoRA under DDP, and as one process."""
    alone_result, alone_events = runs["alone"]["lora"]
    assert_same_losses(alone_events, runs["two"]["lora-fsdp"]["events"], range(1, STEPS + 1))
    assert_same_weights(
        alone_result.output_dir, runs["root"] / "lora-fsdp-2" / "output", noise_share=LORA_NOISE_SHARE
    )
