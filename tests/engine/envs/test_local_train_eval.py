"""`relay local train --eval`: a recipe's eval block on the local trainer, the same engine path as a
worker's job: the trained policy run in relay/Dot-v0 at the end, its event in the JSON lines, its
report and video under OUTPUT_DIR/eval/; a block that is not JSON, or breaks a rule, refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relay.env_evaluation import EnvEvalReport
from relay.events import eval_report_path
from relay_engine.datasets import write_synthetic_dataset

pytestmark = pytest.mark.slow


def relay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay.cli", *args], capture_output=True, text=True, timeout=600
    )


def test_relay_local_train_runs_its_eval_block_at_the_end(tmp_path: Path) -> None:
    dataset = write_synthetic_dataset(tmp_path / "dataset", episodes=3, episode_length=(6, 8), seed=4)
    common = ["local", "train", "--model", "pi05-tiny", "--dataset", str(dataset), "--steps", "2"]
    common += ["--batch-size", "2", "--output-dir", str(tmp_path / "run")]
    block = {"env": "relay/Dot-v0", "episodes": 2, "max_steps": 5, "videos": 1}
    done = relay(*common, "--eval", json.dumps(block), "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    evaluated = [line for line in lines if line.get("event") == "eval"]
    assert len(evaluated) == 1 and evaluated[0]["step"] == 2 and evaluated[0]["episodes"] == 2
    assert evaluated[0]["videos"] == ["eval/step-00000002/episode_0000.mp4"]
    report = EnvEvalReport.model_validate_json((tmp_path / "run" / eval_report_path(2)).read_text())
    assert report.success_rate == evaluated[0]["success_rate"] and report.max_steps == 5
    assert (tmp_path / "run" / "eval/step-00000002/episode_0000.mp4").stat().st_size > 0

    not_json = relay(*common, "--eval", "{env: relay/Dot-v0}")
    assert not_json.returncode == 1 and "bad --eval: not JSON" in not_json.stderr
    bad = relay(*common, "--eval", '{"env": "relay/Dot-v0", "episodes": 0}')
    assert bad.returncode == 1 and "bad eval.episodes: 0 (must be an integer from 1 to 1000)" in bad.stderr
