"""A deployment's settings: one definition for the SDK (checked before sending), the CLI and the
API (which parses the create request with it, then checks that the model exists and is the
caller's: relay_api.deployments).

`model` names what to serve, in one of three forms:

- a completed recipe job's id, ``ft-3f9a1c0d2b7e``: its merged weights and normalization stats;
- a training session's saved weights, ``ses-1a2b3c4d5e6f/NAME`` (``save_weights_for_sampler(NAME)``
  in the session): merged weights without normalization stats (a session has no dataset), so the
  observation's state and the actions are in the model's normalized units;
- a base model, ``pi05`` or ``pi05-tiny``.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field, WithJsonSchema

from relay import families
from relay.checkpoints import FINE_TUNE_ID_PATTERN
from relay.rules import CheckedConfig, WholeNumber
from relay.training.config import SAVED_NAME_MAX, check_name

JOB_PREFIX = "ft-"
SESSION_PREFIX = "ses-"
_JOB_ID = re.compile(rf"^{FINE_TUNE_ID_PATTERN}$")
_SESSION_WEIGHTS = re.compile(r"^(ses-[0-9a-f]{12})/(.+)$")

# Base models a deployment serves: the policy families. An RT-J is deployed from a completed
# fine-tune (its output names the task and database it predicts), never as a base model.
SERVED_BASE_MODELS: tuple[str, ...] = families.models_where(lambda spec: spec.deployments == "base_or_tuned")
MAX_BATCH_MAX = 64
MAX_WAIT_MS_MAX = 1000.0
IDLE_TIMEOUT_MAX = 7 * 24 * 3600.0
GPUS_MAX = 1  # one worker process, one GPU: a model spread over several is not offered yet

MODEL_RULE = (
    "must be a completed fine-tune's id (ft-...), a session's saved weights (ses-.../NAME), "
    "or a base model: " + ", ".join(SERVED_BASE_MODELS)
)
RULES: dict[str, str] = {
    "model": MODEL_RULE,
    "gpus": f"must be {GPUS_MAX} (a deployment runs on one GPU of one worker)",
    "max_batch": f"must be an integer from 1 to {MAX_BATCH_MAX}",
    "max_wait_ms": f"must be a number from 0 to {MAX_WAIT_MS_MAX:.0f}",
    "idle_timeout_seconds": f"must be a number of seconds greater than 0, at most {IDLE_TIMEOUT_MAX:.0f}",
}


def model_kind(model: str) -> str:
    """ "job", "session_weights" or "base"; ValueError (the rule) for anything else."""
    if _JOB_ID.match(model):
        return "job"
    found = _SESSION_WEIGHTS.match(model)
    if found:
        check_name(found.group(2), "model")
        return "session_weights"
    if model in SERVED_BASE_MODELS:
        return "base"
    raise ValueError(MODEL_RULE)


def _known_model(value: str) -> str:
    model_kind(value)
    return value


# The three forms, as the JSON Schema states them (the OpenAPI document accepts what the API does).
ModelName = Annotated[
    str,
    AfterValidator(_known_model),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "enum": list(SERVED_BASE_MODELS)},
                {"type": "string", "pattern": _JOB_ID.pattern},
                {
                    "type": "string",
                    "pattern": r"^ses-[0-9a-f]{12}/[^./\\\x00-\x1f\x7f][^/\\\x00-\x1f\x7f]{0,"
                    + str(SAVED_NAME_MAX - 1)
                    + "}$",
                },
            ]
        }
    ),
]


def session_weights(model: str) -> tuple[str, str]:
    """(session id, weights name) of a ``ses-.../NAME`` model."""
    found = _SESSION_WEIGHTS.match(model)
    if found is None:
        raise ValueError(MODEL_RULE)
    return found.group(1), found.group(2)


class DeploymentConfig(CheckedConfig):
    """What a deployment serves and how it batches (docs/serving.md): fixed for its life."""

    RULES: ClassVar[dict[str, str]] = RULES
    WHAT: ClassVar[str] = "a deployment"
    BODY_MESSAGE: ClassVar[str] = "the body must be an object with a deployment's fields: {fields}"

    model: ModelName
    gpus: WholeNumber = Field(1, strict=True, ge=1, le=GPUS_MAX)
    # Requests (from any robots) answered by one forward pass, at most.
    max_batch: WholeNumber = Field(8, strict=True, ge=1, le=MAX_BATCH_MAX)
    # How long the first request of a batch waits for others to join it.
    max_wait_ms: float = Field(2.0, ge=0, le=MAX_WAIT_MS_MAX, allow_inf_nan=False)
    # Stopped after this long without a request (and no robot connected).
    idle_timeout_seconds: float = Field(3600.0, gt=0, le=IDLE_TIMEOUT_MAX, allow_inf_nan=False)
