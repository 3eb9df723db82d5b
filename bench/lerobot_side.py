"""lerobot 0.6.1's side of bench_lerobot_opens_output.py: runs in lerobot's own environment, opens
Relay's outputs with lerobot's loaders only, and prints one line per check.

    python lerobot_side.py FULL_SIZE_DIR TINY_DIR NUMBERS_JSON
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from lerobot.configs import PreTrainedConfig
from lerobot.policies.pi05.modeling_pi05 import PI05Policy
from lerobot.processor import (
    PolicyProcessorPipeline,
    policy_action_to_transition,
    transition_to_policy_action,
)
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

FAILED: list[str] = []


def check(name: str, run: Callable[[], str]) -> None:
    try:
        detail = run()
        print(f"ok    {name}: {detail}", flush=True)
    except Exception as error:  # a check that fails is reported, and the others still run
        FAILED.append(name)
        print(f"FAIL  {name}: {type(error).__name__}: {error}", flush=True)
        traceback.print_exc(limit=2)


def config_parses(directory: Path) -> str:
    config = PreTrainedConfig.from_pretrained(directory)
    return f"{type(config).__name__}, cameras {list(config.image_features)}, chunk {config.chunk_size}"


def strict_load_fits(directory: Path) -> str:
    """What `PI05Policy.from_pretrained` does with a model.safetensors, done with tensors of the shapes
    Relay writes on the meta device: lerobot's key fixes, its "model." prefix, a strict load."""
    config = PreTrainedConfig.from_pretrained(directory)
    config.device = "meta"
    with torch.device("meta"):
        policy = PI05Policy(config)
        shapes = json.loads((directory / "tensors.json").read_text())
        ours = {name: torch.empty(shape) for name, shape in shapes.items()}
    fixed = policy._fix_pytorch_state_dict_keys(ours, policy.config)
    prefixed = {key if key.startswith("model.") else f"model.{key}": value for key, value in fixed.items()}
    result = policy.load_state_dict(prefixed, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise AssertionError(f"missing {result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}")
    weights = sum(int(np.prod(shape)) for shape in shapes.values()) / 1e9
    return f"a strict load takes all {len(shapes)} tensors ({weights:.2f} B weights)"


def offline_tokenizer() -> PreTrainedTokenizerFast:
    """Any tokenizer will do to build the pipeline offline (PaliGemma's needs the Hub)."""
    tokenizer = Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>")


def processors_match(directory: Path, numbers: dict[str, list]) -> str:
    post = PolicyProcessorPipeline.from_pretrained(
        directory,
        config_filename="policy_postprocessor.json",
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    chunk = post(torch.tensor(numbers["normalized_chunk"]))
    action_error = float((chunk - torch.tensor(numbers["chunk"])).abs().max())
    pre = PolicyProcessorPipeline.from_pretrained(
        directory,
        config_filename="policy_preprocessor.json",
        overrides={"tokenizer_processor": {"tokenizer": offline_tokenizer()}},
    )
    state = torch.tensor(numbers["state"][0])
    cameras = [k for k, v in pre.steps[3].features.items() if v.type.value == "VISUAL"]
    images = {camera: torch.zeros(3, *pre.steps[3].features[camera].shape[1:]) for camera in cameras}
    out = pre({"observation.state": state, **images, "task": "reach"})
    state_error = float((out["observation.state"] - torch.tensor(numbers["normalized_state"])).abs().max())
    if action_error > 1e-5 or state_error > 1e-5:
        raise AssertionError(f"unnormalized actions differ by {action_error:.2e}, state by {state_error:.2e}")
    return f"actions within {action_error:.1e} of Relay's, normalized state within {state_error:.1e}"


def main() -> None:
    full, tiny, numbers_path = (Path(arg) for arg in sys.argv[1:4])
    numbers = json.loads(numbers_path.read_text())
    check("pi05: PreTrainedConfig.from_pretrained(OUT)", lambda: config_parses(full))
    check("pi05: PI05Policy(config) takes exactly Relay's tensors", lambda: strict_load_fits(full))
    check("pi05: both processors load and normalize as Relay does", lambda: processors_match(full, numbers))
    check(
        "pi05-tiny: both processors load and normalize as Relay does", lambda: processors_match(tiny, numbers)
    )
    print(f"{4 - len(FAILED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
