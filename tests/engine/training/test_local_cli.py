"""`relay local train` and `relay local eval`, run as a user runs them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from relay.events import CHUNKS_PER_FRAME


def relay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay.cli", *args], capture_output=True, text=True, timeout=600
    )


def local_train(dataset: Path, output_dir: Path) -> list[str]:
    """The arguments of `relay local train` of pi05-tiny on `dataset` into `output_dir`."""
    return [
        "local",
        "train",
        "--model",
        "pi05-tiny",
        "--dataset",
        str(dataset),
        "--output-dir",
        str(output_dir),
    ]


def test_local_train_prints_events_resumes_and_the_output_evaluates(
    synthetic_dataset_path: Path, tmp_path: Path
) -> None:
    common = [
        *local_train(synthetic_dataset_path, tmp_path),
        "--batch-size",
        "4",
        "--learning-rate",
        "1e-3",
        "--checkpoint-every",
        "10",
        "--json",
    ]
    first = relay(*common, "--steps", "20")
    assert first.returncode == 0, first.stderr
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    assert [e["step"] for e in lines if "grad_norm" in e] == [10, 20]
    assert {"step": 20, "event": "finished"} in lines
    assert lines[-1]["status"] == "completed" and lines[-1]["output_dir"] == str(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {
        "model.safetensors",
        "config.json",
        "relay_config.json",
        "policy_preprocessor.json",
        "norm_stats.json",
        "checkpoints",
    }

    # The same command again finds the finished run and only rewrites the output.
    again = relay(*common, "--steps", "20")
    assert again.returncode == 0, again.stderr
    assert not [line for line in again.stdout.splitlines() if '"grad_norm"' in line]

    held_out = ["--dataset", str(synthetic_dataset_path), "--episodes", "0-1", "--blind-from", "2-3"]
    evaluated = relay("local", "eval", "--model", str(tmp_path), *held_out, "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    result = json.loads(evaluated.stdout)
    assert result["mse"] > 0 and result["frames"] > 0 and result["blind_mse"] > 0
    # The headline: the mean of CHUNKS_PER_FRAME chunks a frame, nearer than one chunk by its spread.
    assert result["chunks"] == CHUNKS_PER_FRAME and result["action_spread"] > 0
    assert result["mean_action_mse"] == pytest.approx(result["mse"] - result["action_spread"], rel=1e-6)
    # --chunks 1: one chunk a frame, so the mean is that chunk and nothing spreads.
    single = relay("local", "eval", "--model", str(tmp_path), *held_out, "--chunks", "1", "--json")
    assert single.returncode == 0, single.stderr
    one = json.loads(single.stdout)
    assert one["chunks"] == 1 and one["action_spread"] == 0 and one["mean_action_mse"] == one["mse"]
    assert one["frames"] == result["frames"] and one["blind_mse"] == result["blind_mse"]
    # Without --json, piped: progress lines on stderr while it samples, in the piped-progress style.
    shown = relay("local", "eval", "--model", str(tmp_path), "--dataset", str(synthetic_dataset_path))
    assert shown.returncode == 0, shown.stderr
    printed = shown.stdout.splitlines()
    headline = rf"action MSE [\d.]+ \(the mean of {CHUNKS_PER_FRAME} sampled chunks per frame"
    assert re.match(headline, printed[0]), printed
    assert re.match(r"one chunk [\d.]+: the mean's error plus the chunks' spread [\d.]+$", printed[1])
    last = shown.stderr.splitlines()[-1]
    assert re.match(r"evaluating  frame (\d+)/\1  ", last) and "frames/s" in last, shown.stderr


def test_local_train_says_what_it_does_after_the_last_step(
    synthetic_dataset_path: Path, tmp_path: Path
) -> None:
    """Piped, the lines after the last step say the validation and the output's writing, not the
    step again and again (a 29 s validation once showed only repeated `step 60/60` lines)."""
    args = [*local_train(synthetic_dataset_path, tmp_path), "--steps", "10", "--batch-size", "4"]
    shown = subprocess.run(
        [sys.executable, "-m", "relay.cli", *args, "--validation-episodes", "0-1"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "RELAY_PROGRESS_SECONDS": "0"},
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stderr.splitlines()
    said = [line.split("  step ")[0] for line in lines if "  step 10/10" in line]
    assert said.index("validating the held-out episodes") < said.index("writing the output"), lines


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-size", "0"], "bad batch_size: 0"),
        (["--finetune", "half"], "bad finetune"),
        (["--targets", "language.everything"], "unknown target 'language.everything'"),
        (["--camera", "front=observation.images.top"], "unknown model camera 'front'"),
    ],
)
def test_local_train_refuses_bad_settings_naming_the_field(
    args: list[str], message: str, synthetic_dataset_path: Path, tmp_path: Path
) -> None:
    result = relay(*local_train(synthetic_dataset_path, tmp_path), "--steps", "1", *args)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir())


def test_local_train_reports_a_dataset_problem(tmp_path: Path) -> None:
    (tmp_path / "not-a-dataset").mkdir()
    result = relay(*local_train(tmp_path / "not-a-dataset", tmp_path / "out"), "--steps", "1")
    assert result.returncode == 1
    assert "not-a-dataset" in result.stderr and "Traceback" not in result.stderr


def _train_until(command: list[str], marker: str) -> tuple[int, str]:
    """Run `relay local train` with its stderr piped (no terminal), press Ctrl-C once a stderr
    line contains `marker`, and return the exit status and all of stderr."""
    env = {**os.environ, "RELAY_PROGRESS_SECONDS": "0"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if marker in line:
            process.send_signal(signal.SIGINT)
            break
    _, rest = process.communicate(timeout=300)
    return process.returncode, "".join(seen) + rest


def test_ctrl_c_saves_a_checkpoint_and_the_same_command_resumes_from_it(
    synthetic_dataset_path: Path, tmp_path: Path
) -> None:
    command = [
        sys.executable,
        "-m",
        "relay.cli",
        *local_train(synthetic_dataset_path, tmp_path),
        "--batch-size",
        "2",
        "--steps",
        "5000",
        "--learning-rate",
        "1e-3",
        "--target",
        "action_expert.attn",
        "--targets",
        "action_expert.mlp,heads",
    ]
    # Off a terminal, progress comes as plain lines.
    code, stderr = _train_until(command, "training  step 20/5000  loss")
    assert code == 130, stderr
    stopped = re.search(r"stopped at step (\d+) with a checkpoint there", stderr)
    assert stopped is not None, stderr
    step = int(stopped.group(1))
    assert step >= 20 and (tmp_path / "checkpoints" / f"step-{step:08d}" / "manifest.json").is_file()

    code, stderr = _train_until(command, f"resuming from step {step}")
    assert code == 130 and f"resuming from step {step} (the last checkpoint in" in stderr, stderr
    again = re.search(r"stopped at step (\d+)", stderr)
    assert again is not None and int(again.group(1)) >= step


def test_local_train_takes_the_services_permission_for_a_full_size_model_on_the_cpu(
    synthetic_dataset_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pi05 (3.35 B weights) on the CPU is refused with its memory plan, as the service refuses it,
    unless RELAY_ALLOW_CPU_FULL_SIZE=true (then the run goes on: here, offline, to the Hub fetch)."""
    monkeypatch.delenv("RELAY_ALLOW_CPU_FULL_SIZE", raising=False)
    args = ["local", "train", "--model", "pi05", "--dataset", str(synthetic_dataset_path), "--steps", "1"]
    refused = relay(*args, "--output-dir", str(tmp_path / "refused"), "--batch-size", "1")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "pi05 has 3.35 B weights" in refused.stderr and "this run is on the CPU" in refused.stderr
    assert "RELAY_ALLOW_CPU_FULL_SIZE=true" in refused.stderr
    monkeypatch.setenv("RELAY_ALLOW_CPU_FULL_SIZE", "true")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    allowed = relay(*args, "--output-dir", str(tmp_path / "allowed"), "--batch-size", "1")
    assert "this run is on the CPU" not in allowed.stderr, allowed.stderr
