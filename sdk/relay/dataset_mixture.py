"""A recipe's ``datasets``: several LeRobot datasets trained on together, each with its share of the
samples (docs/datasets.md, "Training on a mixture").

``[{"name": "team/pick-fork", "weight": 3}, {"name": "lerobot/aloha_pick", "revision": "v2.1",
"cameras": {"base_0_rgb": "observation.images.top"}}]``: each entry names a dataset as
``dataset_name`` does, the revision to read (Hub datasets), its own camera map, and its ``weight``:
the share of the samples drawn from it is its weight over the sum of the weights (1 each by default:
equal shares, whatever the sizes). The first dataset is the mixture's robot: its cameras and
features describe the output, and it is the job's ``dataset_name``.

Pure pydantic: the SDK, the API and the engine read a mixture with the same classes, and a broken
rule names its place (``datasets[1].weight``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field, field_validator

from relay import catalog
from relay.checkpoints import REVISION_CHARACTER
from relay.dataset_names import (
    LEROBOT_DATASET_NAME_PATTERN,
    LOCAL_DISK_NAME_PATTERN,
    MALFORMED_URL_RULE,
    is_dataset_name,
    is_malformed_url,
    is_relational_source,
    names_local_directory,
)
from relay.errors import ConfigError
from relay.rules import ABSENT, PLAIN_TEXT_PATTERN, CheckedConfig, has_control_characters, under

MIXTURE_MIN = 2
MIXTURE_MAX = 16
WEIGHT_MAX = 1_000_000.0
# The same limits as a recipe's dataset_name and dataset_revision (relay.sft.config).
NAME_MAX = 1024
REVISION_MAX = 256
CAMERAS_RULE = "must map model cameras (" + ", ".join(catalog.MODEL_CAMERAS) + ") to dataset feature names"
DATASETS_RULE = (
    f"must be a list of {MIXTURE_MIN} to {MIXTURE_MAX} LeRobot datasets, each "
    '{"name", "revision", "weight", "cameras"} (name required; weight a number above 0, default 1), '
    "no dataset named twice at the same revision; give dataset_name instead for one dataset"
)


def check_camera_map(value: dict[str, str] | None) -> dict[str, str] | None:
    """A camera map (model camera -> dataset feature) as a recipe takes it: None, or at least one
    model camera, no control characters; ValueError with the rule otherwise."""
    if value is None:
        return None
    if not value:
        raise ValueError("must map at least one model camera, or be left out for the dataset's")
    if any(has_control_characters(name) for name in (*value, *value.values())):
        raise ValueError(CAMERAS_RULE + ", with no control characters")
    catalog.check_cameras(value)
    return value


class MixtureDataset(CheckedConfig):
    """One dataset of a mixture: its ``name`` (a Hub repo id or a local directory, as
    ``dataset_name``), the ``revision`` to read (a Hub dataset's; null: v2.1, else a v3.0 default
    branch), its ``weight`` (its share of the samples is weight / sum of weights) and its own
    ``cameras`` map (null: its image features in order)."""

    RULES: ClassVar[dict[str, str]] = {
        "name": (
            "must be a LeRobot dataset on the Hugging Face Hub such as lerobot/pusht_image, or a local "
            f"dataset directory (an absolute path, ~/..., ./... or ../...): 1 to {NAME_MAX} characters"
        ),
        "revision": (
            f"must name a branch, tag or commit of the dataset's Hub repo: 1 to {REVISION_MAX} "
            "characters, no spaces or control characters; none for a local directory"
        ),
        "weight": (
            f"must be a number above 0 and at most {WEIGHT_MAX:,.0f} (the dataset's share of the samples "
            "is its weight over the sum)"
        ),
        "cameras": CAMERAS_RULE,
    }
    # A dataset on the training machine's disk has no revisions (datasets_value).
    SCHEMA_RULES: ClassVar[tuple[dict[str, Any], ...]] = (
        {
            "if": {"properties": {"name": {"pattern": LOCAL_DISK_NAME_PATTERN}}, "required": ["name"]},
            "then": {"properties": {"revision": ABSENT}},
        },
    )
    WHAT: ClassVar[str] = "a mixture's dataset"
    BODY_MESSAGE: ClassVar[str] = "must be an object of {fields} (name required)"

    name: str = Field(
        min_length=1, max_length=NAME_MAX, json_schema_extra={"pattern": LEROBOT_DATASET_NAME_PATTERN}
    )
    revision: str | None = Field(
        None, min_length=1, max_length=REVISION_MAX, pattern=rf"^{REVISION_CHARACTER}+$"
    )
    weight: float = Field(1.0, gt=0, le=WEIGHT_MAX, allow_inf_nan=False)
    cameras: dict[str, str] | None = Field(
        None,
        json_schema_extra={
            "minProperties": 1,
            "propertyNames": {"enum": list(catalog.MODEL_CAMERAS)},
            "additionalProperties": {"type": "string", "minLength": 1, "pattern": PLAIN_TEXT_PATTERN},
        },
    )

    @field_validator("name")
    @classmethod
    def _lerobot_name(cls, value: str) -> str:
        # A URL that does not parse is refused unshown (it may hold a password), as dataset_name's.
        if is_malformed_url(value):
            raise ConfigError(f"bad name: {MALFORMED_URL_RULE}", "name", "invalid_value")
        if not is_dataset_name(value) or is_relational_source(value):
            raise ValueError(cls.RULES["name"])
        return value

    @field_validator("cameras")
    @classmethod
    def _camera_map(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return check_camera_map(value)


def datasets_value(value: Any) -> list[MixtureDataset] | None:
    """SFTConfig's ``datasets``: None, or the list, each entry a MixtureDataset whose errors name their
    place (``datasets[1].weight``); a revision of a local directory and a dataset named twice at the
    same revision are refused."""
    if value is None:
        return None
    if not isinstance(value, list) or not MIXTURE_MIN <= len(value) <= MIXTURE_MAX:
        shown = f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__
        raise ConfigError(f"bad datasets: {shown} ({DATASETS_RULE})", "datasets", "invalid_value")
    parsed: list[MixtureDataset] = []
    for index, item in enumerate(value):
        place = f"datasets[{index}]"
        try:
            entry = item if isinstance(item, MixtureDataset) else MixtureDataset.parse(item)
        except ConfigError as error:
            if error.param is None:  # the entry is no object: its place says which
                raise ConfigError(f"bad {place}: {error.message}", place, error.code) from None
            raise under(error, place) from None
        if entry.revision is not None and names_local_directory(entry.name):
            raise ConfigError(
                f"bad {place}.revision: {json.dumps(entry.revision)} (the dataset is a local directory, "
                "which has no revisions)",
                f"{place}.revision",
                "invalid_value",
            )
        for earlier, other in enumerate(parsed):
            if (other.name, other.revision) == (entry.name, entry.revision):
                raise ConfigError(
                    f"bad {place}.name: {json.dumps(entry.name)} is datasets[{earlier}] too (a dataset is "
                    "named once; its weight sets its share)",
                    f"{place}.name",
                    "invalid_value",
                )
        parsed.append(entry)
    return parsed


@dataclass(frozen=True)
class DatasetSource:
    """One dataset a recipe reads, as the engine opens it: a mixture's entry, or the recipe's
    single dataset_name with its revision and cameras (weight 1)."""

    name: str
    revision: str | None
    weight: float
    cameras: dict[str, str] | None


def recipe_datasets(config: Any) -> list[DatasetSource]:
    """The datasets an SFTConfig (or a stored job's config) reads: its ``datasets``, else its one
    ``dataset_name``. The one place that tells a mixture from a single dataset."""
    get = config.get if isinstance(config, dict) else lambda field: getattr(config, field, None)
    mixture = get("datasets")
    if mixture:
        return [
            DatasetSource(
                name=entry["name"] if isinstance(entry, dict) else entry.name,
                revision=entry.get("revision") if isinstance(entry, dict) else entry.revision,
                weight=float(entry.get("weight", 1.0) if isinstance(entry, dict) else entry.weight),
                cameras=entry.get("cameras") if isinstance(entry, dict) else entry.cameras,
            )
            for entry in mixture
        ]
    return [DatasetSource(str(get("dataset_name")), get("dataset_revision"), 1.0, get("cameras"))]


def sample_shares(weights: list[float]) -> list[float]:
    """Each dataset's share of the samples: its weight over the sum."""
    total = sum(weights)
    return [weight / total for weight in weights]
