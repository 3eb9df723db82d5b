"""A training session's settings and the rule for the names of saved weights and states.

One definition for both sides: the SDK checks them before sending, the API parses the create
request with the same class, and the worker checks names again before they become paths.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from relay import catalog
from relay.codec import Codec
from relay.errors import ConfigError
from relay.sft.config import LORA_RANK_MAX, config_error

ACTION_HORIZON_MAX = 100
SAVED_NAME_MAX = 128

RULES: dict[str, str] = {
    "base_model": "must be one of " + ", ".join(catalog.MODELS),
    "finetune": "must be " + " or ".join(f'"{m}"' for m in catalog.FINETUNE_METHODS),
    "rank": f"must be an integer from 1 to {LORA_RANK_MAX}",
    "alpha": "must be a number greater than 0; by default, the rank",
    "targets": "must be a list of targets from: " + ", ".join(catalog.TARGETS),
    "action_horizon": f"must be an integer from 1 to {ACTION_HORIZON_MAX}",
    "codec": "must be " + " or ".join(f'"{c.value}"' for c in Codec),
}


class SessionConfig(BaseModel):
    """What a training session trains (spec/training-loops.md, "Sessions"): fixed for its life."""

    model_config = ConfigDict(extra="forbid")

    base_model: str
    finetune: str = "lora"
    rank: int = Field(32, strict=True, ge=1, le=LORA_RANK_MAX)
    alpha: float | None = Field(None, gt=0, allow_inf_nan=False)
    targets: list[str] | None = None
    action_horizon: int = Field(10, strict=True, ge=1, le=ACTION_HORIZON_MAX)
    codec: Codec = Codec.LOSSLESS

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise _error(error, data) from None

    @classmethod
    def parse(cls, data: Any) -> SessionConfig:
        """Validate a request body; raise ConfigError naming the field and the rule."""
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise _error(error, data) from None

    @field_validator("base_model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in catalog.MODELS:
            raise ValueError(RULES["base_model"])
        return value

    @field_validator("finetune")
    @classmethod
    def _known_method(cls, value: str) -> str:
        if value not in catalog.FINETUNE_METHODS:
            raise ValueError(RULES["finetune"])
        return value

    @field_validator("targets")
    @classmethod
    def _known_targets(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            catalog.check_targets(value)
            if len(set(value)) != len(value):
                raise ValueError("each target may appear once")
        return value

    @model_validator(mode="after")
    def _spell_out_defaults(self) -> SessionConfig:
        # Spelled out so a session shows what it trains, not "default".
        if self.targets is None:
            self.targets = list(catalog.default_targets(self.finetune))
        if self.finetune == "lora" and self.alpha is None:
            self.alpha = float(self.rank)
        return self


def _error(error: ValidationError, data: Any) -> ConfigError:
    return config_error(
        error,
        data,
        rules=RULES,
        fields=SessionConfig.model_fields,
        what="a session",
        body_message="the body must be an object with a session's fields: "
        + ", ".join(SessionConfig.model_fields),
    )


def check_name(name: Any, what: str = "name") -> str:
    """A name for saved weights or a saved state, which becomes a directory name on the server.

    Raise ConfigError (a ValueError) naming the rule: no slash (or backslash), no leading dot,
    1 to 128 characters, no control characters.
    """
    rule = (
        f"a name can't contain a slash or start with a dot; 1 to {SAVED_NAME_MAX} characters, "
        "no control characters"
    )
    if not isinstance(name, str):
        raise ConfigError(f"bad {what}: {name!r} (must be text: {rule})", param=what)
    if (
        not name
        or len(name) > SAVED_NAME_MAX
        or name.startswith(".")
        or "/" in name
        or "\\" in name
        or any(ord(ch) < 32 or ord(ch) == 127 for ch in name)
    ):
        raise ConfigError(f"bad {what}: {name!r} ({rule})", param=what)
    return name
