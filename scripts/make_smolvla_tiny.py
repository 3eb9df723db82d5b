"""Write the smolvla-tiny base (engine/relay_engine/families/smolvla/tiny/): SmolVLA's network at
tiny sizes with Relay's random initialization (seed 0), as lerobot's files (config.json and
model.safetensors), and the tiny backbone it is built from (vlm/: a SmolVLM2 configuration, 4
language layers of width 64 and a 2-layer vision tower at 32x32 images, and a 300-token byte-level
BPE tokenizer; the ones tests/fixtures/make_lerobot_smolvla.py wrote with lerobot's code).

Unlike pi05-tiny it is not pretrained: a job on it trains the expert and the projections over a
random backbone, whose image and text features are fixed random ones.

    .venv/bin/python scripts/make_smolvla_tiny.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from relay_engine.families.smolvla.files import TINY_BASE_DIR, lerobot_config
from relay_engine.families.smolvla.policy import SmolVLAPolicy

ROOT = Path(__file__).resolve().parent.parent
BACKBONE_SOURCE = ROOT / "tests/fixtures/lerobot-smolvla/vlm"
SEED = 0


def main() -> None:
    out = TINY_BASE_DIR
    (out / "vlm").mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(BACKBONE_SOURCE / name, out / "vlm" / name)
    data = lerobot_config(
        cameras={"observation.images.base": (3, 32, 32)}, state_dim=32, action_dim=32, vlm_model_name="vlm"
    )
    data.update(chunk_size=10, n_action_steps=10, resize_imgs_with_padding=[32, 32], num_vlm_layers=4)
    (out / "config.json").write_text(json.dumps(data, indent=4) + "\n")
    torch.manual_seed(SEED)
    policy = SmolVLAPolicy.from_lerobot_config(out, backbone_dir=out / "vlm")
    weights = {name: tensor.detach().contiguous() for name, tensor in policy.state_dict().items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600; the package ships it readable
    print(f"wrote {out}: {sum(t.numel() for t in weights.values()):,} weights")


if __name__ == "__main__":
    main()
