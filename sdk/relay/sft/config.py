"""SFTConfig: a recipe job's settings, and the one definition of their rules.

The SDK checks a config when it is built; the API parses request bodies with the same class and
answers with the same messages, so a rule is written once. A broken rule reads like
``bad batch_size: 0 (must be an integer from 1 to 512)``.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, PlainValidator, WithJsonSchema, field_validator, model_validator

from relay import catalog, families
from relay.catalog import LORA_RANK_DEFAULT
from relay.checkpoints import (
    FROM_CHECKPOINT_RULE,
    NORMALIZATION_RULE,
    NORMALIZATIONS,
    REVISION_CHARACTER,
    FromCheckpoint,
)
from relay.dataset_mixture import (
    DATASETS_RULE,
    MIXTURE_MAX,
    MIXTURE_MIN,
    MixtureDataset,
    check_camera_map,
    datasets_value,
)
from relay.dataset_names import (
    DATASET_NAME_PATTERN,
    LEROBOT_DATASET_NAME_PATTERN,
    LOCAL_DISK_NAME_PATTERN,
    MALFORMED_URL_RULE,
    is_dataset_name,
    is_malformed_url,
    is_relational_source,
    names_local_directory,
)
from relay.env_evaluation import JobEval, check_job_eval_budget, job_eval_value
from relay.episodes import VALIDATION_EPISODES_RULE, VALIDATION_EPISODES_SCHEMA, validation_episodes_value
from relay.errors import ConfigError
from relay.hub_target import HUB_RULE, HubTarget, hub_value
from relay.integrations import INTEGRATIONS_RULE, Integrations
from relay.rules import (
    ABSENT,
    FINETUNE_RULE,
    LORA_ALPHA_RULE,
    LORA_RANK_RULE,
    PLAIN_TEXT_PATTERN,
    TARGETS_RULE,
    CheckedConfig,
    FinetuneMethod,
    LoraAlpha,
    LoraRank,
    TargetNames,
    WholeNumber,
    for_models,
    has_control_characters,
    whole_float_to_int,
)

BATCH_SIZE_MAX = 512
# Steps between a job's checkpoints, unless the service (RELAY_CHECKPOINT_EVERY) or `relay local
# train --checkpoint-every` says otherwise: what an eval block's at_checkpoints is budgeted with here.
CHECKPOINT_EVERY_DEFAULT = 1000
GPUS_MAX = 64
STEPS_MAX = 100_000
NAME_MAX = 128
DATASET_NAME_MAX = 1024
# A Hub branch or tag name is far shorter; a commit sha is 40 characters.
DATASET_REVISION_MAX = 256
TASK_MAX = 128
# A revision: no spaces or control characters (relay.checkpoints.REVISION_CHARACTER says why).
REVISION_PATTERN = rf"^{REVISION_CHARACTER}+$"
# An absolute path (or ~/...) with no control characters.
ABSOLUTE_PATH_PATTERN = r"^[/~][^\x00-\x1f\x7f]*$"
RECIPE_MODEL_RULE = "must be one of " + ", ".join(families.model_names())

# What each field must be; every message about a field ends with its rule.
RULES: dict[str, str] = {
    "model": RECIPE_MODEL_RULE,
    "dataset_name": (
        "must be a LeRobot dataset on the Hugging Face Hub such as lerobot/pusht_image, or a local "
        "dataset directory (for rt-j models: a relational database directory), or a database URL such "
        "as sqlite:///shop.db or postgresql://host/db, or a RelBench dataset such as relbench:rel-f1 "
        "(rt-j models); a Hub repo id is owner/name (each part letters, digits, _, - and ., no .. or "
        "--), a local directory an absolute path, ~/..., ./... or ../...: "
        f"1 to {DATASET_NAME_MAX} characters, no control characters"
    ),
    "dataset_revision": (
        "must name a branch, tag or commit of the dataset's Hub repo (by default v2.1, else a v3.0 "
        f"default branch): 1 to {DATASET_REVISION_MAX} characters, no spaces or control characters"
    ),
    "datasets": DATASETS_RULE,
    "task": (
        f"must name a task table of the database (rt-j models only): 1 to {TASK_MAX} characters, "
        "no control characters"
    ),
    "tasks_dir": (
        "must name a directory holding the database's tasks (rt-j models only): a schema.json with a "
        "tasks section and <task>/train.parquet, val, test splits; an absolute path (/data/shop-tasks, "
        f"or ~/...), 1 to {DATASET_NAME_MAX} characters, no control characters"
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
    "validation_episodes": VALIDATION_EPISODES_RULE,
    "from_checkpoint": FROM_CHECKPOINT_RULE,
    "normalization": NORMALIZATION_RULE,
    "eval": "must be null or an object: env (required), episodes, seed, max_steps, at_checkpoints, videos",
    "integrations": INTEGRATIONS_RULE,
    "hub": HUB_RULE,
}


# Episodes held out of training and scored at each checkpoint (relay.episodes; default: none).
ValidationEpisodes = Annotated[
    list[int] | float | str | None,
    PlainValidator(validation_episodes_value),
    WithJsonSchema(VALIDATION_EPISODES_SCHEMA),
]
GpuCount = Annotated[int, Field(strict=True, ge=1, le=GPUS_MAX), BeforeValidator(whole_float_to_int)]


def _schema_rules() -> tuple[dict[str, Any], ...]:
    """What _fits_the_family checks, for the JSON Schema: a task only where the family takes one,
    the fields a family refuses, and the limits of a family that forces its finetune and runs in
    one process."""
    rules = [
        for_models(
            families.models_where(lambda spec: spec.task == "refused"), {"properties": {"task": ABSENT}}
        ),
        # A family that reads no database (pi05) takes a LeRobot dataset's name only.
        for_models(
            families.models_where(lambda spec: spec.recognizes_data is None),
            {"properties": {"dataset_name": {"pattern": LEROBOT_DATASET_NAME_PATTERN}}},
        ),
    ]
    # A dataset on the training machine's disk has no revisions (_revision_of_a_hub_dataset).
    rules.append(
        {
            "if": {
                "properties": {"dataset_name": {"pattern": LOCAL_DISK_NAME_PATTERN}},
                "required": ["dataset_name"],
            },
            "then": {"properties": {"dataset_revision": ABSENT}},
        }
    )
    # A mixture gives each dataset its own revision and cameras (_one_or_a_mixture).
    rules.append(
        {
            "if": {"properties": {"datasets": {"type": "array"}}, "required": ["datasets"]},
            "then": {"properties": {"dataset_revision": ABSENT, "cameras": ABSENT}},
        }
    )
    # The checkpoint's statistics need a checkpoint (_normalization_of_a_checkpoint).
    rules.append(
        {
            "if": {"properties": {"normalization": {"const": "checkpoint"}}, "required": ["normalization"]},
            "then": {"required": ["from_checkpoint"], "properties": {"from_checkpoint": {"type": "string"}}},
        }
    )
    for spec in families.family_specs():
        # The fields of other families (_refuse_fields): absent, or what the model fills in anyway.
        untaken = {field: _absent_or_filled(field, spec) for field in _untaken(spec)}
        if untaken and spec.task != "required":
            rules.append(for_models(spec.models, {"properties": untaken}))
    for spec in families.family_specs():
        if spec.task != "required":
            continue
        properties: dict[str, Any] = {"task": {"type": "string"}}
        if spec.recipe_ways is not None:
            properties["finetune"] = {"enum": list(spec.recipe_ways)}
        if spec.max_gpus is not None:
            properties["gpus"] = {"enum": [*range(1, spec.max_gpus + 1), None]}
        properties.update({field: _absent_or_filled(field, spec) for field in _untaken(spec)})
        rules.append(for_models(spec.models, {"required": ["task"], "properties": properties}))
    return tuple(rules)


def _untaken(spec: families.FamilySpec) -> list[str]:
    return [field for field in families.FAMILY_RECIPE_FIELDS if field not in spec.recipe_fields]


def _absent_or_filled(field: str, spec: families.FamilySpec) -> dict[str, Any]:
    """What a request may hold in a field the family does not take: nothing, or the value its
    model has anyway (a stored job's config, filled in, sent back)."""
    if field == "targets":
        return {"anyOf": [ABSENT, {"const": list(catalog.DEFAULT_FULL_TARGETS)}]}
    default = families.model_defaults(spec.models[0]).get(field, SFTConfig.model_fields[field].default)
    return ABSENT if default is None else {"anyOf": [ABSENT, {"const": default}]}


class SFTConfig(CheckedConfig):
    """A recipe: the base model, the dataset and a few settings (docs/recipe-jobs.md).

    The one declaration of a recipe's defaults: the engine's Recipe is built from a validated
    SFTConfig, and `relay local train`'s options take their defaults from here (``SFTConfig.default``).
    The field defaults are the spec's (pi05's); a model with defaults of its own
    (``relay.families``, ``FamilySpec.model_defaults``: pi05-tiny's finetune, learning_rate and
    batch_size) gets those for the fields a config leaves out, filled in before validation, so a
    stored job holds the values it trains with.
    """

    RULES: ClassVar[dict[str, str]] = RULES
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "model": families.model_names(),
        "finetune": catalog.FINETUNE_METHODS,
        "normalization": NORMALIZATIONS,
    }
    MODEL_DEFAULTS: ClassVar[dict[str, dict[str, Any]]] = {
        model: dict(defaults)
        for spec in families.family_specs()
        for model, defaults in spec.model_defaults.items()
    }
    # Set below the class: the rules read its fields' defaults (_absent_or_filled).
    SCHEMA_RULES: ClassVar[tuple[dict[str, Any], ...]] = ()
    WHAT: ClassVar[str] = "SFTConfig"
    # A mixture's dataset_name is filled in from its datasets (_mixture_dataset_name).
    REQUIRED_UNLESS: ClassVar[dict[str, str]] = {"dataset_name": "datasets"}
    BODY_MESSAGE: ClassVar[str] = "the config must be an object with the recipe's fields"

    model: str
    # The pattern is checked by _known_dataset_name_form (a malformed URL first, never shown back).
    dataset_name: str = Field(
        min_length=1, max_length=DATASET_NAME_MAX, json_schema_extra={"pattern": DATASET_NAME_PATTERN}
    )
    # Which revision of a Hub dataset to read; None: v2.1, else a v3.0 default branch (docs/datasets.md).
    dataset_revision: str | None = Field(
        None, min_length=1, max_length=DATASET_REVISION_MAX, pattern=REVISION_PATTERN
    )
    # Several LeRobot datasets trained on together, each with its share of the samples
    # (relay.dataset_mixture; docs/datasets.md). dataset_name is then the first of them (filled in).
    datasets: Annotated[list[MixtureDataset] | None, BeforeValidator(datasets_value)] = Field(
        None, json_schema_extra={"minItems": MIXTURE_MIN, "maxItems": MIXTURE_MAX}
    )
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
    task: str | None = Field(None, min_length=1, max_length=TASK_MAX, pattern=PLAIN_TEXT_PATTERN)
    # Where the database's tasks are kept when apart from it (rt-j): schema.json's tasks and splits.
    # Absolute: the machine that trains may run anywhere (the CLIs resolve a relative one first).
    tasks_dir: str | None = Field(
        None, min_length=1, max_length=DATASET_NAME_MAX, pattern=ABSOLUTE_PATH_PATTERN
    )
    validation_episodes: ValidationEpisodes = None
    eval: Annotated[JobEval | None, BeforeValidator(job_eval_value)] = None
    # The weights to start from instead of the model's base (relay.checkpoints): a Hub repo[@revision],
    # a local directory or a completed fine-tune's id. `model` stays the architecture.
    from_checkpoint: FromCheckpoint = None
    # Whose statistics normalize states and actions: the new dataset's, or from_checkpoint's own.
    normalization: Literal["dataset", "checkpoint"] = "dataset"
    # The experiment trackers the run also logs to (relay.integrations; docs/integrations.md), for
    # every family: they read the run's events, whatever trains.
    integrations: Integrations = Field(default_factory=list)
    # Where the worker pushes the output, with a model card, once the job completes (relay.hub_target;
    # docs/recipe-jobs.md); for every family. Not the token: that is the worker's HF_TOKEN.
    hub: Annotated[HubTarget | None, BeforeValidator(hub_value)] = None

    @classmethod
    def default(cls, field: str, model: str | None = None) -> Any:
        """A field's default for `model` (without one: the spec's, pi05's)."""
        return families.model_defaults(model).get(field, super().default(field))

    @classmethod
    def default_text(cls, field: str) -> str:
        """A field's defaults for a help text: the spec's, then each model's own ("128; pi05-tiny: 16")."""
        own = [f"{m}: {d[field]}" for m, d in cls.MODEL_DEFAULTS.items() if field in d]
        return "; ".join([str(cls.default(field)), *own])

    @model_validator(mode="before")
    @classmethod
    def _model_defaults(cls, data: Any) -> Any:
        # The model's own defaults fill the fields left out; a field given (even null) is kept.
        if not isinstance(data, dict):
            return data
        return {**families.model_defaults(data.get("model")), **_mixture_dataset_name(data)}

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if families.family_of(value) is None:
            raise ValueError(RECIPE_MODEL_RULE)
        return value

    @field_validator("task")
    @classmethod
    def _plain_task(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or has_control_characters(value)):
            raise ValueError(RULES["task"])
        return value

    @field_validator("tasks_dir")
    @classmethod
    def _plain_tasks_dir(cls, value: str | None) -> str | None:
        if value is not None and re.fullmatch(ABSOLUTE_PATH_PATTERN, value) is None:
            raise ValueError(RULES["tasks_dir"])
        return value

    @field_validator("dataset_name")
    @classmethod
    def _known_dataset_name_form(cls, value: str) -> str:
        # relay.dataset_names' one rule of what a dataset name may be; a URL that does not parse is
        # refused without being shown (it may hold a password), before any other rule quotes it.
        if is_malformed_url(value):
            raise ConfigError(f"bad dataset_name: {MALFORMED_URL_RULE}", "dataset_name", "invalid_value")
        if len(value) > DATASET_NAME_MAX or not is_dataset_name(value):
            raise ValueError(RULES["dataset_name"])
        return value

    @field_validator("dataset_revision")
    @classmethod
    def _plain_dataset_revision(cls, value: str | None) -> str | None:
        if value is not None and (
            len(value) > DATASET_REVISION_MAX or not re.fullmatch(REVISION_PATTERN, value)
        ):
            raise ValueError(RULES["dataset_revision"])
        return value

    @field_validator("cameras")
    @classmethod
    def _known_cameras(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return check_camera_map(value)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        if value is not None and has_control_characters(value):
            raise ValueError(RULES["name"])
        return value

    @model_validator(mode="after")
    def _fits_the_family(self) -> SFTConfig:
        # Fields of the other family are refused rather than ignored, so nothing is silently dropped.
        spec = families.family_of(self.model)
        assert spec is not None  # _known_model
        if spec.task == "refused":
            if self.task is not None:
                raise ConfigError(
                    f"bad task: {self.model} takes no task (task names a relational database's task table, "
                    f"for {', '.join(families.models_where(lambda other: other.task == 'required'))})",
                    "task",
                    "invalid_value",
                )
        elif self.task is None:
            raise ConfigError(
                f"missing task (required for {self.model}; it {RULES['task']})", "task", "missing_field"
            )
        self._refuse_fields(spec)
        self._one_or_a_mixture()
        self._database_url_of_a_relational_model(spec)
        self._revision_of_a_hub_dataset()
        self._normalization_of_a_checkpoint()
        self._fit_finetune(spec)
        self._fit_gpus(spec)
        # At the default cadence; the API and the engine ask again at the one they checkpoint at.
        check_job_eval_budget(self.eval, self.steps, CHECKPOINT_EVERY_DEFAULT)
        return self

    def _refuse_fields(self, spec: families.FamilySpec) -> None:
        # Opt-in: a field of some families that this one does not take is refused when given, unless
        # it holds what this model would fill in anyway (a config read back from a stored job).
        for field in families.FAMILY_RECIPE_FIELDS:
            if field in spec.recipe_fields or field not in self.model_fields_set or self._as_filled(field):
                continue
            takers = families.models_where(lambda other, f=field: f in other.recipe_fields)  # type: ignore[misc]
            why = spec.refused_fields.get(field) or f"{field} is for {', '.join(takers) or 'no model'}"
            raise ConfigError(f"bad {field}: {self.model} takes no {field} ({why})", field, "invalid_value")

    def _one_or_a_mixture(self) -> None:
        # A mixture's dataset_name is its first dataset's (filled in); a different one, or the single
        # dataset's revision or cameras beside a mixture, would leave which one trains unclear.
        if self.datasets is None:
            return
        if self.dataset_name != self.datasets[0].name:
            raise ConfigError(
                f"bad dataset_name: {json.dumps(self.dataset_name)} (with datasets, dataset_name is the "
                f"first of them, {json.dumps(self.datasets[0].name)}: leave it out, or give one dataset "
                "as dataset_name and no datasets)",
                "dataset_name",
                "invalid_value",
            )
        for field in ("dataset_revision", "cameras"):
            if getattr(self, field) is not None:
                own = "revision" if field == "dataset_revision" else "cameras"
                raise ConfigError(
                    f"bad {field}: a mixture gives each dataset its own {own} (datasets[i].{own}); leave "
                    f"{field} out",
                    field,
                    "invalid_value",
                )

    def _as_filled(self, field: str) -> bool:
        """Whether a field holds its empty value or what `_fill_defaults` writes for this model."""
        value = getattr(self, field)
        filled = {
            "targets": list(catalog.DEFAULT_FULL_TARGETS),
            "lora_alpha": float(self.lora_rank),
        }
        return value is None or value == self.default(field, self.model) or value == filled.get(field)

    def _database_url_of_a_relational_model(self, spec: families.FamilySpec) -> None:
        if spec.recognizes_data is None and is_relational_source(self.dataset_name):
            relational = ", ".join(families.models_where(lambda other: other.recognizes_data is not None))
            raise ConfigError(
                f"bad dataset_name: {self.model} trains on LeRobot datasets; a database URL or RelBench "
                f"name is read by {relational}",
                "dataset_name",
                "invalid_value",
            )

    def _revision_of_a_hub_dataset(self) -> None:
        if self.dataset_revision is not None and names_local_directory(self.dataset_name):
            raise ConfigError(
                f"bad dataset_revision: {json.dumps(self.dataset_revision)} (dataset_name names a local "
                "directory, which has no revisions; a revision is a branch, tag or commit of a Hub "
                "dataset repo)",
                "dataset_revision",
                "invalid_value",
            )

    def _normalization_of_a_checkpoint(self) -> None:
        if self.normalization == "checkpoint" and self.from_checkpoint is None:
            raise ConfigError(
                'bad normalization: "checkpoint" uses the statistics of the from_checkpoint weights, '
                'and no from_checkpoint is given (leave normalization out, or "dataset", for the '
                "dataset's own)",
                "normalization",
                "invalid_value",
            )

    def _fit_finetune(self, spec: families.FamilySpec) -> None:
        ways = spec.recipe_ways
        if ways is None:
            return
        if "finetune" not in self.model_fields_set:
            assert spec.finetune is not None  # recipe_ways: a family that names its ways names its default
            self.finetune = spec.finetune
        elif self.finetune not in ways:
            rule = (
                f'must be "{ways[0]}"' if len(ways) == 1 else "must be " + " or ".join(f'"{w}"' for w in ways)
            )
            raise ConfigError(
                f'bad finetune: "{self.finetune}" ({self.model} is tuned in {" or ".join(ways)}: {rule})',
                "finetune",
                "invalid_value",
            )

    def _fit_gpus(self, spec: families.FamilySpec) -> None:
        if spec.max_gpus is None:
            return
        if self.gpus is not None and self.gpus > spec.max_gpus:
            why = (
                "run in one process: gpus must be 1"
                if spec.one_process
                else f"take at most {spec.max_gpus} gpus"
            )
            raise ConfigError(f"bad gpus: {self.gpus} ({self.model} jobs {why})", "gpus", "invalid_value")
        if spec.one_process:
            self.gpus = 1

    @model_validator(mode="after")
    def _fill_defaults(self) -> SFTConfig:
        # Spelled out so a job shows what it trains with, not "default".
        if self.lora_alpha is None:
            self.lora_alpha = float(self.lora_rank)
        if self.targets is None:
            spec = families.family_of(self.model)
            # A family that chooses its own targets (SmolVLA's LoRA included) shows "all" of its choice.
            refused = spec is not None and "targets" in spec.refused_fields
            self.targets = list(catalog.default_targets("full" if refused else self.finetune))
        if self.gpus is None and self.finetune == "lora":
            self.gpus = 1  # full's default depends on the workers' hosts: the service fills it in
        if self.gpus is not None and self.gpus > self.batch_size:
            # A ConfigError, not a ValueError: raised after the fields are validated, pydantic
            # would name no field for a ValueError.
            raise ConfigError(
                f"bad gpus: {self.gpus} (must be at most batch_size, {self.batch_size}: each GPU needs "
                "at least one sample)",
                "gpus",
                "invalid_value",
            )
        return self


def _mixture_dataset_name(data: dict[str, Any]) -> dict[str, Any]:
    """A mixture's request with its dataset_name filled in: the first dataset's name (when it is
    text; a broken one is then named by its own rule, datasets[0].name)."""
    mixture = data.get("datasets")
    if "dataset_name" in data or not isinstance(mixture, list) or not mixture:
        return data
    first = mixture[0].get("name") if isinstance(mixture[0], dict) else getattr(mixture[0], "name", None)
    return {**data, "dataset_name": first} if isinstance(first, str) and is_dataset_name(first) else data


SFTConfig.SCHEMA_RULES = _schema_rules()
