"""Sizes and settings of a pi0.5 model: small, serializable, enough to rebuild it.

One code path serves every size. `pi05` is the real model (openpi's gemma_2b + gemma_300m with a
SigLIP So400m/14 tower at 224 px); `pi05-tiny` is the same architecture at openpi's `dummy` sizes
with a small tower and a byte-level tokenizer, for CPUs, the demo and the tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from relay.catalog import ACTION_DIM, ACTION_HORIZON
from relay_engine.errors import ConfigError

PALIGEMMA_VOCAB_SIZE = 257_152
# Byte-level vocabulary: 0 pad, 1 bos, 2 eos, then the 256 byte values.
BYTE_VOCAB_SIZE = 3 + 256


@dataclass(frozen=True)
class VisionSize:
    """A SigLIP vision tower."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int
    image_size: int

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class GemmaSize:
    """A Gemma decoder (openpi's `gemma.Config`)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


SIGLIP_SO400M_224 = VisionSize(
    width=1152, depth=27, mlp_dim=4304, num_heads=16, patch_size=14, image_size=224
)
GEMMA_2B = GemmaSize(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256)
GEMMA_300M = GemmaSize(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256)
GEMMA_DUMMY = GemmaSize(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16)
SIGLIP_TINY = VisionSize(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8, image_size=32)


@dataclass(frozen=True)
class Pi05Config:
    """What a pi0.5 policy is made of. `to_dict`/`from_dict` round-trip it through config.json."""

    model: str
    vision: VisionSize
    language: GemmaSize
    expert: GemmaSize
    vocab_size: int
    # "paligemma" (SentencePiece, from the weights' directory or the Hub) or "bytes".
    tokenizer: str
    # Prompts (task and discretized state) longer than this many tokens are cut.
    max_token_len: int
    action_horizon: int = ACTION_HORIZON
    action_dim: int = ACTION_DIM
    # How many of the action_dim columns are the robot's (the dataset's action width), once known:
    # metadata for whoever serves the weights. The rest are padding, trained towards zero like
    # openpi's, so every sampler integrates all columns alike (see Pi05Policy.sample_actions).
    robot_action_dim: int | None = None
    # Seeds the initial weights of a model built without pretrained ones.
    seed: int = 0
    # How the weights were tuned (finetune, lora_rank, targets...): metadata, not structure.
    tuning: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.action_horizon < 1:
            raise ConfigError(f"action_horizon must be at least 1, got {self.action_horizon}")
        shared = ("depth", "num_heads", "num_kv_heads", "head_dim")
        for name in shared:
            if getattr(self.language, name) != getattr(self.expert, name):
                # The two experts run one attention per layer over their joined tokens.
                raise ConfigError(f"the language model and the action expert must have the same {name}")

    def replace(self, **changes: Any) -> Pi05Config:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Pi05Config:
        try:
            fields = dict(data)
            fields["vision"] = VisionSize(**fields["vision"])
            fields["language"] = GemmaSize(**fields["language"])
            fields["expert"] = GemmaSize(**fields["expert"])
            known = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in fields.items() if k in known})
        except (KeyError, TypeError) as error:
            raise ConfigError(f"config.json does not describe a pi05 model: {error}") from None


def named_config(name: str, *, action_horizon: int = ACTION_HORIZON, seed: int = 0) -> Pi05Config:
    """The config of a base model by name (relay.catalog.MODELS)."""
    if name == "pi05":
        return Pi05Config(
            model="pi05",
            vision=SIGLIP_SO400M_224,
            language=GEMMA_2B,
            expert=GEMMA_300M,
            vocab_size=PALIGEMMA_VOCAB_SIZE,
            tokenizer="paligemma",
            max_token_len=200,
            action_horizon=action_horizon,
            seed=seed,
        )
    if name == "pi05-tiny":
        return Pi05Config(
            model="pi05-tiny",
            vision=SIGLIP_TINY,
            language=GEMMA_DUMMY,
            expert=GEMMA_DUMMY,
            vocab_size=BYTE_VOCAB_SIZE,
            tokenizer="bytes",
            # Bytes are longer than SentencePiece tokens: 32 state values take up to 128.
            max_token_len=256,
            action_horizon=action_horizon,
            seed=seed,
        )
    raise ConfigError(f"unknown model {name!r}; valid models: pi05, pi05-tiny, or an output directory")
