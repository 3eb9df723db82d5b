"""`relay local train --nproc-per-node N`: the recipe as a group started by torch.distributed.run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relay.cli._launch import Launch, without_launch_flags


def relay(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "relay.cli", *args], capture_output=True, text=True, timeout=600, env=env
    )


def test_the_launcher_flags_are_checked_and_not_passed_on() -> None:
    assert without_launch_flags(
        ["local", "train", "--nproc-per-node", "2", "--nnodes=2", "--node-rank", "1", "--steps", "3"]
    ) == ["local", "train", "--steps", "3"]
    assert Launch(nproc_per_node=0).problem() == (
        "bad --nproc-per-node: 0 (must be at least 1: processes on this host)"
    )
    assert "--rdzv-endpoint is needed" in (Launch(2, nnodes=2).problem() or "")
    assert "bad --node-rank: 2" in (Launch(1, nnodes=2, node_rank=2, rdzv_endpoint="h:1").problem() or "")
    assert "must be HOST:PORT" in (Launch(1, nnodes=2, rdzv_endpoint="nohost").problem() or "")
    command = Launch(4, nnodes=2, node_rank=1, rdzv_endpoint="head:29400").command(["local", "train"])
    assert command[1:3] == ["-m", "torch.distributed.run"]
    assert command[command.index("--rdzv-endpoint") :][:2] == ["--rdzv-endpoint", "head:29400"]


def common_args(dataset: Path, output: Path) -> list[str]:
    return ["local", "train", "--model", "pi05-tiny", "--dataset", str(dataset), "--output-dir", str(output)]


def test_a_batch_smaller_than_the_processes_is_refused_before_starting_them(
    synthetic_dataset_path: Path, tmp_path: Path
) -> None:
    done = relay(*common_args(synthetic_dataset_path, tmp_path), "--nproc-per-node", "4", "--batch-size", "2")
    assert done.returncode == 1
    assert "bad --batch-size: 2 (must be at least the 4 processes" in done.stderr
    assert not tmp_path.joinpath("checkpoints").exists()


@pytest.mark.slow
def test_two_processes_train_with_one_voice_and_write_one_output(
    synthetic_dataset_path: Path, tmp_path: Path
) -> None:
    done = relay(
        *common_args(synthetic_dataset_path, tmp_path),
        "--nproc-per-node",
        "2",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--checkpoint-every",
        "1",
        "--json",
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    # Rank 0 alone prints: the metrics (every 10 steps, and the last) once, one summary.
    assert [e["step"] for e in lines if "grad_norm" in e] == [2]
    assert [e for e in lines if "status" in e] == [
        {"status": "completed", "step": 2, "loss": lines[-1]["loss"], "output_dir": str(tmp_path)}
    ]
    assert (tmp_path / "model.safetensors").is_file()
    manifest = json.loads((tmp_path / "checkpoints" / "step-00000002" / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    assert {Path(name).parts[0] for name in manifest["files"]} == {"state", "rng"}
    assert {name for name in manifest["files"] if name.startswith("rng/")} == {
        "rng/rank-00000.pt",
        "rng/rank-00001.pt",
    }
