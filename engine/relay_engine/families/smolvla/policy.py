"""SmolVLA as a policy on lerobot's batches: its image processing (resize keeping the aspect ratio,
padded on the left and top, then [0, 1] -> [-1, 1]), the state and actions padded to 32, the loss
over the steps inside the episode, and the chunk cut to the robot's action width. Its weights are
lerobot's files: `config.json` and `model.safetensors`, loaded strictly."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from relay_engine.errors import ConfigError
from relay_engine.families.smolvla.config import SmolVLAConfig, backbone_config, read_lerobot_config
from relay_engine.families.smolvla.model import PrefixInputs, SmolVLAFlow
from relay_engine.models.weights import exported_state_dict

STATE = "observation.state"
ACTION = "action"
ACTION_IS_PAD = "action_is_pad"
TOKENS = "observation.language.tokens"
TOKEN_MASK = "observation.language.attention_mask"


def resize_with_left_top_pad(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, C, H, W) images resized (bilinear) to fit height x width without distortion, the rest
    filled with 0 on the left and the top, as SmolVLA was trained."""
    current_height, current_width = images.shape[2:]
    if (current_height, current_width) == (height, width):
        return images
    ratio = max(current_width / width, current_height / height)
    resized = F.interpolate(
        images,
        size=(int(current_height / ratio), int(current_width / ratio)),
        mode="bilinear",
        align_corners=False,
    )
    return F.pad(resized, (width - resized.shape[3], 0, height - resized.shape[2], 0), value=0.0)


def pad_last(x: torch.Tensor, width: int) -> torch.Tensor:
    return x if x.shape[-1] >= width else F.pad(x, (0, width - x.shape[-1]))


class SmolVLAPolicy(nn.Module):
    """The model (`self.model`, as lerobot names it) and the robot it acts for: its cameras, in
    order, and its action width."""

    def __init__(
        self,
        config: SmolVLAConfig,
        backbone_dir: Path | None,
        cameras: Sequence[str],
        action_dim: int,
    ) -> None:
        super().__init__()
        if not cameras:
            raise ConfigError("SmolVLA needs at least one camera")
        self.config = config
        self.cameras = tuple(cameras)
        self.action_dim = action_dim
        self.model = SmolVLAFlow(config, backbone_config(config, backbone_dir))
        # lerobot's config.json, for a policy read from lerobot's files (written back with its weights).
        self.lerobot_config: dict[str, Any] | None = None

    @classmethod
    def from_lerobot(cls, directory: Path, backbone_dir: Path | None = None) -> SmolVLAPolicy:
        """A policy lerobot saved (`SmolVLAPolicy.save_pretrained`): its config.json and weights."""
        policy = cls.from_lerobot_config(directory, backbone_dir)
        policy.load_state_dict(load_file(str(directory / "model.safetensors")), strict=True)
        return policy

    @classmethod
    def from_lerobot_config(cls, directory: Path, backbone_dir: Path | None = None) -> SmolVLAPolicy:
        """The network lerobot's config.json in `directory` describes, its weights freshly drawn."""
        config = read_lerobot_config(directory)
        data = json.loads((directory / "config.json").read_text())
        try:
            cameras = [key for key, feature in data["input_features"].items() if feature["type"] == "VISUAL"]
            action_dim = int(data["output_features"][ACTION]["shape"][0])
        except (KeyError, TypeError, ValueError, IndexError):
            raise ConfigError(
                f"{directory}/config.json: its input and output features are not lerobot's"
            ) from None
        policy = cls(config, backbone_dir, cameras, action_dim)
        policy.lerobot_config = data
        return policy

    def for_robot(self, cameras: Mapping[str, tuple[int, int, int]], state_dim: int, action_dim: int) -> None:
        """Act for another robot (what a job's dataset records): its cameras, by name, with their
        (3, height, width), and its state and action widths. The weights do not change: every
        camera goes through the same vision tower, and state and actions are padded to 32."""
        from relay_engine.families.smolvla.files import for_robot

        for name, width in (("state", state_dim), ("action", action_dim)):
            limit = self.config.max_state_dim if name == "state" else self.config.max_action_dim
            if width > limit:
                raise ConfigError(f"the robot's {name} is {width} wide; SmolVLA takes at most {limit}")
        self.cameras = tuple(cameras)
        self.action_dim = action_dim
        if self.lerobot_config is not None:
            self.lerobot_config = for_robot(self.lerobot_config, dict(cameras), state_dim, action_dim)

    def save_lerobot(self, directory: Path) -> None:
        """lerobot's files for this policy: the config.json it was loaded with and its weights,
        under lerobot's names (`SmolVLAPolicy.from_pretrained` loads them strictly)."""
        if self.lerobot_config is None:
            raise ConfigError(
                "this SmolVLA was not loaded from lerobot's files; it has no config.json to write"
            )
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(self.lerobot_config, indent=4) + "\n")
        # LoRA adapters (relay_engine.families.smolvla.tuning) merged in, under the base's names.
        weights = {name: tensor.contiguous() for name, tensor in exported_state_dict(self).items()}
        save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})

    def trainable(self) -> list[nn.Parameter]:
        """What lerobot trains by default (`train_expert_only`, `freeze_vision_encoder`,
        `train_state_proj`): the expert, the action and time projections and the state projection;
        the backbone stays as it is. A policy tuned with LoRA trains its adapters only."""
        adapters = [p for name, p in self.named_parameters() if ".lora_" in name]
        if adapters:
            return adapters
        joint = self.model.vlm_with_expert
        frozen: set[int] = set()
        if self.config.train_expert_only:
            frozen |= {id(p) for p in joint.vlm.parameters()}
        else:
            if self.config.freeze_vision_encoder:
                frozen |= {id(p) for p in joint.vlm.model.vision_model.parameters()}
            # What never reaches the loss stays as it is, as lerobot leaves it: the language head,
            # the final norm, and the last layer (the last two where the expert skips layers).
            unused = [joint.vlm.lm_head, joint.text_model.norm, joint.text_model.layers[-1]]
            if joint.layers_per_expert_layer > 1:
                unused.append(joint.text_model.layers[-2])
            frozen |= {id(p) for module in unused for p in module.parameters()}
        if not self.config.train_state_proj:
            frozen |= {id(p) for p in self.model.state_proj.parameters()}
        return [p for p in self.parameters() if id(p) not in frozen]

    def _inputs(self, batch: Mapping[str, torch.Tensor]) -> PrefixInputs:
        width, height = self.config.resize_imgs_with_padding
        images = [
            resize_with_left_top_pad(batch[camera], height, width) * 2.0 - 1.0 for camera in self.cameras
        ]
        masks = [torch.ones(image.shape[0], dtype=torch.bool, device=image.device) for image in images]
        state = pad_last(batch[STATE], self.config.max_state_dim)
        return PrefixInputs(images, masks, batch[TOKENS], batch[TOKEN_MASK].bool(), state)

    def loss(
        self,
        batch: Mapping[str, torch.Tensor],
        noise: torch.Tensor,
        time: torch.Tensor,
        reduction: str = "mean",
    ) -> torch.Tensor:
        """The flow-matching loss over the real action dimensions of the steps inside the episode:
        their mean, or each sample's (`reduction="none"`)."""
        actions = pad_last(batch[ACTION], self.config.max_action_dim)
        losses = self.model.losses(self._inputs(batch), actions, noise, time)[:, :, : self.action_dim]
        inside = (
            ~batch[ACTION_IS_PAD]
            if ACTION_IS_PAD in batch
            else torch.ones_like(losses[:, :, 0], dtype=torch.bool)
        )
        losses = losses * inside[:, :, None]
        if reduction == "none":
            counts = (inside.sum(dim=1) * self.action_dim).clamp_min(1)
            return losses.sum(dim=(1, 2)) / counts
        return losses.sum() / (inside.sum() * self.action_dim).clamp_min(1)

    @torch.no_grad()
    def predict_chunk(self, batch: Mapping[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        """The chunk (B, chunk, action width) sampled from `noise` (B, chunk, max_action_dim)."""
        return self.model.sample(self._inputs(batch), noise)[:, :, : self.action_dim]

    @torch.no_grad()
    def sample_padded(
        self, batch: Mapping[str, torch.Tensor], noise: torch.Tensor, num_steps: int | None = None
    ) -> torch.Tensor:
        """The chunk over all max_action_dim columns (the padding ones are trained towards 0)."""
        return self.model.sample(self._inputs(batch), noise, num_steps)
