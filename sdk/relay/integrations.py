"""A recipe's ``integrations``: the experiment trackers a job also logs to, in OpenAI's shape.

``[{"type": "wandb", "wandb": {"project": "pick", "entity": "team", "name": "run 3", "tags": ["a"]}},
{"type": "tensorboard"}, {"type": "mlflow", "mlflow": {"tracking_uri": "https://mlflow.example",
"experiment": "pick"}}]``: at most one of each type. The engine's recipe run logs the recipe,
every metrics, validation and evaluation event, checkpoints' steps and the final summary to each
(relay_engine.trackers; docs/integrations.md). Pure pydantic: the SDK, the API and the engine
check an integration with the same classes, and a broken rule names its place
(``integrations[0].wandb.project``).

Keys: ``wandb.api_key`` and ``mlflow.token`` may be given with the recipe (SecretStr: masked in
every dump and repr; the SDK's request reveals them under REVEAL_SECRETS); the service keeps them
apart from the stored job (relay_api.tracker_credentials) and the engine's trackers prefer them to
the environment of the process that trains (``WANDB_API_KEY``; ``MLFLOW_TRACKING_TOKEN`` or
``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``). Any other secret field is refused,
and a key is never shown back in a message.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar, Literal, Union
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    SecretStr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_serializer,
    field_validator,
    model_serializer,
)

from relay.errors import ConfigError
from relay.rules import CheckedConfig, under

WANDB = "wandb"
TENSORBOARD = "tensorboard"
MLFLOW = "mlflow"
# The types a recipe may name, in the order the docs list them.
INTEGRATION_TYPES: tuple[str, ...] = (WANDB, TENSORBOARD, MLFLOW)
# The extra that installs every tracker's library (pyproject.toml: relay-intelligence[trackers]).
TRACKERS_EXTRA = "trackers"
# The Python package each type needs on the machine that trains. MLflow's sink speaks the tracking
# server's REST API with httpx, one of Relay's own dependencies: no mlflow package is needed.
TRACKER_PACKAGES: dict[str, str] = {WANDB: "wandb", TENSORBOARD: "tensorboard", MLFLOW: "httpx"}

# W&B's project and entity names: letters, digits, _, - and . (W&B refuses /, \, #, ?, % and :;
# the narrower set here is one every reader of the JSON Schema agrees on).
WANDB_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
WANDB_NAME_MAX = 128
WANDB_RUN_NAME_MAX = 128
WANDB_TAGS_MAX = 20
WANDB_TAG_MAX = 64  # W&B's own limit on a tag
MLFLOW_URI_MAX = 2048
MLFLOW_EXPERIMENT_MAX = 256
MLFLOW_EXPERIMENT_DEFAULT = "relay"
# Text with at least one visible character and no control characters.
VISIBLE_TEXT_PATTERN = r"^[^\x00-\x1f\x7f]*[^\x00-\x20\x7f][^\x00-\x1f\x7f]*$"
# The secrets an integration may name; those it takes (TRACKER_SECRET_VARIABLES: W&B's key, MLflow's
# bearer token) by the environment variable the machine that trains reads each from otherwise.
SECRET_FIELDS = ("api_key", "token", "password")
TRACKER_SECRET_VARIABLES: dict[tuple[str, str], str] = {
    (WANDB, "api_key"): "WANDB_API_KEY",
    (MLFLOW, "token"): "MLFLOW_TRACKING_TOKEN",
}
SECRET_MAX = 512
SECRET_RULE = (
    "a W&B key goes in wandb.api_key and an MLflow token in mlflow.token, or in the environment of "
    "the machine that trains (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and "
    "MLFLOW_TRACKING_PASSWORD)"
)
# No spaces or control characters (what secret_value checks, stated for the JSON Schema too).
SECRET_PATTERN = r"^[^\s\x00-\x1f\x7f]+$"
SECRET_VALUE_RULE = f"must be text of 1 to {SECRET_MAX} characters with no spaces or control characters"
INTEGRATIONS_RULE = (
    "must be a list of at most one integration of each type: "
    '{"type": "wandb", "wandb": {"project", "entity", "name", "tags"}}, {"type": "tensorboard"} or '
    '{"type": "mlflow", "mlflow": {"tracking_uri", "experiment"}}'
)


def _refuse_secrets(data: Any, what: str) -> None:
    # A secret the block does not take, named without its value: the value may be a real key, and
    # messages are shown and logged.
    if isinstance(data, dict):
        for name in SECRET_FIELDS:
            if name in data and (what, name) not in TRACKER_SECRET_VARIABLES:
                raise ConfigError(
                    f"bad {what}.{name}: not taken ({SECRET_RULE})", f"{what}.{name}", "invalid_value"
                )


def secret_value(value: Any, field: str) -> SecretStr | None:
    """A key given with the recipe, checked without ever being shown back (the ConfigError holds no
    part of it): never in a dump, a repr or an answer after (pydantic's SecretStr), and held apart
    from the stored job by the service (docs/integrations.md, "Keys")."""
    if value is None or isinstance(value, SecretStr):
        return value
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= SECRET_MAX
        or re.fullmatch(SECRET_PATTERN, value) is None
    ):
        raise ConfigError(f"bad {field}: not shown ({SECRET_VALUE_RULE})", field, "invalid_value")
    return SecretStr(value)


# The context under which a dump holds a key as given (the SDK's request body), where every other
# dump masks it.
REVEAL_SECRETS = "reveal_secrets"


def _dumped_secret(value: SecretStr | None, info: SerializationInfo) -> str | None:
    if value is None:
        return None
    revealed = isinstance(info.context, dict) and info.context.get(REVEAL_SECRETS)
    return value.get_secret_value() if revealed else str(value)


def _without_empty_secrets(data: Any) -> Any:
    # A block with no key given dumps as it did before keys were taken: without the key's field.
    if isinstance(data, dict):
        for _, field in TRACKER_SECRET_VARIABLES:
            if field in data and data[field] is None:
                del data[field]
    return data


def _secret_field() -> Any:
    return Field(
        None,
        json_schema_extra={
            "writeOnly": True,
            "minLength": 1,
            "maxLength": SECRET_MAX,
            "pattern": SECRET_PATTERN,
        },
    )


class WandbSettings(CheckedConfig):
    """Where a job's W&B run goes: the project (required), the entity (team or user; W&B's default
    for the key otherwise), the run's display name (the job's name, else its id) and tags."""

    RULES: ClassVar[dict[str, str]] = {
        "project": f"must be a W&B project name: 1 to {WANDB_NAME_MAX} letters, digits, _, - or .",
        "entity": (
            f"must be a W&B entity (team or user) name: 1 to {WANDB_NAME_MAX} letters, digits, _, - or ."
        ),
        "name": f"must be text of 1 to {WANDB_RUN_NAME_MAX} characters, no control characters",
        "tags": (
            f"must be a list of at most {WANDB_TAGS_MAX} tags, each 1 to {WANDB_TAG_MAX} characters "
            "with no control characters"
        ),
    }
    WHAT: ClassVar[str] = "wandb"
    BODY_MESSAGE: ClassVar[str] = "bad wandb: must be an object of {fields} (project required)"

    project: str = Field(min_length=1, max_length=WANDB_NAME_MAX, pattern=WANDB_NAME_PATTERN)
    entity: str | None = Field(None, min_length=1, max_length=WANDB_NAME_MAX, pattern=WANDB_NAME_PATTERN)
    name: str | None = Field(None, min_length=1, max_length=WANDB_RUN_NAME_MAX, pattern=VISIBLE_TEXT_PATTERN)
    tags: list[
        Annotated[str, Field(min_length=1, max_length=WANDB_TAG_MAX, pattern=VISIBLE_TEXT_PATTERN)]
    ] = Field(default_factory=list, max_length=WANDB_TAGS_MAX)
    # The W&B API key the run logs with, in place of the worker's WANDB_API_KEY (secret_value).
    api_key: SecretStr | None = _secret_field()

    @field_validator("api_key", mode="before")
    @classmethod
    def _key(cls, value: Any) -> SecretStr | None:
        return secret_value(value, "api_key")

    @field_serializer("api_key", when_used="json")
    def _dump_key(self, value: SecretStr | None, info: SerializationInfo) -> str | None:
        return _dumped_secret(value, info)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _without_empty_secrets(handler(self))


def _http_url(value: str) -> str:
    # Checked here, at create, so that a typo is refused in words and not found by a job's thread.
    # Credentials in the URL are refused: the URL is stored and shown, a password never is.
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL")
    if parts.username or parts.password:
        raise ValueError(
            "holds credentials: the machine that trains reads MLFLOW_TRACKING_TOKEN or "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD from its environment"
        )
    return value


class MlflowSettings(CheckedConfig):
    """Where a job's MLflow run goes: the tracking server's URL (required) and the experiment's
    name (created when absent; ``relay`` by default)."""

    RULES: ClassVar[dict[str, str]] = {
        "tracking_uri": (
            f"must be the tracking server's http(s) URL, at most {MLFLOW_URI_MAX} characters, with no "
            "user or password in it (MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD come from the environment)"
        ),
        "experiment": f"must be text of 1 to {MLFLOW_EXPERIMENT_MAX} characters, no control characters",
    }
    WHAT: ClassVar[str] = "mlflow"
    BODY_MESSAGE: ClassVar[str] = "bad mlflow: must be an object of {fields} (tracking_uri required)"

    tracking_uri: Annotated[
        str,
        # Printable ASCII, no space (an IDN host in its xn-- form): a set that Python's and
        # JSON Schema's regular expressions agree on, unlike \s.
        Field(min_length=1, max_length=MLFLOW_URI_MAX, pattern=r"^https?://[!-~]+$"),
        AfterValidator(_http_url),
    ]
    experiment: str = Field(
        MLFLOW_EXPERIMENT_DEFAULT,
        min_length=1,
        max_length=MLFLOW_EXPERIMENT_MAX,
        pattern=VISIBLE_TEXT_PATTERN,
    )
    # The tracking server's bearer token, in place of the worker's MLFLOW_TRACKING_TOKEN (secret_value).
    token: SecretStr | None = _secret_field()

    @field_validator("token", mode="before")
    @classmethod
    def _token(cls, value: Any) -> SecretStr | None:
        return secret_value(value, "token")

    @field_serializer("token", when_used="json")
    def _dump_token(self, value: SecretStr | None, info: SerializationInfo) -> str | None:
        return _dumped_secret(value, info)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _without_empty_secrets(handler(self))


def _part(cls: type[CheckedConfig], field: str, value: Any) -> Any:
    """Parse `value` as `cls`, its errors naming their place under `field` (``wandb.project``)."""
    if isinstance(value, cls):
        return value
    _refuse_secrets(value, field)
    try:
        return cls.parse(value)
    except ConfigError as error:
        raise under(error, field) from None


class WandbIntegration(CheckedConfig):
    """Log the job to a Weights & Biases run (``type: "wandb"``)."""

    RULES: ClassVar[dict[str, str]] = {
        "type": 'must be "wandb"',
        "wandb": "must be an object: project (required), entity, name, tags",
    }
    WHAT: ClassVar[str] = "a wandb integration"
    BODY_MESSAGE: ClassVar[str] = 'must be {{"type": "wandb", "wandb": {{...}}}}'

    type: Literal["wandb"]
    wandb: Annotated[WandbSettings, BeforeValidator(lambda value: _part(WandbSettings, WANDB, value))]


class MlflowIntegration(CheckedConfig):
    """Log the job to an MLflow run on a tracking server (``type: "mlflow"``)."""

    RULES: ClassVar[dict[str, str]] = {
        "type": 'must be "mlflow"',
        "mlflow": "must be an object: tracking_uri (required), experiment",
    }
    WHAT: ClassVar[str] = "an mlflow integration"
    BODY_MESSAGE: ClassVar[str] = 'must be {{"type": "mlflow", "mlflow": {{...}}}}'

    type: Literal["mlflow"]
    mlflow: Annotated[MlflowSettings, BeforeValidator(lambda value: _part(MlflowSettings, MLFLOW, value))]


class TensorBoardIntegration(CheckedConfig):
    """Write TensorBoard event files among the job's files, under ``tensorboard/`` (``type:
    "tensorboard"``; no settings)."""

    RULES: ClassVar[dict[str, str]] = {"type": 'must be "tensorboard"'}
    WHAT: ClassVar[str] = "a tensorboard integration"
    BODY_MESSAGE: ClassVar[str] = 'must be {{"type": "tensorboard"}}'

    type: Literal["tensorboard"]


Integration = Annotated[
    Union[WandbIntegration, TensorBoardIntegration, MlflowIntegration],  # noqa: UP007 (a discriminated union at runtime)
    Field(discriminator="type"),
]
_CLASSES: dict[str, type[CheckedConfig]] = {
    WANDB: WandbIntegration,
    TENSORBOARD: TensorBoardIntegration,
    MLFLOW: MlflowIntegration,
}


def integrations_value(value: Any) -> list[Any]:
    """SFTConfig's ``integrations``: the list, each entry parsed as its type's class, its errors
    naming their place (``integrations[1].wandb.tags``); a type named twice is refused (two
    writers of one run would each undo the other's steps)."""
    if not isinstance(value, list) or len(value) > len(INTEGRATION_TYPES):
        raise ConfigError(
            f"bad integrations: {_shape(value)} ({INTEGRATIONS_RULE})", "integrations", "invalid_value"
        )
    parsed: list[Any] = []
    for index, item in enumerate(value):
        place = f"integrations[{index}]"
        if isinstance(item, WandbIntegration | TensorBoardIntegration | MlflowIntegration):
            parsed.append(item)
            continue
        kind = item.get("type") if isinstance(item, dict) else None
        if not isinstance(kind, str) or kind not in _CLASSES:
            shown = "an integration without a type" if kind is None else json.dumps(kind)[:40]
            raise ConfigError(
                f"bad {place}.type: {shown} (must be one of {', '.join(INTEGRATION_TYPES)})",
                f"{place}.type",
                "invalid_value",
            )
        _refuse_secrets(item, place)
        try:
            parsed.append(_CLASSES[kind].parse(item))
        except ConfigError as error:
            raise under(error, place) from None
    types = [entry.type for entry in parsed]
    for kind in INTEGRATION_TYPES:
        if types.count(kind) > 1:
            raise ConfigError(
                f"bad integrations: {kind} is named {types.count(kind)} times (at most one of each type)",
                "integrations",
                "invalid_value",
            )
    return parsed


def _shape(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return (
        json.dumps(value)[:40] if isinstance(value, str | int | float | bool | None) else type(value).__name__
    )


# "At most one of each type" is in the field's description, not its JSON Schema: `not` over
# `contains`/`minContains`, the one way to state it, is a part of the schema that readers such as
# schemathesis cannot generate from (tests/service/test_schema_fuzz.py keeps one of each).
Integrations = Annotated[
    list[Integration],
    Field(max_length=len(INTEGRATION_TYPES)),
    BeforeValidator(integrations_value),
]


def tracker_secrets(integrations: list[Any]) -> dict[str, str]:
    """The keys given with a recipe's integrations, by the environment variable each stands for
    (``{"WANDB_API_KEY": ...}``): what the service holds apart from the job."""
    found: dict[str, str] = {}
    for entry in integrations:
        settings = getattr(entry, str(entry.type), None)
        for (kind, field), variable in TRACKER_SECRET_VARIABLES.items():
            secret = getattr(settings, field, None) if entry.type == kind else None
            if isinstance(secret, SecretStr):
                found[variable] = secret.get_secret_value()
    return found


def without_secrets(integrations: list[Any]) -> list[Any]:
    """The integrations with every key taken out: what a stored job keeps."""
    kept = []
    for entry in integrations:
        settings = getattr(entry, str(entry.type), None)
        fields = [field for kind, field in TRACKER_SECRET_VARIABLES if kind == entry.type]
        if settings is not None and fields:
            emptied = settings.model_copy(update=dict.fromkeys(fields))
            entry = entry.model_copy(update={str(entry.type): emptied})
        kept.append(entry)
    return kept


def types_of(integrations: list[Any]) -> list[str]:
    """The types a recipe's integrations name, in its order."""
    return [str(entry.type) for entry in integrations]


def integrations_of_options(
    given: list[str] | None,
    wandb_project: str | None,
    mlflow_uri: str | None = None,
    mlflow_experiment: str | None = None,
) -> list[Any] | None:
    """The CLI's ``--integration`` options (a type with no settings, ``tensorboard``, or an
    integration as JSON), ``--wandb-project P`` (W&B with just a project) and ``--mlflow-uri U``
    with ``--mlflow-experiment E`` (MLflow) as a recipe's ``integrations``; None when none is
    given. ValueError says what is wrong with one."""
    found: list[Any] = []
    for text in given or []:
        stripped = text.strip()
        if stripped.startswith("{"):
            try:
                found.append(json.loads(stripped))
            except json.JSONDecodeError as error:
                raise ValueError(f"bad --integration: not JSON ({error.msg})") from None
        elif stripped == TENSORBOARD:
            found.append({"type": TENSORBOARD})
        elif stripped == MLFLOW:
            raise ValueError(
                "bad --integration: mlflow needs a tracking server: --mlflow-uri URL, or "
                '--integration \'{"type": "mlflow", "mlflow": {"tracking_uri": "URL", "experiment": "E"}}\''
            )
        elif stripped == WANDB:
            raise ValueError(
                "bad --integration: wandb needs a project: --wandb-project PROJECT, or "
                '--integration \'{"type": "wandb", "wandb": {"project": "PROJECT", "entity": "TEAM"}}\''
            )
        else:
            raise ValueError(
                f"bad --integration: {stripped!r} (tensorboard, or an integration as JSON such as "
                '\'{"type": "wandb", "wandb": {"project": "pick"}}\')'
            )
    if wandb_project is not None:
        found.append({"type": WANDB, "wandb": {"project": wandb_project}})
    if mlflow_experiment is not None and mlflow_uri is None:
        raise ValueError("bad --mlflow-experiment: it needs --mlflow-uri, the tracking server's URL")
    if mlflow_uri is not None:
        settings = {"tracking_uri": mlflow_uri}
        if mlflow_experiment is not None:
            settings["experiment"] = mlflow_experiment
        found.append({"type": MLFLOW, "mlflow": settings})
    return found or None


INTEGRATION_OPTION_HELP = (
    "An experiment tracker to log to, repeatable: tensorboard (event files among the outputs), or "
    'an integration as JSON: \'{"type": "wandb", "wandb": {"project": "pick", "entity": "team", '
    '"tags": ["a"]}}\' or \'{"type": "mlflow", "mlflow": {"tracking_uri": "https://mlflow.example", '
    '"experiment": "pick"}}\'. Keys come from the environment where the job trains: WANDB_API_KEY, '
    "MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
    "(docs/integrations.md)."
)
WANDB_PROJECT_OPTION_HELP = (
    "Log to this Weights & Biases project (--integration's wandb with a project only)."
)
MLFLOW_URI_OPTION_HELP = (
    "Log to the MLflow tracking server at this http(s) URL (--integration's mlflow with this "
    "tracking_uri; its experiment is --mlflow-experiment's, else relay)."
)
MLFLOW_EXPERIMENT_OPTION_HELP = "The MLflow experiment of --mlflow-uri's run (created when absent)."
