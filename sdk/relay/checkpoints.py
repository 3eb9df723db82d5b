"""What a recipe's `from_checkpoint` may name, and how a checkpoint says which model it is: one rule
for the SDK, the CLI, the API and the engine.

A recipe starts from `model`'s base weights unless `from_checkpoint` names other weights of that
architecture: a Hub model repo with an optional revision (`lerobot/pi05_libero`,
`team/my-pi05@v2`), a local directory in lerobot's PI05Policy format or Relay's output format, or a
completed fine-tune of the service (`ft-` and 12 hex digits). `model` stays the architecture, and is
checked against the checkpoint's own config (`architecture_mismatch`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from relay import families
from relay.dataset_names import LOCAL_NAME_PATTERN, local_dataset_path

# A fine-tune's id, as the API hands it out (relay_api.fine_tunes.new_job_id): `ft-` + 12 hex digits.
FINE_TUNE_ID_PATTERN = r"ft-[0-9a-f]{12}"
# One character of a Hub revision (branch, tag or commit): no spaces or control characters (Git
# refuses both in a ref name). U+0085 (a C1 control) and U+FEFF are named as well as `\s`: JSON
# Schema tools read `\s` as ECMAScript does, which leaves out U+0085, and Python's `\s` leaves out
# U+FEFF; named, both readings refuse both.
REVISION_CHARACTER = r"[^\s\x00-\x1f\x7f-\x9f\ufeff]"
# A Hub model repo, always `owner/name` (a bare `name` would read like a job id), by the Hub's rules
# as relay.dataset_names states them for datasets, then an optional `@revision`. The lookaheads
# look at the repo id alone (up to `@`), so a revision may hold `--` or `..`.
_HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
HUB_CHECKPOINT_PATTERN = (
    rf"(?![^@]*(?:--|\.\.))(?![^@]*\.git(?:@|$)){_HUB_PART}/{_HUB_PART}(?:@{REVISION_CHARACTER}+)?"
)
FROM_CHECKPOINT_MAX = 1024
# Every value from_checkpoint may take, as the API's OpenAPI document states it.
FROM_CHECKPOINT_PATTERN = rf"^(?:{FINE_TUNE_ID_PATTERN}|{HUB_CHECKPOINT_PATTERN}|{LOCAL_NAME_PATTERN})$"
FROM_CHECKPOINT_RULE = (
    "must name the weights to start from: a Hub model repo owner/name with an optional @revision "
    "(lerobot/pi05_libero, team/my-pi05@v2), a local directory in lerobot's PI05Policy format or "
    "Relay's output format (an absolute path, ~/..., ./... or ../...), or a completed fine-tune's "
    f"id (ft- and 12 hex digits); 1 to {FROM_CHECKPOINT_MAX} characters, no control characters"
)
NORMALIZATIONS: tuple[str, ...] = ("dataset", "checkpoint")
NORMALIZATION_RULE = (
    'must be "dataset" (the new dataset\'s statistics, computed as for any job) or "checkpoint" '
    "(the statistics the from_checkpoint weights were trained with: a Relay output's "
    "norm_stats.json, or lerobot's normalizer processor file)"
)

# The files that say which model a checkpoint is (relay_engine.models.weights reads the same ones).
RELAY_CONFIG_FILE = "relay_config.json"
LEROBOT_CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
RELAY_CONFIG_FORMAT = "relay-pi05"
# Relay's record of which model a family's output is: relay_config.json with a format of
# "relay-<family>" and the model's name (pi05's holds its whole config; SmolVLA's only the name,
# since lerobot's config.json holds the rest).
RELAY_CONFIG_PREFIX = "relay-"


@dataclass(frozen=True)
class CheckpointSource:
    """What a from_checkpoint value names: a fine-tune (`job`), a Hub repo (`repo`, `revision`) or
    a local directory (`path`)."""

    kind: Literal["job", "hub", "directory"]
    job: str | None = None
    repo: str | None = None
    revision: str | None = None
    path: Path | None = None


def is_fine_tune_id(value: str) -> bool:
    return re.fullmatch(FINE_TUNE_ID_PATTERN, value) is not None


def parse_checkpoint(value: str) -> CheckpointSource:
    """The source a from_checkpoint value names; ValueError (FROM_CHECKPOINT_RULE) for any other text."""
    if len(value) > FROM_CHECKPOINT_MAX or re.fullmatch(FROM_CHECKPOINT_PATTERN, value) is None:
        raise ValueError(FROM_CHECKPOINT_RULE)
    if is_fine_tune_id(value):
        return CheckpointSource("job", job=value)
    path = local_dataset_path(value)
    if path is not None:
        return CheckpointSource("directory", path=path)
    repo, _, revision = value.partition("@")
    return CheckpointSource("hub", repo=repo, revision=revision or None)


def checkpoint_model(directory: Path) -> str | None:
    """Which model the checkpoint in `directory` is (pi05, pi05-tiny, smolvla ...), by its own config:
    Relay's relay_config.json (or config.json of older outputs), lerobot's config.json (its type,
    pi05 or smolvla: the published size), or a bare model.safetensors (the family's that claims such
    files: pi05's, as lerobot and openpi export it).
    None when it cannot be told."""
    for name in (RELAY_CONFIG_FILE, LEROBOT_CONFIG_FILE):
        path = directory / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        if not isinstance(data, dict):
            return None
        if str(data.get("format", "")).startswith(RELAY_CONFIG_PREFIX):
            return str(data.get("model")) if data.get("model") else None
        # lerobot's policy type names the family, whose published size has the same name.
        kind = data.get("type")
        return kind if isinstance(kind, str) and families.family_of(kind) is not None else None
    return families.bare_weights_model() if (directory / WEIGHTS_FILE).is_file() else None


def architecture_mismatch(model: str, found: str, checkpoint: str) -> str:
    """The one sentence for a checkpoint of another architecture than the recipe's model."""
    return (
        f"bad from_checkpoint: {json.dumps(checkpoint)} holds {found} weights, and model is "
        f"{json.dumps(model)}; model names the checkpoint's architecture: set model to {json.dumps(found)}, "
        f"or start from a {model} checkpoint"
    )


def job_id_needs_the_service(job: str) -> str:
    """Why a fine-tune's id cannot be read where no service is (`relay local train`, the Trainer)."""
    return (
        f"bad from_checkpoint: {job} is a fine-tune of the service, and a job id needs the service; "
        f"download its weights first (`relay fine-tunes download {job} --dir DIR`) and pass the directory"
    )


def _checkpoint_form(value: str | None) -> str | None:
    if value is not None:
        parse_checkpoint(value)  # ValueError: FROM_CHECKPOINT_RULE
    return value


# A recipe's or a session's from_checkpoint, as a field: the pattern stated in the JSON Schema, and
# checked by parse_checkpoint (pydantic's regex engine has no lookaheads).
FromCheckpoint = Annotated[
    str | None,
    Field(
        min_length=1, max_length=FROM_CHECKPOINT_MAX, json_schema_extra={"pattern": FROM_CHECKPOINT_PATTERN}
    ),
    AfterValidator(_checkpoint_form),
]
