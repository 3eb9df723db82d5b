"""The engine's step: accumulation, skipped steps, custom losses and state, on pi05-tiny."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from relay.optimizer import AdamParams
from relay_engine.datasets import LeRobotDataset
from relay_engine.errors import EngineError
from relay_engine.families.pi05.learner import Pi05Learner
from relay_engine.models import Pi05Batch, flow_matching_loss, load_policy
from relay_engine.tuning import apply_tuning, trainable_state_dict


def make_learner(finetune: str = "lora", seed: int = 0) -> Pi05Learner:
    policy = load_policy("pi05-tiny", seed=0)
    return Pi05Learner(apply_tuning(policy, finetune), seed=seed)


def batch_of(learner: Pi05Learner, dataset: LeRobotDataset, indices: range | list[int]) -> Pi05Batch:
    return learner.model.collate([dataset[i] for i in indices])


def weights_of(learner: Pi05Learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainable_state_dict(learner.model).items()}


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for name in a:
        difference = float((a[name] - b[name]).abs().max())
        assert difference <= atol, f"{name} differs by {difference}"


def test_two_half_batches_then_a_step_equal_one_full_batch_then_a_step(
    synthetic_dataset: LeRobotDataset,
) -> None:
    # Adam divides each gradient element by its own magnitude, so float32 rounding in elements
    # near zero moves weights by up to ~lr * 1e-3; at a fine-tuning rate of 1e-4 that stays
    # inside the 1e-6 we promise.
    whole, halves = make_learner(), make_learner()
    full = batch_of(whole, synthetic_dataset, range(8))
    first = batch_of(halves, synthetic_dataset, range(4))
    second = batch_of(halves, synthetic_dataset, range(4, 8))

    for _ in range(3):  # several steps, so Adam's moments are exercised too
        result = whole.forward_backward(full)
        a, b = halves.forward_backward(first), halves.forward_backward(second)
        assert (a.loss + b.loss) / 2 == pytest.approx(result.loss, abs=1e-6)
        assert a.per_sample + b.per_sample == pytest.approx(result.per_sample, abs=1e-6)
        for p_whole, p_halves in zip(whole.params, halves.params, strict=True):
            if p_whole.grad is not None:  # both hold 8 x the batch's mean gradient until the step
                torch.testing.assert_close(p_halves.grad / 8, p_whole.grad / 8, atol=1e-6, rtol=1e-5)
        step_whole = whole.optim_step(AdamParams(learning_rate=1e-4))
        step_halves = halves.optim_step(AdamParams(learning_rate=1e-4))
        assert step_halves.grad_norm == pytest.approx(step_whole.grad_norm, rel=1e-5)
    assert_same_weights(weights_of(whole), weights_of(halves))


def test_weights_weigh_each_datum_in_the_mean(synthetic_dataset: LeRobotDataset) -> None:
    learner = make_learner()
    batch = batch_of(learner, synthetic_dataset, range(4))
    batch = dataclasses.replace(batch, weights=torch.tensor([1.0, 0.0, 0.0, 3.0]))
    result = learner.forward_backward(batch)
    expected = (result.per_sample[0] + 3 * result.per_sample[3]) / 4
    assert result.loss == pytest.approx(expected, rel=1e-6)
    assert result.weight == 4.0


def test_a_non_finite_gradient_skips_the_step_and_leaves_the_weights(
    synthetic_dataset: LeRobotDataset,
) -> None:
    learner = make_learner()
    before = weights_of(learner)
    batch = batch_of(learner, synthetic_dataset, range(4))
    batch.actions[0, 0, 0] = float("inf")
    learner.forward_backward(batch)
    step = learner.optim_step(AdamParams(learning_rate=1e-3))
    assert step.skipped
    assert_same_weights(before, weights_of(learner), atol=0)
    # The next good batch trains as usual.
    learner.forward_backward(batch_of(learner, synthetic_dataset, range(4)))
    assert not learner.optim_step(AdamParams(learning_rate=1e-3)).skipped
    assert any(not torch.equal(before[k], v) for k, v in weights_of(learner).items())


def test_optim_step_without_gradients_is_refused() -> None:
    with pytest.raises(EngineError, match="call forward_backward first"):
        make_learner().optim_step(AdamParams(learning_rate=1e-3))


def test_forward_reports_the_loss_the_next_forward_backward_gets(synthetic_dataset: LeRobotDataset) -> None:
    learner = make_learner()
    batch = batch_of(learner, synthetic_dataset, range(4))
    evaluated, _ = flow_matching_loss(learner.forward(batch), batch)
    assert learner.forward_backward(batch).loss == pytest.approx(float(evaluated), abs=1e-6)


def test_a_custom_loss_equal_to_the_built_in_one_gives_the_same_gradients(
    synthetic_dataset: LeRobotDataset,
) -> None:
    built_in, custom = make_learner(), make_learner()
    batch = batch_of(built_in, synthetic_dataset, range(6))
    built_in.forward_backward(batch)

    outputs = custom.forward_for_custom_loss(batch)
    # What the client does: its own loss on a leaf copy of the velocity, then d(loss)/d(velocity).
    velocity = outputs.velocity.detach().requires_grad_(True)
    # The built-in loss: the mean over the robot's own columns plus the mean over the padding ones.
    assert batch.action_width is not None
    robot = torch.arange(32)[None, None, :] < batch.action_width[:, None, None]
    error = (velocity - outputs.target).square()
    per_sample = sum(
        (error * part).sum(dim=(1, 2)) / part.sum(dim=(1, 2))
        for part in (batch.action_mask & robot, batch.action_mask & ~robot)
    )
    assert isinstance(per_sample, torch.Tensor)
    loss = per_sample.mean()
    loss.backward()
    custom.backward_custom(outputs, batch, velocity.grad, loss.item(), per_sample.detach().tolist())

    for p_built_in, p_custom in zip(built_in.params, custom.params, strict=True):
        torch.testing.assert_close(p_custom.grad, p_built_in.grad, atol=1e-6, rtol=1e-5)


def test_saved_state_resumes_with_the_same_next_loss(
    synthetic_dataset: LeRobotDataset, tmp_path: Path
) -> None:
    learner = make_learner(seed=5)
    batch = batch_of(learner, synthetic_dataset, range(4))
    for _ in range(2):
        learner.forward_backward(batch)
        learner.optim_step(AdamParams(learning_rate=1e-3))
    learner.save_state(tmp_path)
    continued = copy.deepcopy(learner)
    continued.forward_backward(batch)
    continued.optim_step(AdamParams(learning_rate=1e-3))
    expected = continued.forward_backward(batch).loss

    restored = make_learner(seed=5)
    restored.load_state(tmp_path)
    restored.forward_backward(batch)
    restored.optim_step(AdamParams(learning_rate=1e-3))
    assert restored.forward_backward(batch).loss == pytest.approx(expected, abs=1e-6)
