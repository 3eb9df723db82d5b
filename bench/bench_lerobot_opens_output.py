"""Does lerobot 0.6.1 open what Relay writes, with no extra code? Not a test: it needs lerobot, which
needs Python 3.12 and its own torch, so it runs in a separate environment (made on first use):

    python bench/bench_lerobot_opens_output.py [--lerobot-python PATH] [--steps 20]

This process (Relay's environment) makes two outputs:
- `tiny/`: a real one, `pi05-tiny` fine-tuned for a few steps on a synthetic two-camera dataset by
  Relay's Trainer (every file a job's output has);
- `pi05/`: the files of a full-size `pi05` output for the same robot (lerobot's config.json, the
  processors, Relay's relay_config.json), and the names and shapes of the tensors its
  model.safetensors would hold, built on the meta device (the weights themselves are 13 GB in fp32,
  and lerobot loading them takes twice that: more than this machine's memory).

Then lerobot's own loaders, in lerobot's environment (bench/lerobot_side.py), open them:
`PreTrainedConfig.from_pretrained`, `PI05Policy` built from that config (on the meta device) with
exactly the tensors Relay writes (what `from_pretrained`'s strict load needs), and
`PolicyProcessorPipeline.from_pretrained` for both processors, whose normalization must give Relay's
numbers. It prints one line per check and exits non-zero if any fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from relay_engine import Trainer, TrainingArguments, load_policy, open_dataset
from relay_engine.datasets.synth import write_synthetic_dataset
from relay_engine.models import build_policy
from relay_engine.models.lerobot_files import RobotFeatures, write_lerobot_config, write_processors
from relay_engine.models.weights import exported_state_dict, to_lerobot_state_dict

HERE = Path(__file__).resolve().parent
DEFAULT_VENV = HERE.parent / ".venv-lerobot"
LEROBOT = "lerobot[pi]==0.6.1"
# lerobot 0.6.1 wants torch below 2.12; PyPI's Linux wheel of 2.11 is the CUDA build (it runs on a CPU).
LEROBOT_TORCH = "torch==2.11.0"


def lerobot_python(given: str | None) -> Path:
    if given:
        return Path(given)
    python = DEFAULT_VENV / "bin" / "python"
    if not python.exists():
        print(f"making lerobot's environment in {DEFAULT_VENV} (Python 3.12; a few GB, minutes)", flush=True)
        env = {**os.environ, "PYENV_VERSION": "3.12.1"}
        subprocess.run(["python3.12", "-m", "venv", str(DEFAULT_VENV)], check=True, env=env)
        subprocess.run([str(python), "-m", "pip", "install", "-q", LEROBOT_TORCH, LEROBOT], check=True)
    return python


TWO_CAMERAS = {"observation.images.top": (64, 64), "observation.images.wrist": (48, 48)}


def make_tiny_output(root: Path, steps: int, cameras: dict[str, tuple[int, int]] = TWO_CAMERAS) -> Path:
    """`pi05-tiny` trained `steps` steps on a synthetic dataset with these cameras (in `root`)."""
    data = write_synthetic_dataset(root / "dataset", episodes=8, episode_length=(10, 14), cameras=cameras)
    dataset = open_dataset(str(data))
    out = root / "tiny"
    args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=4)
    Trainer(model=load_policy("pi05-tiny"), args=args, train_dataset=dataset).train()
    return out


def make_full_size_files(root: Path) -> Path:
    """A full-size output's files for the tiny output's robot, and the tensors it would hold."""
    dataset = open_dataset(str(root / "dataset"))
    out = root / "pi05"
    out.mkdir()
    policy = build_policy("pi05", device="meta")
    features = RobotFeatures.of(dataset)
    write_lerobot_config(out, policy.config, features)
    write_processors(out, policy.config, features, dataset.norm_stats)
    tensors = to_lerobot_state_dict(exported_state_dict(policy))
    shapes = {name: list(tensor.shape) for name, tensor in tensors.items()}
    (out / "tensors.json").write_text(json.dumps(shapes))
    return out


def expected_numbers(root: Path) -> Path:
    """A state and a normalized action chunk, with what Relay makes of them, for lerobot to match."""
    dataset = open_dataset(str(root / "dataset"))
    rng = np.random.default_rng(0)
    state = rng.normal(size=(1, dataset.summary.state_dim)).astype(np.float32)
    chunk = rng.uniform(-1, 1, size=(1, 10, dataset.summary.action_dim)).astype(np.float32)
    numbers = {
        "state": state.tolist(),
        "normalized_state": dataset.norm_stats.normalize_state(state).tolist(),
        "normalized_chunk": chunk.tolist(),
        "chunk": dataset.norm_stats.unnormalize_actions(chunk).tolist(),
    }
    path = root / "numbers.json"
    path.write_text(json.dumps(numbers))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lerobot-python", help="a Python with lerobot 0.6.1 installed")
    parser.add_argument("--steps", type=int, default=20)
    options = parser.parse_args()
    torch.manual_seed(0)
    python = lerobot_python(options.lerobot_python)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tiny = make_tiny_output(root, options.steps)
        full = make_full_size_files(root)
        numbers = expected_numbers(root)
        print(f"Relay wrote {sorted(p.name for p in tiny.iterdir() if p.is_file())}", flush=True)
        side = [str(python), str(HERE / "lerobot_side.py"), str(full), str(tiny), str(numbers)]
        done = subprocess.run(side, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
