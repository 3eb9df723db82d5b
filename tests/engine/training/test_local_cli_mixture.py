"""`relay local train --mix DIR:WEIGHT --mix DIR`: a mixture of two local datasets trained by the
CLI (typer's CliRunner on relay.cli.app), what it prints of the mixture, and the refusals of a
command that names no dataset or a bad weight."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from relay.cli import app
from relay_engine.datasets import write_synthetic_dataset


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cli-mix")
    first = write_synthetic_dataset(root / "pick", episodes=3, episode_length=6, seed=1)
    second = write_synthetic_dataset(root / "place", episodes=3, episode_length=6, format="v3.0", seed=2)
    return first, second


@pytest.fixture(autouse=True)
def quiet_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RELAY_PROGRESS_SECONDS", "0")


def train(*args: str) -> Result:
    return CliRunner().invoke(app, ["local", "train", "--model", "pi05-tiny", *args])


def fast(output_dir: Path) -> list[str]:
    return ["--steps", "2", "--batch-size", "2", "--checkpoint-every", "2", "--output-dir", str(output_dir)]


def test_local_train_on_a_mixture_writes_the_output_and_reports_each_dataset(
    datasets: tuple[Path, Path], tmp_path: Path
) -> None:
    first, second = datasets
    out = tmp_path / "out"
    result = train("--mix", f"{first}:3", "--mix", str(second), *fast(out), "--json")
    assert result.exit_code == 0, result.output
    assert {"model.safetensors", "norm_stats.json", "config.json"} <= {p.name for p in out.iterdir()}

    events: list[dict[str, Any]] = [json.loads(line) for line in result.stdout.splitlines()]
    read = [event for event in events if event.get("event") == "dataset"]
    assert len(read) == 1
    assert read[0]["path"] == str(first)
    mixture = read[0]["mixture"]
    assert [part["path"] for part in mixture] == [str(first), str(second)]
    assert [part["share"] for part in mixture] == [0.75, 0.25]
    assert [part["format"] for part in mixture] == ["v2.1", "v3.0"]
    assert [part["episodes"] for part in mixture] == [3, 3]
    assert [part["frames"] for part in mixture] == [18, 18]
    assert [e["step"] for e in events if "grad_norm" in e] == [2]
    assert events[-1]["status"] == "completed" and events[-1]["output_dir"] == str(out)


def test_local_train_on_a_mixture_shows_the_mixture_on_its_progress(
    datasets: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = datasets
    # A relative --mix names the directory where the command runs, by its absolute path.
    monkeypatch.chdir(first.parent)
    out = tmp_path / "out"
    result = train("--mix", f"./{first.name}:3", "--mix", f"{second.name}:1", *fast(out))
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if "reading " in line]
    assert len(said) == 1, result.stderr
    assert f"reading {first}, LeRobot v2.1, 3 episodes, 18 frames (75% of samples)" in said[0]
    assert said[0].endswith("mixed with 1 more dataset"), said[0]
    assert "completed 2 steps" in result.stderr, result.stderr
    assert (out / "model.safetensors").is_file() and (out / "norm_stats.json").is_file()


def test_local_train_without_a_dataset_says_so(tmp_path: Path) -> None:
    result = train(*fast(tmp_path / "out"))
    assert result.exit_code == 1
    assert "missing --dataset (or --mix, repeated, for a mixture of datasets)" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("mix", "message"),
    [
        (("{a}:0", "{b}"), "bad datasets[0].weight"),
        (("{a}", "{b}:-2"), "bad datasets[1].weight"),
        (("{a}",), "bad datasets: a list of 1"),
        (("{a}", "{a}:2"), "bad datasets[1].name"),
        (("{a}@v2.1", "{b}"), "bad datasets[0].revision"),
    ],
)
def test_local_train_refuses_a_bad_mixture_naming_its_place(
    datasets: tuple[Path, Path], tmp_path: Path, mix: tuple[str, ...], message: str
) -> None:
    first, second = datasets
    options = [arg for text in mix for arg in ("--mix", text.format(a=first, b=second))]
    result = train(*options, *fast(tmp_path / "out"))
    assert result.exit_code == 1, result.output
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_local_train_refuses_episodes_with_a_mixture_before_loading_anything(
    datasets: tuple[Path, Path], tmp_path: Path
) -> None:
    first, second = datasets
    result = train("--mix", str(first), "--mix", str(second), "--episodes", "0-1", *fast(tmp_path / "out"))
    assert result.exit_code == 1, result.output
    assert "bad --episodes: it selects episodes of one dataset" in result.stderr
    assert "training step" not in result.stderr  # refused before the model or the data loaded
    assert not (tmp_path / "out").exists()
