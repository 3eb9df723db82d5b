"""SmolVLA's processing, as lerobot 0.6.1's processors do it (`make_smolvla_pre_post_processors`):
the task ended with a newline and tokenized by the backbone's tokenizer (right-padded to the longest
prompt, at most `tokenizer_max_length` tokens), the state and the actions normalized by the
dataset's mean and standard deviation, images passed as they are ([0, 1], resized by the policy);
and back, the sampled actions in the robot's units."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from relay_engine.errors import ConfigError
from relay_engine.families.smolvla.config import SmolVLAConfig
from relay_engine.families.smolvla.policy import ACTION, ACTION_IS_PAD, STATE, TOKEN_MASK, TOKENS

# lerobot's NormalizerProcessorStep: x' = (x - mean) / (std + eps); back: x = x' * std + mean.
EPSILON = 1e-8


def load_tokenizer(directory: Path) -> Any:
    """The backbone's tokenizer from a local directory (SmolVLM2's tokenizer.json and
    tokenizer_config.json); a missing one is said plainly, and nothing is fetched."""
    from transformers import AutoTokenizer

    if not (directory / "tokenizer_config.json").is_file():
        raise ConfigError(
            f"SmolVLA's tokenizer is missing: {directory}/tokenizer_config.json does not exist "
            "(lerobot reads it from the backbone's Hub repo; Relay reads a local copy of that repo's "
            "tokenizer files)"
        )
    return AutoTokenizer.from_pretrained(str(directory))


class SmolVLAProcessor:
    """What a SmolVLA policy reads, from a robot's raw observations and actions, and back."""

    def __init__(
        self,
        config: SmolVLAConfig,
        tokenizer: Any,
        stats: Mapping[str, Mapping[str, Sequence[float]]],
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        try:
            self.mean = {
                key: torch.tensor(stats[key]["mean"], dtype=torch.float32) for key in (STATE, ACTION)
            }
            self.std = {key: torch.tensor(stats[key]["std"], dtype=torch.float32) for key in (STATE, ACTION)}
        except KeyError as missing:
            raise ConfigError(f"SmolVLA normalizes by mean and std: the statistics lack {missing}") from None

    def normalize(self, key: str, values: torch.Tensor) -> torch.Tensor:
        return (values - self.mean[key]) / (self.std[key] + EPSILON)

    def robot_actions(self, chunk: torch.Tensor) -> torch.Tensor:
        """Sampled actions (normalized) in the robot's units."""
        return chunk * self.std[ACTION] + self.mean[ACTION]

    def tokenize(self, tasks: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, mask) of the tasks, each ended with a newline."""
        prompts = [task if task.endswith("\n") else task + "\n" for task in tasks]
        encoded = self.tokenizer(
            prompts,
            max_length=self.config.tokenizer_max_length,
            truncation=True,
            padding=self.config.pad_language_to,
            padding_side="right",
            return_tensors="pt",
        )
        return encoded["input_ids"], encoded["attention_mask"].to(torch.bool)

    def batch(
        self,
        images: Mapping[str, torch.Tensor],
        state: torch.Tensor,
        tasks: Sequence[str],
        actions: torch.Tensor | None = None,
        action_is_pad: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """A batch as the policy reads it: camera -> (B, 3, H, W) in [0, 1], the raw state (B, d),
        one task per sample, and for training the raw actions (B, chunk, d) and which steps are
        past the episode's end."""
        tokens, mask = self.tokenize(tasks)
        batch = {**images, STATE: self.normalize(STATE, state), TOKENS: tokens, TOKEN_MASK: mask}
        if actions is not None:
            batch[ACTION] = self.normalize(ACTION, actions)
        if action_is_pad is not None:
            batch[ACTION_IS_PAD] = action_is_pad
        return batch
