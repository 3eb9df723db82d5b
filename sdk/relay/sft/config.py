"""SFTConfig: a recipe job's settings, and the one definition of their rules.

The SDK checks a config when it is built; the API parses request bodies with the same class and
answers with the same messages, so a rule is written once. A broken rule reads like
``bad batch_size: 0 (must be an integer from 1 to 512)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from relay import catalog
from relay.errors import ConfigError

BATCH_SIZE_MAX = 512
STEPS_MAX = 100_000
LORA_RANK_MAX = 256
NAME_MAX = 128
DATASET_NAME_MAX = 1024

# What each field must be; every message about a field ends with its rule.
RULES: dict[str, str] = {
    "model": "must be one of " + ", ".join(catalog.MODELS),
    "dataset_name": (
        "must be a LeRobot dataset on the Hugging Face Hub such as lerobot/pusht_image, or a local "
        f"dataset directory: 1 to {DATASET_NAME_MAX} characters, no control characters"
    ),
    "batch_size": f"must be an integer from 1 to {BATCH_SIZE_MAX}",
    "learning_rate": "must be a number greater than 0",
    "steps": f"must be an integer from 1 to {STEPS_MAX:,}",
    "finetune": "must be " + " or ".join(f'"{m}"' for m in catalog.FINETUNE_METHODS),
    "lora_rank": f"must be an integer from 1 to {LORA_RANK_MAX}",
    "lora_alpha": "must be a number greater than 0; by default, the rank",
    "targets": "must be a list of targets from: " + ", ".join(catalog.TARGETS),
    "cameras": (
        "must map model cameras (" + ", ".join(catalog.MODEL_CAMERAS) + ") to dataset feature names"
    ),
    "name": f"must be text of at most {NAME_MAX} characters, no control characters",
}


class SFTConfig(BaseModel):
    """A recipe: the base model, the dataset and a few settings (spec/fine-tuning.md)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    dataset_name: str
    batch_size: int = Field(128, strict=True, ge=1, le=BATCH_SIZE_MAX)
    learning_rate: float = Field(2.5e-5, strict=True, gt=0, allow_inf_nan=False)
    steps: int = Field(6000, strict=True, ge=1, le=STEPS_MAX)
    finetune: str = "lora"
    lora_rank: int = Field(32, strict=True, ge=1, le=LORA_RANK_MAX)
    lora_alpha: float | None = Field(None, strict=True, gt=0, allow_inf_nan=False)
    targets: list[str] | None = None
    cameras: dict[str, str] | None = None
    name: str | None = Field(None, max_length=NAME_MAX)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise config_error(error, data) from None

    @classmethod
    def parse(cls, data: Any) -> SFTConfig:
        """Validate a mapping (a request body, a JSON file); raise ConfigError naming the field and rule."""
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise config_error(error, data) from None

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in catalog.MODELS:
            raise ValueError(RULES["model"])
        return value

    @field_validator("dataset_name")
    @classmethod
    def _plain_dataset_name(cls, value: str) -> str:
        if not value.strip() or len(value) > DATASET_NAME_MAX or _has_control_characters(value):
            raise ValueError(RULES["dataset_name"])
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

    @field_validator("cameras")
    @classmethod
    def _known_cameras(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if not value:
                raise ValueError("must map at least one model camera, or be left out for the dataset's")
            catalog.check_cameras(value)
        return value

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        if value is not None and _has_control_characters(value):
            raise ValueError(RULES["name"])
        return value

    @model_validator(mode="after")
    def _fill_defaults(self) -> SFTConfig:
        # Spelled out so a job shows what it trains with, not "default".
        if self.lora_alpha is None:
            self.lora_alpha = float(self.lora_rank)
        if self.targets is None:
            self.targets = list(catalog.default_targets(self.finetune))
        return self


@dataclass(frozen=True)
class Problem:
    """One broken rule: the field (None for the body as a whole), the message and a short code."""

    param: str | None
    message: str
    code: str


def problems(
    errors: Iterable[Mapping[str, Any]],
    data: Any,
    *,
    rules: Mapping[str, str] = RULES,
    fields: Iterable[str] | None = None,
    what: str = "SFTConfig",
    body_message: str = "the config must be an object with the recipe's fields",
) -> list[Problem]:
    """Pydantic's errors (``ValidationError.errors()``) in Relay's words: each names the field, the
    value given and the rule. `data` is what was validated; `rules`, `fields`, `what` and
    `body_message` describe the model it was validated as (SFTConfig unless said otherwise)."""
    known = ", ".join(fields if fields is not None else SFTConfig.model_fields)
    found: list[Problem] = []
    for item in errors:
        loc = item.get("loc") or ()
        field = str(loc[0]) if loc else None
        kind = item.get("type", "")
        raised = (item.get("ctx") or {}).get("error")
        if isinstance(raised, ConfigError):  # SFTConfig(...) itself, validated as a part of something
            found.append(Problem(raised.param, raised.message, raised.code))
        elif field is None:
            message = body_message
            found.append(Problem(None, message, "invalid_body"))
        elif kind == "extra_forbidden":
            message = f"unknown field {field} ({what}'s fields: {known})"
            found.append(Problem(field, message, "unknown_field"))
        elif kind == "missing":
            message = f"missing {field} (required; it {rules.get(field, 'must be set')})"
            found.append(Problem(field, message, "missing_field"))
        else:
            given = data.get(field, item.get("input")) if isinstance(data, dict) else item.get("input")
            rule = rules.get(field, "")
            if kind == "value_error":
                # Our own validators' and the catalog's messages say the rule already.
                rule = str(item.get("ctx", {}).get("error", "")) or rule
            found.append(Problem(field, f"bad {field}: {_show(given)} ({rule})", "invalid_value"))
    return found


def config_error(error: ValidationError, data: Any, **described: Any) -> ConfigError:
    """A ConfigError from pydantic's; `described` passes on to `problems`."""
    found = problems(error.errors(include_url=False), data, **described)
    if not found:
        return ConfigError(str(error))
    return ConfigError("; ".join(p.message for p in found), found[0].param, found[0].code)


def _show(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _has_control_characters(text: str) -> bool:
    return any(ord(ch) < 32 or ord(ch) == 127 for ch in text)
