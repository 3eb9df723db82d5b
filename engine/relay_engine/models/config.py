"""Sizes and settings of a pi0.5 model: small, serializable, enough to rebuild it.

One code path serves every size. `pi05` is the real model (openpi's gemma_2b + gemma_300m with a
SigLIP So400m/14 tower at 224 px); `pi05-tiny` is the same architecture at openpi's `dummy` sizes
with a small tower and a byte-level tokenizer, for CPUs, the demo and the tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from relay.catalog import ACTION_DIM, ACTION_HORIZON

# The sizes are defined once, torch-free, in the SDK (the API's memory plan reads them too).
from relay.pi05_layout import (
    BYTE_VOCAB_SIZE,
    GEMMA_2B,
    GEMMA_300M,
    GEMMA_DUMMY,
    NAMED_SIZES,
    PALIGEMMA_VOCAB_SIZE,
    SIGLIP_SO400M_224,
    SIGLIP_TINY,
    GemmaSize,
    VisionSize,
)
from relay_engine.errors import ConfigError

__all__ = [
    "BYTE_VOCAB_SIZE",
    "GEMMA_2B",
    "GEMMA_300M",
    "GEMMA_DUMMY",
    "PALIGEMMA_VOCAB_SIZE",
    "SIGLIP_SO400M_224",
    "SIGLIP_TINY",
    "GemmaSize",
    "Pi05Config",
    "VisionSize",
    "named_config",
]


@dataclass(frozen=True)
class Pi05Config:
    """What a pi0.5 policy is made of. `to_dict`/`from_dict` round-trip it through config.json."""

    # The family, as acting and serving report it (relay_engine.acting.ActingPolicy's config).
    family: ClassVar[str] = "pi05"

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
    # Whether training weighs the robot's own columns' error as much as all padding columns' together
    # (see flow_matching_loss). Training only: the weights sample the same either way.
    balance_padding: bool = True
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
    sizes = NAMED_SIZES.get(name)
    if sizes is not None:
        return Pi05Config(
            model=name,
            vision=sizes.vision,
            language=sizes.language,
            expert=sizes.expert,
            vocab_size=sizes.vocab_size,
            tokenizer=sizes.tokenizer,
            max_token_len=sizes.max_token_len,
            action_horizon=action_horizon,
            seed=seed,
        )
    raise ConfigError(f"unknown model {name!r}; valid models: pi05, pi05-tiny, or an output directory")
