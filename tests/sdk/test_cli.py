"""`relay keys`, `relay fine-tunes` and `relay sessions` against the served API and a real worker."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import httpx
import pytest
from typer.testing import CliRunner

from relay.cli import app
from relay.cli._common import JSON_HINT
from relay.cli.watch import BLOCKS
from relay.formatting import duration_text, number_text
from relay.http_client import Client
from relay.sft.config import SFTConfig
from relay.sft.job import interrupted_note
from relay.sft.train import train
from relay.training import ServiceClient
from tests.service.stack import Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow


def relay(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def on_terminal(*args: str, env: dict[str, str], timeout: float = 60) -> str:
    """Run `relay ARGS` with a pseudo-terminal as its stdin, stdout and stderr; the text it wrote there."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "relay.cli", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**os.environ, **env, "COLUMNS": "120", "TERM": "xterm-256color"},
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
    written = b"".join(chunks).decode(errors="replace")
    assert process.wait(timeout=10) == 0, written
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", written)  # without colours and cursor moves


def test_keys_create_list_and_revoke(stack: Stack) -> None:
    env = {"RELAY_DATABASE_URL": stack.database_url, "RELAY_HOME": str(stack.settings.home)}
    made = relay("keys", "create", "--user", "carol", "--json", env=env)
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)["key"]
    assert json.loads(made.stdout)["user"] == "carol" and key.startswith("relay-")
    headers = {"authorization": f"Bearer {key}"}
    assert httpx.get(f"{stack.api_url}/v1/fine-tunes", headers=headers).status_code == 200

    listed = relay("keys", "list", env=env)
    assert listed.returncode == 0 and "carol" in listed.stdout and key not in listed.stdout

    bad = relay("keys", "create", "--user", "no spaces/please", env=env)
    assert bad.returncode == 2 and "bad user name" in bad.stderr and "Traceback" not in bad.stderr

    revoked = relay("keys", "revoke", key, env=env)
    assert revoked.returncode == 0, revoked.stderr
    assert httpx.get(f"{stack.api_url}/v1/fine-tunes", headers=headers).status_code == 401


def _cli_as(
    stack: Stack, user: tuple[str, str], home: Path
) -> tuple[CliRunner, dict[str, str], Callable[..., str]]:
    """The CLI in this process as `user` of the served API: its runner, its environment, and `run`,
    which invokes a command that must succeed and returns its output."""
    runner = CliRunner()
    env = {"RELAY_BASE_URL": stack.api_url, "RELAY_API_KEY": user[1], "RELAY_HOME": str(home)}

    def run(*args: str) -> str:
        result = runner.invoke(app, list(args), env=env)
        assert result.exit_code == 0, (args, result.output)
        return result.output

    return runner, env, run


def test_fine_tunes_commands(
    stack: Stack, worker: WorkerProcess, user: tuple[str, str], dataset: Path, tmp_path: Path
) -> None:
    runner, env, run = _cli_as(stack, user, tmp_path / "home")

    refused = runner.invoke(
        app, ["fine-tunes", "create", "--model", "pi05-tiny", "--dataset", "x", "--batch-size", "0"], env=env
    )
    assert refused.exit_code == 2
    assert "error: bad batch_size: 0 (must be an integer from 1 to 512)" in refused.output
    unknown = runner.invoke(
        app, ["fine-tunes", "create", "--model", "pi05-tiny", "--dataset", "x", "--target", "wings"], env=env
    )
    assert (
        unknown.exit_code == 2
        and """error: bad targets: ["wings"] (unknown target 'wings'""" in unknown.output
    )

    created = json.loads(
        run(
            "fine-tunes",
            "create",
            "--model",
            "pi05-tiny",
            "--dataset",
            str(dataset),
            "--batch-size",
            "2",
            "--steps",
            "10",
            "--target",
            "action_expert.attn",
            "--targets",
            "action_expert.mlp,heads",
            "--camera",
            "base_0_rgb=observation.images.top",
            "--name",
            "cli",
            "--wait",
            "--json",
        )
    )
    job_id = created["id"]
    assert created["status"] == "completed"
    assert created["targets"] == ["action_expert.attn", "action_expert.mlp", "heads"]
    assert created["cameras"] == {"base_0_rgb": "observation.images.top"}

    assert job_id in run("fine-tunes", "list")
    assert [json.loads(line)["id"] for line in run("fine-tunes", "list", "--json").splitlines()] == [job_id]
    shown = run("fine-tunes", "retrieve", job_id)
    assert "completed" in shown
    # The loss to 4 significant digits (it was printed to 17), and a full fine-tune (pi05-tiny's
    # default) shows no LoRA settings.
    job_fields = shown[: shown.index("Results")]
    assert re.findall(r"loss \(10-step mean\)\s+(\S+)", job_fields) == [number_text(created["loss"])]
    assert created["finetune"] == "full" and "lora_rank" not in shown and "lora_alpha" not in shown
    retrieved = json.loads(run("fine-tunes", "retrieve", job_id, "--json"))
    card = retrieved.pop("summary")
    assert retrieved == created
    # The results card under the job: the API's summary, in words.
    lines = shown.splitlines()
    results = lines[lines.index("Results") + 1 : lines.index("", lines.index("Results"))]
    rows = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in results)
    first, last = card["loss"]["first"], card["loss"]["last"]
    assert rows["training loss"].startswith(
        f"first {number_text(first['loss'])} (step 10), last {number_text(last['loss'])} (step 10), best "
    )
    assert rows["duration"].startswith(f"{duration_text(card['duration_seconds'])} (queued ")
    assert rows["pace"].startswith(f"{number_text(card['steps_per_second'], 3)} steps/s, ")
    assert rows["progress"] == "10/10 steps (100%)" and "ETA" not in rows  # it has ended
    checkpoint = next(line for line in lines if "checkpoints/step-00000010/" in line)
    cells = [cell.strip() for cell in checkpoint.split("│") if cell.strip()]
    assert cells[:2] == ["10", number_text(card["checkpoints"][0]["loss"])]
    assert f"relay fine-tunes download {job_id} --dir {job_id}" in shown
    assert f'policy = load_policy("{job_id}")' in shown and "Invalid paligemma_variant: pi05-tiny" in shown

    text = run("fine-tunes", "events", job_id)
    assert "step     10  loss" in text and "finished" in text
    events = [json.loads(line) for line in run("fine-tunes", "events", job_id, "--json").splitlines()]
    assert [e["event"] for e in events[-2:]] == ["finished", "stage"] and all("id" in e for e in events)
    # The plain lines show the ids that --after takes.
    assert [line.split()[:2] for line in text.splitlines()] == [["id", str(e["id"])] for e in events]
    assert "loss (10-step mean)" in run("fine-tunes", "retrieve", job_id)
    followed = [
        json.loads(line) for line in run("fine-tunes", "events", job_id, "--follow", "--json").splitlines()
    ]
    assert followed == events
    # Piped (CliRunner is not a terminal): the same plain lines as without --follow, no live panel.
    assert run("fine-tunes", "events", job_id, "--follow") == text
    # On a terminal: a progress bar and the loss's sparkline under the lines.
    shown = on_terminal("fine-tunes", "events", job_id, "--follow", env=env)
    assert "step     10  loss" in shown and f"{job_id} completed" in shown and "step 10/10" in shown
    assert any(block in shown for block in BLOCKS), shown
    later = run("fine-tunes", "events", job_id, "--after", str(events[0]["id"]), "--json").splitlines()
    assert [json.loads(line) for line in later] == events[1:]

    listing = run("fine-tunes", "download", job_id, "--dir", str(tmp_path / "weights"))
    assert "model.safetensors" in listing
    assert {p.name for p in (tmp_path / "weights").iterdir()} >= {
        "model.safetensors",
        "config.json",
        "relay_config.json",
        "norm_stats.json",
        "policy_preprocessor.json",
        "policy_postprocessor.json",
    }

    finished = runner.invoke(app, ["fine-tunes", "cancel", job_id], env=env)
    assert finished.exit_code == 1 and "409" in finished.output and "already completed" in finished.output
    missing = runner.invoke(app, ["fine-tunes", "retrieve", "ft-000000000000"], env=env)
    assert missing.exit_code == 1 and "404 no fine-tune ft-000000000000" in missing.output


def test_sessions_commands(
    stack: Stack, worker: WorkerProcess, user: tuple[str, str], tmp_path: Path
) -> None:
    """`relay sessions list | show | close | states` on a live session that saved a state."""
    runner, env, run = _cli_as(stack, user, tmp_path / "home")

    service = ServiceClient(stack.api_url, user[1], progress=False)
    with service.create_lora_training_client("pi05-tiny", rank=4) as training_client:
        session_id = training_client.id
        training_client.save_state("cli-state").result(timeout=120)

        listed = [json.loads(line) for line in run("sessions", "list", "--json").splitlines()]
        assert [(s["id"], s["status"], s["lora_rank"]) for s in listed] == [(session_id, "ready", 4)]
        table = run("sessions", "list")
        assert session_id in table and "ready" in table and "lora r4" in table
        assert all(column in table for column in ("calls", "steps", "states"))
        assert "pi05-tiny" in run("sessions", "show", session_id)
        assert json.loads(run("sessions", "show", session_id, "--json"))["status"] == "ready"

        saved = [json.loads(line) for line in run("sessions", "states", "--json").splitlines()]
        assert [(s["name"], s["base_model"], s["lora_rank"]) for s in saved] == [
            ("cli-state", "pi05-tiny", 4)
        ]
        assert saved[0]["bytes"] > 0 and saved[0]["targets"] == listed[0]["targets"]
        assert "cli-state" in run("sessions", "states")

        closing = json.loads(run("sessions", "close", session_id, "--json"))
        assert closing["id"] == session_id and closing["status"] in ("ready", "closed")
        deadline = time.monotonic() + 60
        while (shown := service.retrieve_session(session_id))["status"] != "closed":
            assert time.monotonic() < deadline, shown
            time.sleep(0.2)
        assert "closed" in run("sessions", "show", session_id)

    stranger = stack.new_user()[1]
    other = {**env, "RELAY_API_KEY": stranger}
    hidden = runner.invoke(app, ["sessions", "show", session_id], env=other)
    assert hidden.exit_code == 1 and f"404 no training session {session_id}" in hidden.output
    assert runner.invoke(app, ["sessions", "states", "--json"], env=other).output == ""
    refused = runner.invoke(app, ["sessions", "close", session_id], env=other)
    assert refused.exit_code == 1 and "404" in refused.output and "Traceback" not in refused.output
    service.close()


def relay_process(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """`relay ARGS` running, its stdout and stderr pipes (a script's, not a terminal)."""
    return subprocess.Popen(
        [sys.executable, "-m", "relay.cli", *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def first_line(process: subprocess.Popen[str], stream: IO[str] | None, timeout: float) -> str:
    """The first line `process` writes to `stream` (its stdout or stderr pipe), within `timeout`."""
    assert stream is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.5)
        if ready:
            return stream.readline()
        assert process.poll() is None, process.communicate()
    raise AssertionError(f"no line from {process.args} in {timeout} s")


def interrupted(process: subprocess.Popen[str], job_id: str) -> None:
    """Ctrl-C, as a terminal sends it (SIGINT): exit 130, no traceback, and what it leaves."""
    process.send_signal(signal.SIGINT)
    _, said = process.communicate(timeout=60)
    assert process.returncode == 130 and "Traceback" not in said, said
    assert interrupted_note(job_id) in " ".join(said.split()), said


def test_piped_tables_and_ctrl_c_while_following_a_running_job(
    stack: Stack, worker: WorkerProcess, user: tuple[str, str], dataset: Path, tmp_path: Path
) -> None:
    # COLUMNS empty: a pipe, as a script's, with no terminal width to follow.
    env = {
        "RELAY_BASE_URL": stack.api_url,
        "RELAY_API_KEY": user[1],
        "RELAY_HOME": str(tmp_path),
        "COLUMNS": "",
    }
    # Long enough to be running whenever the signals come; cancelled at the end.
    long_job = SFTConfig(model="pi05-tiny", dataset_name=str(dataset), batch_size=2, steps=100_000)
    job = train(long_job, client=Client(stack.api_url, user[1]))
    wait_for(lambda: job.refresh().status == "running", 120, "the job to run")

    # Piped, a table is as wide as its values (no `runni…`, the whole dataset path) and says --json.
    listed = relay("fine-tunes", "list", env=env)
    row = next(line for line in listed.stdout.splitlines() if job.id in line)
    assert "running" in row and str(dataset) in row and "…" not in listed.stdout, listed.stdout
    assert JSON_HINT in listed.stderr

    follow = relay_process("fine-tunes", "events", job.id, "--follow", env=env)
    line = first_line(follow, follow.stdout, 120)  # the first metrics event, with its window's rate
    assert "step     10  loss" in line and line.rstrip().endswith(" steps/s"), line
    interrupted(follow, job.id)

    # `create --wait` of a second job (queued behind the first): the same, said by job.wait().
    create = ["--model", "pi05-tiny", "--dataset", str(dataset), "--batch-size", "2", "--steps", "100000"]
    wait = relay_process("fine-tunes", "create", *create, "--wait", env=env)
    second = first_line(wait, wait.stderr, 60).split()[0]  # "ft-... queued  step 0/100000  ..."
    interrupted(wait, second)

    # The jobs ran on, and the command the note gives cancels them.
    assert job.refresh().status == "running"
    for job_id in (job.id, second):
        cancelled = relay("fine-tunes", "cancel", job_id, "--json", env=env)
        assert json.loads(cancelled.stdout)["status"] in ("cancel_requested", "cancelled"), cancelled.stderr
