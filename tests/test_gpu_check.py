"""bench/gpu_check.sh, the one call a lent GPU machine gets, must run there on the first try: every
stage is run here on the CPU at pi05-tiny's sizes (the same scripts and code paths), and asking for
CUDA where there is none is one sentence, not a traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
STAGES = ("lora", "full", "train", "from_checkpoint", "latency")


def run_check(tmp_path: Path, **env: str) -> tuple[int, str]:
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "OUT": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
def test_every_stage_runs_on_the_cpu(tmp_path: Path) -> None:
    code, printed = run_check(tmp_path, RELAY_GPU_CHECK_DEVICE="cpu")
    summary = (tmp_path / "summary.txt").read_text()
    assert code == 0, printed
    for stage in STAGES:
        assert f"{stage}: ok in " in summary, summary
        assert (tmp_path / f"{stage}.log").is_file()
    assert "samples/s" in (tmp_path / "lora.log").read_text()
    assert "camera(s)" in (tmp_path / "latency.log").read_text()


def test_cuda_without_a_gpu_is_one_sentence(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the check would run")
    code, printed = run_check(tmp_path, RELAY_GPU_CHECK_STAGES="lora")
    assert code == 2
    assert "setup: no CUDA GPU is available to PyTorch here" in printed
    assert "Traceback" not in printed
