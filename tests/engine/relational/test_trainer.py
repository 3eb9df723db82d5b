"""The trainer as the product page shows it, with our import path: full fine-tuning from a Hub
checkpoint (served on loopback), per-epoch checkpoints that reload through the constructor, the
backend rules, problem_type from the checkpoint, and head tuning."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from relay_engine.relational import (
    RelationalExample,
    RelationalTrainer,
    RelationalTrainingArguments,
    RelationalTransformer,
    collate,
)
from tests.engine.relational.batches import our_batch
from tests.engine.relational.test_model import scramble
from tests.hub import FakeHub, Repo


def examples_of(count: int, seed: int = 0) -> list[RelationalExample]:
    """One context each, labels from a visible number so there is something to learn."""
    out = []
    for i in range(count):
        batch = our_batch(seed=seed * 1000 + i, batch=1)
        label = float(batch.number_values[0, 4, 0] > 0)
        out.append(RelationalExample(batch, label))
    return out


@pytest.fixture
def hub_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """RelativeDB/rt-j-fp16 on a loopback Hub, laid out as the real repository: a classification
    and a regression checkpoint (rt-j-tiny sizes, in fp16)."""
    repo = tmp_path / "repo"
    for part, problem in (("classification", "binary"), ("regression", "regression")):
        model = RelationalTransformer("rt-j-tiny", device="cpu", seed=1, task=problem)
        model.model.half()
        model.save_pretrained(repo / part)
    with FakeHub() as hub:
        hub.models["RelativeDB/rt-j-fp16"] = Repo.at(repo)
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
        yield hub


def test_full_fine_tuning_as_the_page_shows_it(hub_checkpoint: FakeHub, tmp_path: Path) -> None:
    examples = examples_of(20)
    output_dir = tmp_path / "models" / "customer-churn"

    model = RelationalTransformer("RelativeDB/rt-j-fp16")
    args = RelationalTrainingArguments(
        output_dir=str(output_dir),
        num_train_epochs=3,
        per_device_train_batch_size=8,
        learning_rate=1e-5,
    )
    trainer = RelationalTrainer(model=model, args=args, train_dataset=examples)
    result = trainer.train()

    assert set(result) == {"train_loss", "steps"}
    assert result["steps"] == 3 * math.ceil(20 / 8) == len(trainer.losses)
    assert result["train_loss"] == trainer.losses[-1] and all(math.isfinite(x) for x in trainer.losses)
    assert trainer.problem_type == "binary"
    tuned = RelationalTransformer(str(output_dir))
    batch = collate([e.input for e in examples[:5]])
    torch.testing.assert_close(tuned.target_scores(batch), model.target_scores(batch))
    base = RelationalTransformer("RelativeDB/rt-j-fp16")
    assert not torch.equal(base.target_scores(batch), model.target_scores(batch)), "training changed nothing"


def test_training_lowers_the_loss(tmp_path: Path) -> None:
    examples = examples_of(32)
    model = RelationalTransformer("rt-j-tiny", device="cpu")
    args = RelationalTrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=6,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        save_strategy="no",
        gradient_accumulation_steps=2,
    )
    trainer = RelationalTrainer(model=model, args=args, train_dataset=examples)
    trainer.train()
    first, last = sum(trainer.losses[:4]) / 4, sum(trainer.losses[-4:]) / 4
    assert last < 0.8 * first, trainer.losses
    assert not (tmp_path / "model.safetensors").exists()  # save_strategy="no"


def test_problem_type_follows_the_checkpoint(hub_checkpoint: FakeHub) -> None:
    regression = RelationalTransformer("RelativeDB/rt-j-fp16", task="regression", device="cpu")
    assert regression.problem_type == "regression"
    args = RelationalTrainingArguments(output_dir="unused", save_strategy="no")
    assert (
        RelationalTrainer(model=regression, args=args, train_dataset=examples_of(2)).problem_type
        == "regression"
    )
    classification = RelationalTransformer("RelativeDB/rt-j-fp16", device="cpu")
    assert (
        RelationalTrainer(model=classification, args=args, train_dataset=examples_of(2)).problem_type
        == "binary"
    )
    explicit = RelationalTrainingArguments(output_dir="unused", save_strategy="no", problem_type="regression")
    assert (
        RelationalTrainer(model=classification, args=explicit, train_dataset=examples_of(2)).problem_type
        == "regression"
    )


def test_full_tuning_needs_the_torch_backend() -> None:
    meta = RelationalTransformer("rt-j-tiny", backend="meta")
    with pytest.raises(RuntimeError, match="torch backend"):
        RelationalTrainer(model=meta, args=RelationalTrainingArguments(), train_dataset=examples_of(1))


def test_triton_training_needs_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the rule is for machines without it")
    model = RelationalTransformer("rt-j-tiny", device="cpu")
    args = RelationalTrainingArguments(output_dir="unused", training_backend="triton")
    with pytest.raises(RuntimeError, match="requires CUDA"):
        RelationalTrainer(model=model, args=args, train_dataset=examples_of(1))


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="per_device_train_batch_size"):
        RelationalTrainingArguments(per_device_train_batch_size=0)
    with pytest.raises(ValueError, match="training_backend"):
        RelationalTrainingArguments(training_backend="jax")
    with pytest.raises(ValueError, match="problem_type"):
        RelationalTrainingArguments(problem_type="ranking")


def test_multiclass_head_tuning_saves_the_head_beside_the_model(tmp_path: Path) -> None:
    examples = [
        RelationalExample(
            e.input, int(e.input.number_values[0, 4, 0] > 0.5) + int(e.input.number_values[0, 4, 0] > -0.5)
        )
        for e in examples_of(24)
    ]
    model = RelationalTransformer("rt-j-tiny", device="cpu")
    backbone = {k: v.clone() for k, v in model.model.state_dict().items()}
    args = RelationalTrainingArguments(
        output_dir=str(tmp_path), num_train_epochs=2, learning_rate=1e-2, problem_type="multiclass"
    )
    result = RelationalTrainer(model=model, args=args, train_dataset=examples).train()
    assert result["steps"] == 2 * 3
    assert all(torch.equal(v, model.model.state_dict()[k]) for k, v in backbone.items()), "the backbone moved"
    assert (tmp_path / "heads" / "task" / "head.safetensors").is_file()
    reloaded = RelationalTransformer(str(tmp_path), device="cpu")
    assert reloaded.heads["task"].num_labels == 3
    batch = collate([e.input for e in examples[:4]])
    probabilities = np.asarray(reloaded.predict(batch, task_head="task"))
    assert probabilities.shape == (4, 3)
    torch.testing.assert_close(
        torch.as_tensor(probabilities), torch.as_tensor(model.predict(batch, task_head="task"))
    )


def test_logging_steps_fill_the_log_history(tmp_path: Path) -> None:
    model = RelationalTransformer("rt-j-tiny", device="cpu")
    args = RelationalTrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        logging_steps=3,
        save_strategy="no",
    )
    trainer = RelationalTrainer(model=model, args=args, train_dataset=examples_of(20))
    trainer.train()
    # 5 steps an epoch, 10 in all: a log entry every 3 steps and at the last.
    assert [entry["step"] for entry in trainer.log_history] == [3, 6, 9, 10]
    assert [entry["epoch"] for entry in trainer.log_history] == [0.6, 1.2, 1.8, 2.0]
    windows = [trainer.losses[0:3], trainer.losses[3:6], trainer.losses[6:9], trainer.losses[9:10]]
    for entry, window in zip(trainer.log_history, windows, strict=True):
        assert entry["loss"] == pytest.approx(sum(window) / len(window))
        assert entry["learning_rate"] == pytest.approx(args.learning_rate) and entry["grad_norm"] > 0


def test_save_strategy_steps_writes_a_checkpoint_every_save_steps(tmp_path: Path) -> None:
    examples = examples_of(20)
    model = RelationalTransformer("rt-j-tiny", device="cpu")
    scramble(model.model, seed=9)
    args = RelationalTrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=5,
    )
    RelationalTrainer(model=model, args=args, train_dataset=examples).train()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-5"]
    batch = collate([e.input for e in examples[:4]])
    last = RelationalTransformer(str(tmp_path / "checkpoint-10"), device="cpu")
    torch.testing.assert_close(last.target_scores(batch), model.target_scores(batch))
    halfway = RelationalTransformer(str(tmp_path / "checkpoint-5"), device="cpu")
    assert not torch.equal(halfway.target_scores(batch), last.target_scores(batch))


def test_forecasting_trains_as_regression_and_is_saved_as_forecasting(tmp_path: Path) -> None:
    examples = [RelationalExample(e.input, float(e.input.number_values[0, 4, 0])) for e in examples_of(12)]
    losses = {}
    for problem in ("regression", "forecasting"):
        model = RelationalTransformer("rt-j-tiny", device="cpu")
        scramble(model.model, seed=10)
        args = RelationalTrainingArguments(
            output_dir=str(tmp_path / problem),
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            problem_type=problem,
        )
        trainer = RelationalTrainer(model=model, args=args, train_dataset=examples)
        trainer.train()
        losses[problem] = trainer.losses
    assert losses["forecasting"] == losses["regression"]  # Huber loss for both
    reloaded = RelationalTransformer(str(tmp_path / "forecasting"), device="cpu")
    assert reloaded.problem_type == "forecasting"
    batch = collate([e.input for e in examples[:3]])
    # A forecast is a value: predict applies no sigmoid.
    np.testing.assert_allclose(reloaded.predict(batch), reloaded.target_scores(batch).numpy())


def test_bad_logging_and_save_steps_name_the_field() -> None:
    with pytest.raises(ValueError, match="logging_steps"):
        RelationalTrainingArguments(logging_steps=0)
    with pytest.raises(ValueError, match="save_steps"):
        RelationalTrainingArguments(save_strategy="steps", save_steps=0)
    with pytest.raises(ValueError, match="save_strategy"):
        RelationalTrainingArguments(save_strategy="best")
