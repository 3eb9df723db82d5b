"""SFTConfig: a recipe job's settings, and the one definition of their rules.

The SDK checks a config when it is built; the API parses request bodies with the same class and
answers with the same messages, so a rule is written once. A broken rule reads like
``bad batch_size: 0 (must be an integer from 1 to 512)``.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BeforeValidator, Field, field_validator, model_validator

from relay import catalog
from relay._rules import (
    FINETUNE_RULE,
    LORA_ALPHA_RULE,
    LORA_RANK_RULE,
    MODEL_RULE,
    NOT_BLANK_TEXT_PATTERN,
    PLAIN_TEXT_PATTERN,
    TARGETS_RULE,
    CheckedConfig,
    FinetuneMethod,
    LoraAlpha,
    LoraRank,
    ModelName,
    TargetNames,
    WholeNumber,
    has_control_characters,
    whole_float_to_int,
)
from relay.catalog import LORA_RANK_DEFAULT

BATCH_SIZE_MAX = 512
GPUS_MAX = 64
STEPS_MAX = 100_000
NAME_MAX = 128
DATASET_NAME_MAX = 1024

# What each field must be; every message about a field ends with its rule.
RULES: dict[str, str] = {
    "model": MODEL_RULE,
    "dataset_name": (
        "must be a LeRobot dataset on the Hugging Face Hub such as lerobot/pusht_image, or a local "
        f"dataset directory: 1 to {DATASET_NAME_MAX} characters, no control characters"
    ),
    "batch_size": f"must be an integer from 1 to {BATCH_SIZE_MAX}",
    "learning_rate": "must be a number greater than 0",
    "steps": f"must be an integer from 1 to {STEPS_MAX:,}",
    "finetune": FINETUNE_RULE,
    "lora_rank": LORA_RANK_RULE,
    "lora_alpha": LORA_ALPHA_RULE,
    "targets": TARGETS_RULE,
    "cameras": ("must map model cameras (" + ", ".join(catalog.MODEL_CAMERAS) + ") to dataset feature names"),
    "name": f"must be text of at most {NAME_MAX} characters, no control characters",
    "gpus": (
        f"must be an integer from 1 to {GPUS_MAX}, at most batch_size; by default 1 for lora and all "
        "the GPUs of one worker host for full"
    ),
}


GpuCount = Annotated[int, Field(strict=True, ge=1, le=GPUS_MAX), BeforeValidator(whole_float_to_int)]


class SFTConfig(CheckedConfig):
    """A recipe: the base model, the dataset and a few settings (docs/recipe-jobs.md).

    The one declaration of a recipe's defaults: the engine's Recipe is built from a validated
    SFTConfig, and `relay local train`'s options take their defaults from here (``SFTConfig.default``).
    """

    RULES: ClassVar[dict[str, str]] = RULES
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "model": catalog.MODELS,
        "finetune": catalog.FINETUNE_METHODS,
    }
    WHAT: ClassVar[str] = "SFTConfig"
    BODY_MESSAGE: ClassVar[str] = "the config must be an object with the recipe's fields"

    model: ModelName
    dataset_name: str = Field(min_length=1, max_length=DATASET_NAME_MAX, pattern=NOT_BLANK_TEXT_PATTERN)
    batch_size: WholeNumber = Field(128, strict=True, ge=1, le=BATCH_SIZE_MAX)
    learning_rate: float = Field(2.5e-5, strict=True, gt=0, allow_inf_nan=False)
    steps: WholeNumber = Field(6000, strict=True, ge=1, le=STEPS_MAX)
    finetune: FinetuneMethod = "lora"
    lora_rank: LoraRank = LORA_RANK_DEFAULT
    lora_alpha: LoraAlpha = None
    targets: TargetNames = None
    cameras: dict[str, str] | None = Field(
        None,
        json_schema_extra={
            "minProperties": 1,
            "propertyNames": {"enum": list(catalog.MODEL_CAMERAS)},
            "additionalProperties": {"type": "string", "minLength": 1, "pattern": PLAIN_TEXT_PATTERN},
        },
    )
    name: str | None = Field(None, max_length=NAME_MAX, pattern=PLAIN_TEXT_PATTERN)
    # One process per GPU; the global batch stays batch_size, split across them.
    gpus: (
        Annotated[int, Field(strict=True, ge=1, le=GPUS_MAX), BeforeValidator(whole_float_to_int)] | None
    ) = None

    @field_validator("dataset_name")
    @classmethod
    def _plain_dataset_name(cls, value: str) -> str:
        if not value.strip() or len(value) > DATASET_NAME_MAX or has_control_characters(value):
            raise ValueError(RULES["dataset_name"])
        return value

    @field_validator("cameras")
    @classmethod
    def _known_cameras(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if not value:
                raise ValueError("must map at least one model camera, or be left out for the dataset's")
            if any(has_control_characters(name) for name in (*value, *value.values())):
                raise ValueError(RULES["cameras"] + ", with no control characters")
            catalog.check_cameras(value)
        return value

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        if value is not None and has_control_characters(value):
            raise ValueError(RULES["name"])
        return value

    @model_validator(mode="after")
    def _fill_defaults(self) -> SFTConfig:
        # Spelled out so a job shows what it trains with, not "default".
        if self.lora_alpha is None:
            self.lora_alpha = float(self.lora_rank)
        if self.targets is None:
            self.targets = list(catalog.default_targets(self.finetune))
        if self.gpus is None and self.finetune == "lora":
            self.gpus = 1  # full's default depends on the workers' hosts: the service fills it in
        if self.gpus is not None and self.gpus > self.batch_size:
            raise ValueError(f"bad gpus: {self.gpus} ({RULES['gpus']}, {self.batch_size})")
        return self
