"""lerobot 0.6.1's side of bench_full_size.py: runs in lerobot's own environment (Python 3.12, its own
torch) and uses lerobot's code only.

    python lerobot_full_size_side.py write CHECKPOINT_DIR ROBOT_JSON
    python lerobot_full_size_side.py chunk OUTPUT_DIR INPUTS_NPZ TOKENIZER_DIR

`write`: a full-size pi05 (PaliGemma gemma_2b, action expert gemma_300m, SigLIP So400m) with random
weights, as a team's own lerobot checkpoint would be laid out: `PI05Policy(config).save_pretrained`,
and the pre- and post-processors lerobot saves beside it, for the robot ROBOT_JSON describes
(cameras and their shapes, state and action widths, statistics). lerobot's defaults otherwise: a
chunk of 50 steps, fp32.

`chunk`: loads a Relay output with `PI05Policy.from_pretrained` (a strict load) and its processors,
and prints, as JSON on the last line, the un-normalized chunk lerobot's `predict_action_chunk`
samples for the observation and noise in INPUTS_NPZ. The tokenizer is the one Relay trained with
(TOKENIZER_DIR), handed to lerobot's tokenizer step in place of the gated PaliGemma one.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from lerobot.configs import FeatureType, PolicyFeature
from lerobot.policies.pi05 import processor_pi05
from lerobot.policies.pi05.configuration_pi05 import PI05Config
from lerobot.policies.pi05.modeling_pi05 import PI05Policy
from lerobot.processor import (
    PolicyProcessorPipeline,
    TokenizerProcessorStep,
    policy_action_to_transition,
    transition_to_policy_action,
)


def write(directory: Path, robot_path: Path) -> None:
    robot = json.loads(robot_path.read_text())
    features = {
        camera: PolicyFeature(type=FeatureType.VISUAL, shape=tuple(shape))
        for camera, shape in robot["cameras"].items()
    }
    features["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(robot["state_dim"],))
    config = PI05Config(
        input_features=features,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(robot["action_dim"],))},
        device="cpu",
        push_to_hub=False,
    )
    started = time.monotonic()
    torch.manual_seed(0)
    policy = PI05Policy(config)
    weights = sum(p.numel() for p in policy.parameters())
    built = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(directory)
    saved = time.monotonic()
    del policy
    # The tokenizer step fetches PaliGemma's tokenizer (gated) when built; only its name is saved.
    TokenizerProcessorStep.__post_init__ = lambda self: None  # type: ignore[method-assign]
    stats = {
        key: {name: torch.tensor(values) for name, values in per.items()}
        for key, per in robot["stats"].items()
    }
    preprocessor, postprocessor = processor_pi05.make_pi05_pre_post_processors(config, stats)
    preprocessor.save_pretrained(directory)
    postprocessor.save_pretrained(directory)
    print(
        json.dumps(
            {
                "weights": weights,
                "chunk_size": config.chunk_size,
                "build_seconds": round(built - started, 1),
                "save_seconds": round(saved - built, 1),
            }
        )
    )


def chunk(directory: Path, inputs_path: Path, tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    inputs = np.load(inputs_path)
    started = time.monotonic()
    policy = PI05Policy.from_pretrained(directory)  # strict=True: every tensor, no extra
    policy.eval()
    loaded = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    pre = PolicyProcessorPipeline.from_pretrained(
        directory,
        config_filename="policy_preprocessor.json",
        overrides={"tokenizer_processor": {"tokenizer": tokenizer}},
    )
    post = PolicyProcessorPipeline.from_pretrained(
        directory,
        config_filename="policy_postprocessor.json",
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    cameras = json.loads(str(inputs["cameras"]))
    observation: dict[str, object] = {
        camera: torch.from_numpy(inputs[f"image_{index}"]).permute(2, 0, 1)[None].float() / 255
        for index, camera in enumerate(cameras)
    }
    observation["observation.state"] = torch.from_numpy(inputs["state"])[None].float()
    observation["task"] = [str(inputs["prompt"])]
    with torch.inference_mode():
        actions = post(policy.predict_action_chunk(pre(observation), noise=torch.from_numpy(inputs["noise"])))
    sampled = time.monotonic()
    print(
        json.dumps(
            {
                "load_seconds": round(loaded - started, 1),
                "sample_seconds": round(sampled - loaded, 1),
                "actions": actions[0].tolist(),
            }
        )
    )


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "write":
        write(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) >= 5 and sys.argv[1] == "chunk":
        chunk(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
