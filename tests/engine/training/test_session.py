"""A training-loop session's model (the worker side of docs/sessions.md), on pi05-tiny."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from relay.optimizer import AdamParams
from relay_engine.errors import EngineError
from relay_engine.families.pi05.session import SessionSpec, TrainingSession

HORIZON = 10


def datum(seed: int, *, size: int = 48, wrist: bool = True, **changes: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    image = {"base_0_rgb": rng.integers(0, 255, (size, size, 3), dtype=np.uint8)}
    if wrist:
        image["left_wrist_0_rgb"] = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
    item: dict[str, Any] = {
        "observation": {"image": image, "state": rng.uniform(-1, 1, 6).astype(np.float32), "prompt": "pick"},
        "actions": rng.uniform(-1, 1, (HORIZON, 6)).astype(np.float32),
        "weight": 1.0,
    }
    item.update(changes)
    return item


@pytest.fixture(scope="module")
def session() -> TrainingSession:
    return TrainingSession(SessionSpec(base_model="pi05-tiny"))


def test_info_counts_the_trainable_parameters(session: TrainingSession) -> None:
    info = session.info
    assert info["model"] == "pi05-tiny" and info["action_horizon"] == HORIZON and info["action_dim"] == 32
    assert info["trainable_params"] == sum(p.numel() for p in session.learner.params) > 0


def test_a_step_reports_the_loss_per_datum_and_the_gradient_norm(session: TrainingSession) -> None:
    result = session.forward_backward([datum(0), datum(1), datum(2, wrist=False)])
    assert len(result["loss_fn_outputs"]) == 3
    assert result["metrics"]["loss"] == pytest.approx(np.mean([o["loss"] for o in result["loss_fn_outputs"]]))
    step = session.optim_step(AdamParams(learning_rate=1e-3))
    assert step["metrics"]["grad_norm"] > 0 and step["metrics"]["skipped"] is False


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (datum(1, actions=np.zeros((HORIZON, 40), np.float32)), "datum 1: actions must be"),
        (datum(1, actions=np.zeros((4, 6), np.float32)), "datum 1: actions must have shape (10, up to 32)"),
        (
            datum(1, size=64),
            "datum 1: image 'base_0_rgb' is (64, 64, 3), but an earlier datum's is (48, 48, 3)",
        ),
        (datum(1, weight=-1.0), "datum 1: weight must be"),
        (
            {
                "observation": {"image": {"front": np.zeros((8, 8, 3), np.uint8)}},
                "actions": np.zeros((10, 2)),
            },
            "datum 1: image: unknown model camera 'front'",
        ),
        (
            {"observation": {"state": np.zeros(33), "prompt": "x"}, "actions": np.zeros((10, 2))},
            "datum 1: state has 33 values; at most 32",
        ),
        (
            {
                "observation": {"image": {"base_0_rgb": np.zeros((48, 48), np.uint8)}},
                "actions": np.zeros((10, 2)),
            },
            "datum 1: image 'base_0_rgb' is (48, 48)",
        ),
    ],
)
def test_a_malformed_datum_is_named_with_its_field(session: TrainingSession, bad: dict, message: str) -> None:
    with pytest.raises(EngineError) as error:
        session.forward_backward([datum(0), bad])
    assert message in str(error.value)


def test_a_custom_loss_round_trip(session: TrainingSession) -> None:
    outputs = session.forward_custom([datum(3), datum(4)])
    assert set(outputs) == {"velocity", "target", "x_t", "noise", "time"}
    assert outputs["velocity"].shape == (2, HORIZON, 32) and outputs["time"].shape == (2,)
    with pytest.raises(EngineError, match="still waiting for its gradient"):
        session.optim_step(AdamParams(learning_rate=1e-3))
    outputs = session.forward_custom([datum(3), datum(4)])
    grad = np.ones_like(outputs["velocity"]) * 1e-3
    result = session.backward_custom(grad, 0.5, {"weighted": 0.5})
    assert result["metrics"] == {"loss": 0.5, "weighted": 0.5}
    with pytest.raises(EngineError, match="no custom forward pass"):
        session.backward_custom(grad, 0.5, {})
    session.forward_custom([datum(3)])
    session.discard_custom()  # the client's loss failed: the next step goes on as usual
    session.forward_backward([datum(3)])
    assert session.optim_step(AdamParams(learning_rate=1e-3))["metrics"]["grad_norm"] > 0


def test_a_sampler_keeps_its_weights_while_training_goes_on(session: TrainingSession, tmp_path: Path) -> None:
    observation = datum(5)["observation"]

    def sample(sampler: str | None = None) -> np.ndarray:
        session.learner.generator.manual_seed(0)  # the same noise for every comparison
        return session.sample([observation], sampler=sampler)

    session.save_weights("step-1", tmp_path / "step-1")
    assert (tmp_path / "step-1" / "model.safetensors").is_file()
    saved, current = sample("step-1"), sample()
    assert saved.shape == (1, HORIZON, 32)
    np.testing.assert_allclose(saved, current, atol=1e-5)
    for _ in range(3):
        session.forward_backward([datum(6), datum(7)])
        session.optim_step(AdamParams(learning_rate=1e-2))
    assert not np.allclose(sample(), current, atol=1e-3)
    np.testing.assert_allclose(sample("step-1"), saved, atol=1e-6)


def test_state_moves_between_sessions_of_the_same_model_and_targets(tmp_path: Path) -> None:
    first = TrainingSession(SessionSpec(base_model="pi05-tiny"), seed=1)
    batch = [datum(8), datum(9)]
    first.forward_backward(batch)
    first.optim_step(AdamParams(learning_rate=1e-3))
    first.save_state(tmp_path / "s")
    first.forward_backward(batch)
    first.optim_step(AdamParams(learning_rate=1e-3))
    expected = first.forward_backward(batch)["metrics"]["loss"]

    second = TrainingSession(SessionSpec(base_model="pi05-tiny", targets=None), seed=1)
    second.load_state(tmp_path / "s", "s")
    second.forward_backward(batch)
    second.optim_step(AdamParams(learning_rate=1e-3))
    assert second.forward_backward(batch)["metrics"]["loss"] == pytest.approx(expected, abs=1e-6)

    other = TrainingSession(SessionSpec(base_model="pi05-tiny", lora_rank=8))
    with pytest.raises(EngineError, match="same model and targets"):
        other.load_state(tmp_path / "s", "s")
    with pytest.raises(EngineError, match="no saved state named 'missing'"):
        other.load_state(tmp_path / "missing", "missing")
