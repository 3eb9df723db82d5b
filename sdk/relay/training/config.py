"""A training session's settings and the rule for the names of saved weights and states.

One definition for both sides: the SDK checks them before sending, the API parses the create
request with the same class, and the worker checks names again before they become paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, model_validator

from relay import catalog, families
from relay.catalog import LORA_RANK_DEFAULT
from relay.checkpoints import (
    FROM_CHECKPOINT_RULE,
    FromCheckpoint,
)
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
    + f" (for {', '.join(families.models_where(lambda s: 'problem_type' in s.session_fields))} sessions; "
    + 'default "binary")',
    "codec": "must be " + " or ".join(f'"{c.value}"' for c in Codec),
    "from_checkpoint": FROM_CHECKPOINT_RULE,
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


def _schema_rules() -> tuple[dict[str, Any], ...]:
    """What _fits_the_family checks, for the JSON Schema: problem_type only where the family takes
    it; a family tuned one way (rt-j, in full) takes none of pi05's LoRA and action settings."""
    takes_no_problem_type = families.models_where(lambda spec: "problem_type" not in spec.session_fields)
    rules = [for_models(takes_no_problem_type, {"properties": {"problem_type": ABSENT}}, field="base_model")]
    for spec in families.family_specs():
        ways = spec.recipe_ways
        if ways is None:
            continue
        properties: dict[str, Any] = {
            "from_checkpoint": ABSENT,
            "finetune": {"enum": list(ways)},
            "targets": {"anyOf": [ABSENT, {"const": list(catalog.DEFAULT_FULL_TARGETS)}]},
            "action_horizon": {"const": catalog.ACTION_HORIZON},
        }
        no_adapters = {"properties": {"lora_rank": {"const": LORA_RANK_DEFAULT}, "lora_alpha": ABSENT}}
        then: dict[str, Any] = {"properties": properties}
        if "lora" in ways:  # LoRA settings only with finetune "lora" (the family's default is full)
            then.update({"if": {"properties": {"finetune": {"const": "lora"}}, "required": ["finetune"]}})
            then["else"] = no_adapters
        else:
            properties.update(no_adapters["properties"])
        rules.append(for_models(spec.models, then, field="base_model"))
    return tuple(rules)


class SessionConfig(CheckedConfig):
    """What a training session trains (docs/sessions.md): fixed for its life."""

    RULES: ClassVar[dict[str, str]] = RULES
    SCHEMA_RULES: ClassVar[tuple[dict[str, Any], ...]] = _schema_rules()
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
    # pi05 sessions: the weights to start from instead of the base's (a recipe's from_checkpoint: a
    # Hub repo[@revision], a directory or a completed fine-tune's id); base_model is the architecture.
    from_checkpoint: FromCheckpoint = None

    @model_validator(mode="before")
    @classmethod
    def _former_names(cls, data: Any) -> Any:
        return with_current_names(data) if isinstance(data, Mapping) else data

    @model_validator(mode="after")
    def _fits_the_family(self) -> SessionConfig:
        # Fields of the other family are refused rather than ignored, so nothing is silently dropped.
        spec = families.family_of(self.base_model)
        assert spec is not None  # SessionModelName
        if "problem_type" not in spec.session_fields:
            if self.problem_type is not None:
                takers = families.models_where(lambda other: "problem_type" in other.session_fields)
                raise ConfigError(
                    f"bad problem_type: {self.base_model} takes no problem_type (it names an RT-J "
                    f"session's task loss, for {', '.join(takers)})",
                    "problem_type",
                )
        elif self.problem_type is None:
            self.problem_type = spec.session_fields["problem_type"]
        ways = spec.recipe_ways
        if ways is None:
            return self
        if "finetune" not in self.model_fields_set:
            assert spec.finetune is not None  # a family that names its ways names its default
            self.finetune = spec.finetune
        elif self.finetune not in ways:
            assert spec.finetune is not None
            raise ConfigError(
                f'bad finetune: "{self.finetune}" ({self.base_model} is tuned in {spec.finetune}: must be '
                f'"{spec.finetune}"; use create_{spec.finetune}_training_client)',
                "finetune",
            )
        self._refuse_policy_settings(ways)
        return self

    def _refuse_policy_settings(self, ways: tuple[str, ...]) -> None:
        # A family that chooses where training goes (SmolVLA, RT-J) takes none of pi05's targets,
        # checkpoints and action settings; its LoRA settings only where it tunes with LoRA.
        lora = self.finetune == "lora"
        pi05_only = {
            "from_checkpoint": self.from_checkpoint is not None,
            "lora_rank": self.lora_rank != LORA_RANK_DEFAULT and not lora,
            "lora_alpha": self.lora_alpha is not None and not lora,
            "targets": self.targets not in (None, list(catalog.DEFAULT_FULL_TARGETS)),
            "action_horizon": self.action_horizon != catalog.ACTION_HORIZON,
        }
        way = " or ".join(f'"{w}"' for w in ways)
        for field, given in pi05_only.items():
            if given:
                if len(ways) == 1:
                    why = f"it is tuned one way, finetune {way}; the field is for pi05 sessions"
                elif field.startswith("lora"):
                    why = f'finetune "{self.finetune}" has no adapters; use create_lora_training_client'
                else:
                    why = "the field is for pi05 sessions"
                raise ConfigError(f"bad {field}: {self.base_model} takes no {field} ({why})", field)

    @model_validator(mode="after")
    def _spell_out_defaults(self) -> SessionConfig:
        # Spelled out so a session shows what it trains, not "default".
        if self.targets is None:
            spec = families.family_of(self.base_model)
            # A family that chooses its own places (SmolVLA's LoRA included) shows "all" of its choice.
            chooses = spec is not None and spec.recipe_ways is not None
            self.targets = list(catalog.default_targets("full" if chooses else self.finetune))
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
