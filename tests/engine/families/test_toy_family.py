"""A model family from outside Relay (tests/fixtures/toy_family, a package), registered with one call
or found installed, trains through every shared path: a recipe (with a checkpoint and a resume), a
session, and `relay local train`; installed, the API's process knows its models without the engine.

The family is a linear regressor on generated numbers. Nothing outside the registry knows its
model's name, so each path fails if it decides by anything but the registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay.families import family_of
from relay.optimizer import AdamParams
from relay.sft.config import SFTConfig
from relay.training.config import SessionConfig
from relay_engine.errors import ConfigError, EngineError
from relay_engine.families import family_for, forget_family, register_family
from relay_engine.recipe import Recipe, run_recipe
from relay_worker.session import open_session
from tests.fixtures.toy_family.relay_toy_family import TOY
from tests.fixtures.toy_family.relay_toy_family.engine import INTERCEPT, SLOPE, ToyFamily, ToySession

# The family as an installed package: on PYTHONPATH, its dist-info names it under the entry points.
PACKAGE_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "toy_family"


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


def test_a_family_takes_only_the_recipe_fields_it_names(toy: ToyFamily, tmp_path: Path) -> None:
    """Opt-in: the toy's spec names no family field, so a robot's or a database's field is refused
    for it, naming the models that take it; a stored job's config, filled in, reads back."""
    for field, value, takers in (
        ("cameras", {"base_0_rgb": "observation.image"}, "pi05, pi05-tiny"),
        ("lora_rank", 8, "pi05, pi05-tiny, smolvla, smolvla-tiny, rt-j, rt-j-tiny"),
        ("tasks_dir", "/tasks", "rt-j, rt-j-tiny"),
    ):
        with pytest.raises(ValueError) as refused:
            SFTConfig.parse({"model": TOY, "dataset_name": "points", field: value})
        assert f"bad {field}: {TOY} takes no {field} ({field} is for {takers})" in str(refused.value)
    stored = SFTConfig(model=TOY, dataset_name="points").model_dump(mode="json")
    assert SFTConfig.parse(stored).finetune == "full"


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


def installed(code: str, *args: str, package_dir: Path = PACKAGE_DIR) -> subprocess.CompletedProcess[str]:
    """Run Python in a fresh process with the toy family installed (its directory on PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package_dir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_an_installed_family_is_known_to_the_api_process_without_the_engine() -> None:
    """The API imports no engine: an installed package's spec (entry points, relay.family_specs) is
    what makes its models known there, in the OpenAPI document, the rule texts and validation."""
    answer = installed(
        """
import json, sys
from relay_api.app import create_app
from relay.sft.config import RULES, SFTConfig
from relay.training.config import SessionConfig
document = create_app().openapi()
recipe = document["components"]["schemas"]["SFTConfig"]["properties"]["model"]["enum"]
session = SessionConfig.model_json_schema()["properties"]["base_model"]["enum"]
SFTConfig.parse({"model": "toy-linear", "dataset_name": "points"})
SessionConfig.parse({"base_model": "toy-linear"})
print(json.dumps({"recipe": recipe, "session": session, "rule": RULES["model"],
                  "engine": "relay_engine" in sys.modules}))
"""
    )
    assert answer.returncode == 0, answer.stderr
    seen = json.loads(answer.stdout.strip().splitlines()[-1])
    assert TOY in seen["recipe"] and TOY in seen["session"] and TOY in seen["rule"]
    assert seen["engine"] is False
    # And without the package, the same process knows no such model.
    assert TOY not in SFTConfig.model_json_schema()["properties"]["model"]["enum"]


def test_an_installed_family_trains_through_relay_local_train(tmp_path: Path) -> None:
    """The engine finds the installed family (relay.families) and `relay local train` runs it."""
    family = ToyFamily()
    data = family.synthesize(tmp_path / "points")
    out = tmp_path / "out"
    answer = installed(
        "import sys; from relay.cli import main; sys.argv = ['relay', *sys.argv[1:]]; main()",
        "local", "train", "--model", TOY, "--dataset", str(data), "--output-dir", str(out),
        "--steps", "30", "--batch-size", "8", "--learning-rate", "0.1", "--json",
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr + answer.stdout
    assert json.loads(answer.stdout.strip().splitlines()[-1])["status"] == "completed"
    assert (out / "weights.json").is_file()


def test_an_installed_family_that_cannot_load_stops_the_process_naming_its_entry_point(
    tmp_path: Path,
) -> None:
    info = tmp_path / "relay_broken_family-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: relay-broken-family\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[relay.family_specs]\nbroken = relay_no_such_module:spec\n")
    answer = installed("import relay.sft.config", package_dir=tmp_path)
    assert answer.returncode != 0
    assert (
        "the model family 'broken' (relay_no_such_module:spec, entry point group relay.family_specs) "
        "could not be loaded: ModuleNotFoundError" in answer.stderr
    )
