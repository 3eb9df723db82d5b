"""The local trainer's API (docs/local-trainer.md) on pi05-tiny."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relay_engine import Trainer, TrainingArguments
from relay_engine.datasets import LeRobotDataset
from relay_engine.errors import ConfigError
from relay_engine.models import load_policy


def test_train_returns_the_mean_loss_and_steps_and_keeps_every_mini_batch_loss(
    synthetic_dataset: LeRobotDataset, tmp_path: Path
) -> None:
    subset = torch.utils.data.Subset(synthetic_dataset, range(20))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=2,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        save_strategy="epoch",
    )
    trainer = Trainer(model=load_policy("pi05-tiny"), args=args, train_dataset=subset)
    result = trainer.train()

    # 20 samples in batches of 8: 3 mini-batches an epoch (8, 8, 4), 2 steps an epoch (2 + 1).
    assert result["steps"] == 4
    assert len(trainer.losses) == 6
    assert result["train_loss"] == pytest.approx(sum(trainer.losses) / 6)
    for epoch in (1, 2):
        assert (tmp_path / f"checkpoint-epoch-{epoch}" / "model.safetensors").is_file()
    tuned = load_policy(str(tmp_path))
    assert tuned.config.model == "pi05-tiny"


def test_max_steps_and_the_same_seed_give_the_same_losses(
    synthetic_dataset: LeRobotDataset, tmp_path: Path
) -> None:
    def losses(directory: Path) -> list[float]:
        args = TrainingArguments(
            output_dir=str(directory), max_steps=3, per_device_train_batch_size=4, seed=7
        )
        trainer = Trainer(model=load_policy("pi05-tiny"), args=args, train_dataset=synthetic_dataset)
        assert trainer.train()["steps"] == 3
        return trainer.losses

    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_the_triton_backend_needs_cuda(tmp_path: Path, synthetic_dataset: LeRobotDataset) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the error is for machines without it")
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, training_backend="triton")
    with pytest.raises(RuntimeError, match="CUDA"):
        Trainer(model=load_policy("pi05-tiny"), args=args, train_dataset=synthetic_dataset)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "exactly one of num_train_epochs and max_steps"),
        ({"max_steps": 0}, "bad max_steps: 0"),
        ({"max_steps": 1, "per_device_train_batch_size": 0}, "bad per_device_train_batch_size: 0"),
        ({"max_steps": 1, "learning_rate": 0.0}, "bad learning_rate"),
        ({"max_steps": 1, "save_strategy": "steps"}, "bad save_strategy"),
    ],
)
def test_bad_arguments_name_the_field(changes: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainingArguments(output_dir=str(tmp_path), **changes)


def test_the_trainer_takes_the_models_own_defaults_where_its_arguments_give_none(tmp_path: Path) -> None:
    # pi05-tiny's defaults (catalog.MODEL_DEFAULTS) are not the spec's (pi05's); the Trainer
    # resolves them as a recipe does, and explicit arguments still win.
    tiny = load_policy("pi05-tiny")
    left_out = Trainer(
        model=tiny, args=TrainingArguments(output_dir=str(tmp_path), max_steps=1), train_dataset=[]
    )
    assert (left_out.learning_rate, left_out.finetune) == (1e-3, "full")
    given = TrainingArguments(output_dir=str(tmp_path), max_steps=1, learning_rate=1e-4, finetune="lora")
    chosen = Trainer(model=load_policy("pi05-tiny"), args=given, train_dataset=[])
    assert (chosen.learning_rate, chosen.finetune) == (1e-4, "lora")


def test_train_shows_progress_on_stderr_unless_disabled(
    synthetic_dataset: LeRobotDataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # stderr is no terminal here: plain lines, the last one the end, with the rate.
    args = TrainingArguments(output_dir=str(tmp_path / "a"), max_steps=20, per_device_train_batch_size=2)
    Trainer(model=load_policy("pi05-tiny"), args=args, train_dataset=synthetic_dataset).train()
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("training  step 20/20  loss ") and "steps/s" in last, last
    quiet = TrainingArguments(output_dir=str(tmp_path / "b"), max_steps=2, disable_tqdm=True)
    Trainer(model=load_policy("pi05-tiny"), args=quiet, train_dataset=synthetic_dataset).train()
    assert capsys.readouterr().err == ""


def test_from_checkpoint_starts_from_those_weights_as_the_models_architecture(
    synthetic_dataset: LeRobotDataset, tmp_path: Path
) -> None:
    """TrainingArguments.from_checkpoint: the weights of a directory (here an earlier run's output),
    bit for bit before the first step, in the architecture of the model given (a meta model is
    only an architecture); a job id or a malformed value is refused naming the field."""
    from safetensors.torch import load_file

    from relay_engine.models import build_policy, exported_state_dict, to_policy_state_dict

    first = TrainingArguments(output_dir=str(tmp_path / "first"), max_steps=2, per_device_train_batch_size=4)
    Trainer(model=load_policy("pi05-tiny"), args=first, train_dataset=synthetic_dataset).train()
    args = TrainingArguments(
        output_dir=str(tmp_path / "second"),
        max_steps=1,
        per_device_train_batch_size=4,
        from_checkpoint=str(tmp_path / "first"),
    )
    trainer = Trainer(
        model=build_policy("pi05-tiny", device="meta"), args=args, train_dataset=synthetic_dataset
    )
    saved = to_policy_state_dict(load_file(str(tmp_path / "first" / "model.safetensors")))
    loaded = exported_state_dict(trainer.model)
    assert set(loaded) == set(saved)
    assert all(torch.equal(loaded[name].float(), saved[name].float()) for name in saved)
    for bad in ("ft-0123456789ab", "not a checkpoint!"):
        with pytest.raises(ConfigError) as refused:
            Trainer(
                model=load_policy("pi05-tiny"),
                args=TrainingArguments(output_dir=str(tmp_path / "third"), max_steps=1, from_checkpoint=bad),
                train_dataset=synthetic_dataset,
            )
        assert refused.value.param == "from_checkpoint"
