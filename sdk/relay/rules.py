"""How Relay's settings objects state a broken rule, and the rules they share.

SFTConfig (a recipe) and SessionConfig (a training session) are CheckedConfigs: built in the SDK
or parsed from a request body by the API, a broken rule raises ConfigError whose message names the
field, the value given and the rule (``bad batch_size: 0 (must be an integer from 1 to 512)``).
The fields both have (the base model, the tuning method, the LoRA rank and alpha, the targets) use
one definition here, defaults included.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
)

from relay import catalog, families
from relay.dataset_names import hide_url_passwords
from relay.errors import ConfigError

# Every model a registered family holds (relay.families: the built-in ones and those packages add).
SESSION_MODEL_RULE = "must be one of " + ", ".join(families.model_names())
FINETUNE_RULE = "must be " + " or ".join(f'"{m}"' for m in catalog.FINETUNE_METHODS)
TARGETS_RULE = "must be a list of targets from: " + ", ".join(catalog.TARGETS)
LORA_RANK_RULE = f"must be an integer from 1 to {catalog.LORA_RANK_MAX}"
LORA_ALPHA_RULE = "must be a number greater than 0; by default, the rank"


def _known_session_model(value: str) -> str:
    if families.family_of(value) is None:
        raise ValueError(SESSION_MODEL_RULE)
    return value


def _known_method(value: str) -> str:
    if value not in catalog.FINETUNE_METHODS:
        raise ValueError(FINETUNE_RULE)
    return value


def _known_targets(value: list[str] | None) -> list[str] | None:
    if value is not None:
        catalog.check_targets(value)
        if len(set(value)) != len(value):
            raise ValueError("each target may appear once")
    return value


def whole_float_to_int(value: Any) -> Any:
    # JSON has one kind of number, and JSON Schema calls 51.0 an integer; so do we.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# The JSON Schema of each type says what its validators enforce, so that the API's OpenAPI document
# accepts exactly what the API does.
SessionModelName = Annotated[
    str,
    AfterValidator(_known_session_model),
    WithJsonSchema({"type": "string", "enum": list(families.model_names())}),
]
FinetuneMethod = Annotated[
    str,
    AfterValidator(_known_method),
    WithJsonSchema({"type": "string", "enum": list(catalog.FINETUNE_METHODS)}),
]
TargetNames = Annotated[
    list[str] | None,
    AfterValidator(_known_targets),
    WithJsonSchema(
        {
            "anyOf": [
                {
                    "type": "array",
                    "items": {"type": "string", "enum": list(catalog.TARGETS)},
                    "minItems": 1,
                    "uniqueItems": True,
                },
                {"type": "null"},
            ]
        }
    ),
]
WholeNumber = Annotated[int, BeforeValidator(whole_float_to_int)]
# Text with no control characters (what has_control_characters refuses), as a JSON Schema pattern.
PLAIN_TEXT_PATTERN = r"^[^\x00-\x1f\x7f]*$"
# The same, with at least one character that is not blank.
NOT_BLANK_TEXT_PATTERN = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"
# The Field before the validator: so the bounds stay in the JSON Schema as minimum and maximum.
LoraRank = Annotated[
    int, Field(strict=True, ge=1, le=catalog.LORA_RANK_MAX), BeforeValidator(whole_float_to_int)
]
# None until the config fills it in with the rank.
LoraAlpha = Annotated[float | None, Field(strict=True, gt=0, allow_inf_nan=False)]


def _rules_in_schema(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """Each field's rule as its description in the JSON schema (/docs, the console's form), and the
    choices of a field that has a fixed set of them."""
    properties = schema.get("properties", {})
    for name, rule in getattr(cls, "RULES", {}).items():
        if name in properties:
            properties[name]["description"] = rule[:1].upper() + rule[1:] + "."
    for name, choices in getattr(cls, "CHOICES", {}).items():
        if name in properties:
            properties[name]["enum"] = list(choices)
    # A default that is the model's own where the model has one (SFTConfig: FamilySpec.model_defaults).
    for model, defaults in getattr(cls, "MODEL_DEFAULTS", {}).items():
        for name, value in defaults.items():
            if name in properties:
                properties[name].setdefault("x-model-defaults", {})[model] = value
    if getattr(cls, "SCHEMA_RULES", None):
        schema["allOf"] = list(cls.SCHEMA_RULES)  # type: ignore[attr-defined]
    # A field the config fills in from another (SFTConfig's dataset_name, from a mixture's datasets):
    # one of the two is required.
    for name, other in getattr(cls, "REQUIRED_UNLESS", {}).items():
        required = schema.get("required", [])
        if name in required:
            required.remove(name)
            given = {"required": [other], "properties": {other: {"not": {"type": "null"}}}}
            schema.setdefault("allOf", []).append({"anyOf": [{"required": [name]}, given]})


def for_models(models: Iterable[str], then: dict[str, Any], field: str = "model") -> dict[str, Any]:
    """A JSON Schema rule for the configs of some models only (``if`` `field` is one of `models`,
    ``then`` `then`): the rules across fields that a config's validators enforce, stated in its
    schema so that the API's OpenAPI document refuses what the API refuses."""
    return {"if": {"properties": {field: {"enum": list(models)}}, "required": [field]}, "then": then}


# A field left out or null.
ABSENT: dict[str, Any] = {"type": "null"}


class CheckedConfig(BaseModel):
    """A pydantic model that refuses unknown fields and raises ConfigError in Relay's words.

    Subclasses set RULES (field -> its rule), WHAT (how messages name the object) and BODY_MESSAGE
    (the message for a body that is not an object; `{fields}` stands for the field names), and
    may set CHOICES (field -> its allowed values, for the JSON schema).
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra=_rules_in_schema)

    RULES: ClassVar[dict[str, str]] = {}
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}
    SCHEMA_RULES: ClassVar[tuple[dict[str, Any], ...]] = ()  # see for_models
    WHAT: ClassVar[str] = "the config"
    BODY_MESSAGE: ClassVar[str] = "the body must be an object"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise type(self).config_error(error, data) from None

    @classmethod
    def default(cls, field: str) -> Any:
        """A field's default: where a CLI option or another settings object offers the same setting,
        it takes its default from here, so each default is declared once."""
        return cls.model_fields[field].get_default(call_default_factory=True)

    @classmethod
    def parse(cls, data: Any) -> Self:
        """Validate a mapping (a request body, a JSON file); raise ConfigError naming the field and rule."""
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise cls.config_error(error, data) from None

    @classmethod
    def problems(cls, errors: Iterable[Mapping[str, Any]], data: Any) -> list[Problem]:
        return problems(
            errors,
            data,
            rules=cls.RULES,
            fields=cls.model_fields,
            what=cls.WHAT,
            body_message=cls.BODY_MESSAGE.format(fields=", ".join(cls.model_fields)),
        )

    @classmethod
    def config_error(cls, error: ValidationError, data: Any) -> ConfigError:
        found = cls.problems(error.errors(include_url=False), data)
        if not found:
            return ConfigError(str(error))
        return ConfigError("; ".join(p.message for p in found), found[0].param, found[0].code)


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
    rules: Mapping[str, str],
    fields: Iterable[str],
    what: str,
    body_message: str,
) -> list[Problem]:
    """Pydantic's errors (``ValidationError.errors()``) in Relay's words: each names the field, the
    value given and the rule. `data` is what was validated; `rules`, `fields`, `what` and
    `body_message` describe the model it was validated as."""
    known = ", ".join(fields)
    found: list[Problem] = []
    for item in errors:
        loc = item.get("loc") or ()
        field = str(loc[0]) if loc else None
        kind = item.get("type", "")
        raised = (item.get("ctx") or {}).get("error")
        if isinstance(raised, ConfigError):  # a checked config itself, validated as a part of something
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


def _show(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    text = hide_url_passwords(text)  # a database URL's password is never shown back
    return text if len(text) <= 80 else text[:77] + "..."


def has_control_characters(text: str) -> bool:
    return any(ord(ch) < 32 or ord(ch) == 127 for ch in text)


def under(error: ConfigError, prefix: str) -> ConfigError:
    """The same error, its field named under `prefix` (``wandb`` + ``project`` = ``wandb.project``)."""
    field = f"{prefix}.{error.param}" if error.param else prefix
    message = error.message.replace(f"bad {error.param}:", f"bad {field}:", 1)
    message = message.replace(f"missing {error.param} ", f"missing {field} ", 1)
    message = message.replace(f"unknown field {error.param} ", f"unknown field {field} ", 1)
    if error.param is None:
        message = message.replace(f"bad {prefix}: bad {prefix}:", f"bad {prefix}:", 1)
    return ConfigError(message, field, error.code)
