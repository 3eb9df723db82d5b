"""A third model family, defined here and registered with one call, trains through every shared
path: a recipe (with a checkpoint and a resume), a session, and `relay local train`.

The family is a linear regressor on generated numbers. Nothing outside the registry knows its
model's name, so each path fails if it decides by anything but the registry."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from relay.cli import app
from relay.families import FamilySpec, family_of
from relay.optimizer import AdamParams
from relay.sft.config import SFTConfig
from relay.training.config import SessionConfig
from relay_engine.core.data import BatchOrder, DataPosition
from relay_engine.core.learner import ForwardBackwardResult, Learner, OptimStepResult, clipped_adam_step
from relay_engine.core.session import Session
from relay_engine.errors import ConfigError, EngineError
from relay_engine.families import (
    Family,
    PreparedRecipe,
    RecipeRun,
    family_for,
    forget_family,
    register_family,
)
from relay_engine.recipe import Recipe, run_recipe
from relay_worker.session import open_session

TOY = "toy-linear"
SLOPE, INTERCEPT = 3.0, -1.0


@dataclass(frozen=True)
class Points:
    x: torch.Tensor  # (n, 1)
    y: torch.Tensor  # (n, 1)

    @property
    def batch_size(self) -> int:
        return int(self.x.shape[0])


class ToyLearner(Learner[Points]):
    """y = w x + b, squared error; each point weighs 1 (gradients summed, divided at the step)."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(1, 1)
        self.device = torch.device("cpu")
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=0.0)
        self._weight = 0.0

    def forward_backward(self, batch: Points) -> ForwardBackwardResult:
        losses = ((self.model(batch.x) - batch.y) ** 2).reshape(-1)
        losses.sum().backward()
        self._weight += batch.batch_size
        done = losses.detach()
        return ForwardBackwardResult(float(done.mean()), [float(v) for v in done], float(batch.batch_size))

    def optim_step(self, params: AdamParams) -> OptimStepResult:
        grads = [p.grad for p in self.params if p.grad is not None]
        for grad in grads:
            grad.div_(self._weight)
        self._weight = 0.0
        return clipped_adam_step(self.optimizer, self.params, torch.nn.utils.get_total_norm(grads), params)

    def save_state(self, directory: Path) -> None:
        torch.save(
            {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, directory / "toy.pt"
        )

    def load_state(self, directory: Path) -> None:
        state = torch.load(directory / "toy.pt")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def weights(self) -> dict[str, float]:
        return {"w": self.model.weight.item(), "b": self.model.bias.item()}


class ToySession(Session[Points]):
    loss_fn = "squared_error"

    def __init__(self) -> None:
        self.learner: ToyLearner = ToyLearner()

    @property
    def info(self) -> dict[str, Any]:
        return {"model": TOY}

    def identity(self) -> dict[str, Any]:
        return {"base_model": TOY}

    def batch(self, datums: Sequence[Mapping[str, Any]]) -> Points:
        return points([d["x"] for d in datums], [d["y"] for d in datums])

    def forward_outputs(self, batch: Points) -> dict[str, np.ndarray]:
        with torch.no_grad():
            return {"prediction": self.learner.model(batch.x).numpy()}

    def save_weights(self, name: str, directory: Path) -> None:
        directory.mkdir(parents=True)
        (directory / "weights.json").write_text(json.dumps(self.learner.weights()))


class ToyFamily(Family):
    spec = FamilySpec(name="toy", models=(TOY,), finetune="full", max_gpus=1, loss_names=("squared_error",))

    def __init__(self) -> None:
        self.recipes_prepared = 0
        self.sessions_opened = 0

    def prepare_recipe(self, run: RecipeRun) -> PreparedRecipe:
        self.recipes_prepared += 1
        data = np.load(Path(run.recipe.config.dataset_name) / "points.npz")
        learner = ToyLearner(run.recipe.seed)

        def batches(order: BatchOrder, position: DataPosition) -> Iterator[Points]:
            while True:
                indices, position = order.next_batch(position)
                yield points(data["x"][indices], data["y"][indices])

        def write(output_dir: Path) -> None:
            output_dir.mkdir(parents=True, exist_ok=True)
            (output_dir / "weights.json").write_text(json.dumps(learner.weights()))

        return PreparedRecipe(
            learner=learner,
            samples=len(data["x"]),
            batch_size=run.recipe.config.batch_size,
            batches=batches,
            adam=AdamParams(learning_rate=0.0),
            write_output=write,
        )

    def open_session(self, config: Mapping[str, Any], device: torch.device | str) -> ToySession:
        self.sessions_opened += 1
        return ToySession()

    def synthesize(self, directory: Path, **options: Any) -> Path:
        rng = np.random.default_rng(options.get("seed", 0))
        x = rng.uniform(-1, 1, size=options.get("count", 64)).astype(np.float32)
        directory.mkdir(parents=True, exist_ok=True)
        np.savez(directory / "points.npz", x=x, y=(SLOPE * x + INTERCEPT).astype(np.float32))
        return directory


def points(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> Points:
    def as_column(values: Any) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values, np.float32)).reshape(-1, 1)

    return Points(as_column(x), as_column(y))


@pytest.fixture
def toy() -> Iterator[ToyFamily]:
    family = ToyFamily()
    register_family(family)
    yield family
    forget_family(family.name)


@pytest.fixture
def data(toy: ToyFamily, tmp_path: Path) -> Path:
    return family_for(TOY).synthesize(tmp_path / "points")


def recipe_of(data: Path, steps: int = 200) -> Recipe:
    config = SFTConfig(model=TOY, dataset_name=str(data), steps=steps, batch_size=8, learning_rate=0.1)
    return Recipe.from_config(config, checkpoint_every=50, log_every=25)


def test_the_one_call_registers_the_family_on_both_sides(toy: ToyFamily) -> None:
    spec = family_of(TOY)
    assert spec is toy.spec and family_for(TOY) is toy
    config = SFTConfig(model=TOY, dataset_name="points")
    assert (config.finetune, config.gpus) == ("full", 1)  # the spec's rules, as for rt-j
    forget_family(toy.name)
    with pytest.raises(ValueError, match="model"):
        SFTConfig(model=TOY, dataset_name="points")
    with pytest.raises(ConfigError, match=f"unknown model '{TOY}'"):
        family_for(TOY)


def test_a_recipe_checkpoints_stops_and_resumes_to_the_uninterrupted_weights(
    toy: ToyFamily, data: Path, tmp_path: Path
) -> None:
    whole = run_recipe(
        recipe_of(data), tmp_path / "whole", on_event=lambda e: None, should_stop=lambda: False
    )
    assert whole.status == "completed" and whole.output_dir == tmp_path / "whole" / "output"
    learned = json.loads((whole.output_dir / "weights.json").read_text())
    assert learned["w"] == pytest.approx(SLOPE, abs=0.3) and learned["b"] == pytest.approx(INTERCEPT, abs=0.3)

    events: list[dict[str, Any]] = []
    steps_seen = iter(range(100))
    stopped = run_recipe(
        recipe_of(data),
        tmp_path / "split",
        on_event=events.append,
        should_stop=lambda: next(steps_seen) >= 17,
        checkpoint_on_stop=True,
    )
    assert (stopped.status, stopped.step) == ("stopped", 17)
    assert {"step": 17, "event": "checkpoint"} in events
    events.clear()
    resumed = run_recipe(
        recipe_of(data), tmp_path / "split", on_event=events.append, should_stop=lambda: False
    )
    assert events[0] == {"step": 17, "event": "resumed"} and resumed.resumed_from == 17
    assert json.loads((resumed.output_dir / "weights.json").read_text()) == learned
    assert toy.recipes_prepared == 3
    with pytest.raises(ConfigError, match="different recipe"):
        run_recipe(
            recipe_of(data, steps=201), tmp_path / "split", on_event=lambda e: None, should_stop=lambda: False
        )


def test_a_session_trains_saves_and_loads_its_state(toy: ToyFamily, tmp_path: Path) -> None:
    config = SessionConfig.parse({"base_model": TOY})
    session = open_session(config.model_dump(), device="cpu")
    assert isinstance(session, ToySession) and toy.sessions_opened == 1
    datums = [{"x": x, "y": SLOPE * x + INTERCEPT} for x in (-0.5, 0.0, 0.5)]
    before = session.forward_backward(datums)
    session.optim_step(AdamParams(learning_rate=0.1))
    session.save_state(tmp_path / "state")
    saved = session.learner.weights()
    session.forward_backward(datums)
    session.optim_step(AdamParams(learning_rate=0.1))
    assert session.learner.weights() != saved
    session.load_state(tmp_path / "state", "state")
    assert session.learner.weights() == saved
    assert session.forward_backward(datums)["metrics"]["loss"] < before["metrics"]["loss"]
    with pytest.raises(EngineError, match="sessions do not sample"):
        session.sample([{"x": 0.0}])
    with pytest.raises(EngineError, match="built-in loss"):
        session.forward_custom(datums)


def test_relay_local_train_runs_the_family(toy: ToyFamily, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["local", "train", "--model", TOY, "--dataset", str(data), "--output-dir", str(out)]
    result = CliRunner().invoke(
        app, [*args, "--steps", "30", "--batch-size", "8", "--learning-rate", "0.1", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["status"] == "completed"
    assert (out / "weights.json").is_file()  # the output directory is the work directory
    refused = CliRunner().invoke(app, [*args, "--nproc-per-node", "2"])
    assert refused.exit_code == 1 and f"{TOY} trains in one process" in refused.output
