"""What a new user meets first: progress in logs, the local server found from anywhere, one
spelling for targets, the version, the help, and no stray files."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relay import client_config as _config
from relay.catalog import TARGETS
from relay.cli import app
from relay.cli._common import split_targets
from relay.progress import ProgressReport

runner = CliRunner()


def relay(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay.cli", *args],
        cwd=cwd,
        env={**os.environ, "RELAY_BASE_URL": "", "RELAY_API_KEY": "", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_progress_off_a_terminal_is_plain_lines_at_most_every_interval() -> None:
    stream = io.StringIO()  # not a terminal
    report = ProgressReport("ft-1 running", 100, stream=stream, every=3600)
    for step in range(0, 101, 10):
        report.update(step, f"loss {1 / (step + 1):.3f}")
    report.close()
    lines = stream.getvalue().splitlines()
    # The first update, then nothing within the interval, then the end (which always shows).
    assert [line.split("  ")[:2] for line in lines] == [
        ["ft-1 running", "step 0/100"],
        ["ft-1 running", "step 100/100"],
    ]

    stream = io.StringIO()
    report = ProgressReport("training", 30, stream=stream, every=0)
    for step in (10, 20, 30):
        report.update(step)
    report.close()
    assert [line.split("  ")[1] for line in stream.getvalue().splitlines()] == [
        "step 10/30",
        "step 20/30",
        "step 30/30",
    ]


def test_targets_take_either_spelling() -> None:
    assert split_targets(["action_expert.attn", "action_expert.mlp,heads"]) == [
        "action_expert.attn",
        "action_expert.mlp",
        "heads",
    ]
    assert split_targets(None) is None and split_targets([""]) is None
    for command in (["fine-tunes", "create", "--help"], ["local", "train", "--help"]):
        shown = runner.invoke(app, command, env={"COLUMNS": "200"}).output
        assert "--target" in shown and "--targets" in shown, command


def test_version_and_required_options_in_help() -> None:
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.output.startswith("relay ")
    shown = runner.invoke(app, ["fine-tunes", "create", "--help"], env={"COLUMNS": "200"}).output
    model_line = next(line for line in shown.splitlines() if "--model" in line)
    dataset_line = next(line for line in shown.splitlines() if "--dataset" in line)
    assert "Required" in model_line and "Required" in dataset_line


def test_models_list_tells_when_heads_train() -> None:
    assert "always" not in TARGETS["heads"]
    assert "without `heads` leave them frozen" in TARGETS["heads"]


def test_the_local_server_is_found_from_any_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    env = {"HOME": str(home), "RELAY_HOME": ""}  # empty: unset, so ~/.relay

    # No server has run: the message names where the client looked.
    missing = relay("fine-tunes", "list", cwd=elsewhere, env=env)
    assert missing.returncode == 1
    assert f"{home / '.relay' / 'client.json'}, where this client looked" in missing.stderr.replace("\n", "")

    # A server's client file in ~/.relay is found from any working directory (here, its port is shut).
    _config.write_client_file(home / ".relay", "http://127.0.0.1:9", "relay-test-key")
    found = relay("fine-tunes", "list", cwd=elsewhere, env=env)
    message = found.stderr.replace("\n", "")
    assert found.returncode == 1 and "cannot reach http://127.0.0.1:9" in message
    assert f"the URL is from {home / '.relay' / 'client.json'}" in message


def test_an_empty_relay_home_leaves_no_database_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relay_api.settings import Settings

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RELAY_HOME", "")
    settings = Settings()
    assert settings.home == home / ".relay"
    assert settings.database_url == f"sqlite:///{home / '.relay' / 'relay.db'}"

    work = tmp_path / "work"
    work.mkdir()
    listed = relay("keys", "list", cwd=work, env={"HOME": str(home), "RELAY_HOME": ""})
    assert listed.returncode == 1 and str(home / ".relay") in listed.stderr.replace("\n", "")
    assert list(work.iterdir()) == []


def test_the_client_file_is_read_from_relay_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAY_BASE_URL", raising=False)
    monkeypatch.delenv("RELAY_API_KEY", raising=False)
    monkeypatch.setenv("RELAY_HOME", str(tmp_path / "data"))
    path = _config.write_client_file(tmp_path / "data", "http://127.0.0.1:8123", "k")
    assert json.loads(path.read_text())["base_url"] == "http://127.0.0.1:8123"
    assert _config.resolve().base_url == "http://127.0.0.1:8123"
    assert "the URL is from" in _config.where_looked()
