"""A training session's settings and the rule for the names of saved weights and states.

One definition for both sides: the SDK checks them before sending, the API parses the create
request with the same class, and the worker checks names again before they become paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, model_validator

from relay import catalog
from relay.catalog import LORA_RANK_DEFAULT
from relay.codec import Codec
from relay.errors import ConfigError
from relay.rules import (
    ABSENT,
    FINETUNE_RULE,
    LORA_ALPHA_RULE,
    LORA_RANK_RULE,
    SESSION_MODEL_RULE,
    TARGETS_RULE,
    CheckedConfig,
    FinetuneMethod,
    LoraAlpha,
    LoraRank,
    SessionModelName,
    TargetNames,
    WholeNumber,
    for_models,
)

ACTION_HORIZON_MAX = 100
SAVED_NAME_MAX = 128
# The file in a saved state's directory that says what it belongs to (model, finetune, targets,
# rank): the worker writes it, the API lists states by it.
STATE_META_FILE = "session.json"

# Sessions once called these `rank` and `alpha`; bodies sent and configs stored with those names are
# still read. (`create_lora_training_client(rank=..., alpha=...)` keeps its published argument names.)
FORMER_NAMES: dict[str, str] = {"rank": "lora_rank", "alpha": "lora_alpha"}

RULES: dict[str, str] = {
    "base_model": SESSION_MODEL_RULE,
    "finetune": FINETUNE_RULE,
    "lora_rank": LORA_RANK_RULE,
    "lora_alpha": LORA_ALPHA_RULE,
    "targets": TARGETS_RULE,
    "action_horizon": f"must be an integer from 1 to {ACTION_HORIZON_MAX}",
    "problem_type": "must be "
    + " or ".join(f'"{p}"' for p in catalog.RELATIONAL_SESSION_PROBLEMS)
    + f' (for {", ".join(catalog.RELATIONAL_MODELS)} sessions; default "binary")',
    "codec": "must be " + " or ".join(f'"{c.value}"' for c in Codec),
}


def with_current_names(config: Mapping[str, Any]) -> dict[str, Any]:
    """A session config (a request body, a stored row) with `rank`/`alpha` renamed `lora_rank`/`lora_alpha`.

    A config that gives both spellings of one setting keeps both, so validation refuses the former
    one as an unknown field rather than choosing between them silently.
    """
    renamed = dict(config)
    for former, current in FORMER_NAMES.items():
        if former in renamed and current not in renamed:
            renamed[current] = renamed.pop(former)
    return renamed


class SessionConfig(CheckedConfig):
    """What a training session trains (docs/sessions.md): fixed for its life."""

    RULES: ClassVar[dict[str, str]] = RULES
    # What _fits_the_family checks, for the JSON Schema: problem_type for rt-j only, which is tuned
    # in full with none of pi05's LoRA and action settings.
    SCHEMA_RULES: ClassVar[tuple[dict[str, Any], ...]] = (
        for_models(catalog.MODELS, {"properties": {"problem_type": ABSENT}}, field="base_model"),
        for_models(
            catalog.RELATIONAL_MODELS,
            {
                "properties": {
                    "finetune": {"const": "full"},
                    "lora_rank": {"const": LORA_RANK_DEFAULT},
                    "lora_alpha": ABSENT,
                    "targets": {"anyOf": [ABSENT, {"const": list(catalog.DEFAULT_FULL_TARGETS)}]},
                    "action_horizon": {"const": catalog.ACTION_HORIZON},
                }
            },
            field="base_model",
        ),
    )
    WHAT: ClassVar[str] = "a session"
    BODY_MESSAGE: ClassVar[str] = "the body must be an object with a session's fields: {fields}"

    base_model: SessionModelName
    finetune: FinetuneMethod = "lora"
    lora_rank: LoraRank = LORA_RANK_DEFAULT
    lora_alpha: LoraAlpha = None
    targets: TargetNames = None
    action_horizon: WholeNumber = Field(catalog.ACTION_HORIZON, strict=True, ge=1, le=ACTION_HORIZON_MAX)
    codec: Codec = Codec.LOSSLESS
    # RT-J sessions only: which task loss forward_backward computes.
    problem_type: catalog.RelationalSessionProblem | None = None

    @model_validator(mode="before")
    @classmethod
    def _former_names(cls, data: Any) -> Any:
        return with_current_names(data) if isinstance(data, Mapping) else data

    @model_validator(mode="after")
    def _fits_the_family(self) -> SessionConfig:
        # Fields of the other family are refused rather than ignored, so nothing is silently dropped.
        if not catalog.is_relational(self.base_model):
            if self.problem_type is not None:
                raise ConfigError(
                    f"bad problem_type: {self.base_model} takes no problem_type (it names an RT-J "
                    f"session's task loss, for {', '.join(catalog.RELATIONAL_MODELS)})",
                    "problem_type",
                )
            return self
        if "finetune" in self.model_fields_set and self.finetune != "full":
            raise ConfigError(
                f'bad finetune: "{self.finetune}" ({self.base_model} is tuned in full: must be "full"; '
                "use create_full_training_client)",
                "finetune",
            )
        pi05_only = {
            "lora_rank": self.lora_rank != LORA_RANK_DEFAULT,
            "lora_alpha": self.lora_alpha is not None,
            "targets": self.targets not in (None, list(catalog.DEFAULT_FULL_TARGETS)),
            "action_horizon": self.action_horizon != catalog.ACTION_HORIZON,
        }
        for field, given in pi05_only.items():
            if given:
                raise ConfigError(
                    f"bad {field}: {self.base_model} takes no {field} (it is tuned in full, on its task's "
                    "loss; the field is for pi05 sessions)",
                    field,
                )
        self.finetune, self.problem_type = "full", self.problem_type or "binary"
        return self

    @model_validator(mode="after")
    def _spell_out_defaults(self) -> SessionConfig:
        # Spelled out so a session shows what it trains, not "default".
        if self.targets is None:
            self.targets = list(catalog.default_targets(self.finetune))
        if self.finetune == "lora" and self.lora_alpha is None:
            self.lora_alpha = float(self.lora_rank)
        return self


STATE_ADDRESS_PREFIX = "relay://states/"


def state_address(name: str) -> str:
    """How a saved state is shown to its owner: ``relay://states/<name>``, an address in their own
    account. Where it lies on the service's disk is the service's business (and a client that was
    shown it might take it for something it could read)."""
    return STATE_ADDRESS_PREFIX + name


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
