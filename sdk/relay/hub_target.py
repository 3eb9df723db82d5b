"""Where a fine-tune goes on the Hugging Face Hub: the repo id and branch rules of a push
(relay.hub_push), and a recipe's ``hub`` block (`HubTarget`), which the service's worker pushes the
output to when the job completes.

Kept apart from relay.hub_push so that relay.sft.config can declare the block without importing the
push (which imports the model card, which imports relay.sft.config).
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from pydantic import Field, field_validator

from relay.checkpoints import REVISION_CHARACTER
from relay.dataset_names import HUB_REPO_ID_PATTERN, is_hub_repo_id
from relay.errors import ConfigError
from relay.rules import CheckedConfig

DEFAULT_BRANCH = "main"
HUB_REPO_RULE = (
    "must be a Hub model repo id, owner/name: each part 1 to 96 letters, digits, _, - and ., "
    "starting and ending with a letter, digit or _; no -- or .., not ending in .git"
)
# A branch the push commits to: a Git ref name (no spaces, control characters, `..`, `~^:?*[\`,
# no leading `-` or `/`, no trailing `/`, `.` or `.lock`), which the Hub's branch API accepts.
HUB_BRANCH_PATTERN = (
    r"(?!.*(?:\.\.|//|@\{|\.lock(?:/|$)|/\.))(?![-/.])"
    rf"(?:(?![~^:?*\[\\]){REVISION_CHARACTER})+(?<![/.])"
)
HUB_BRANCH_MAX = 255
HUB_BRANCH_RULE = (
    "must be a branch name (created if absent): no spaces, control characters, .., ~ ^ : ? * [ or \\, "
    f"not starting with -, / or ., not ending with /, . or .lock; at most {HUB_BRANCH_MAX} characters"
)
HUB_RULE = (
    "must be null or an object: repo_id (required, owner/name), private (default true), revision (a branch)"
)


def is_repo_id(value: Any) -> bool:
    return isinstance(value, str) and "/" in value and is_hub_repo_id(value)


def is_branch(value: Any) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= HUB_BRANCH_MAX
        and re.fullmatch(HUB_BRANCH_PATTERN, value) is not None
    )


def check_repo_id(repo_id: str, param: str = "repo_id") -> str:
    """`repo_id` when it is an owner/name model repo id; ConfigError naming `param` otherwise."""
    if not is_repo_id(repo_id):
        raise ConfigError(f"bad {param}: {json.dumps(repo_id)} ({HUB_REPO_RULE})", param)
    return repo_id


def check_branch(revision: str | None, param: str = "revision") -> str | None:
    """`revision` when it is None or a branch name; ConfigError naming `param` otherwise."""
    if revision is not None and not is_branch(revision):
        raise ConfigError(f"bad {param}: {json.dumps(revision)} ({HUB_BRANCH_RULE})", param)
    return revision


class HubTarget(CheckedConfig):
    """A recipe's ``hub`` block: when the job completes, the service's worker pushes its output and a
    model card to the model repo ``repo_id`` (created ``private`` unless false) at the branch
    ``revision`` (null: main). A push that fails leaves the job completed, and says why in a
    ``pushed`` event (relay.events.PushedEvent)."""

    RULES: ClassVar[dict[str, str]] = {
        "repo_id": HUB_REPO_RULE,
        "private": "must be true or false",
        "revision": HUB_BRANCH_RULE + ", or null for main",
    }
    WHAT: ClassVar[str] = "hub"
    BODY_MESSAGE: ClassVar[str] = "bad hub: must be an object of {fields} (repo_id required), or null"

    # The patterns state in the JSON Schema what the validators below check (a schema-valid body is
    # one the API takes).
    repo_id: str = Field(
        min_length=3,
        max_length=193,
        description="The Hub model repo, owner/name.",
        json_schema_extra={"pattern": rf"^(?=[^/]*/)(?:{HUB_REPO_ID_PATTERN})$"},
    )
    private: bool = Field(True, strict=True)
    revision: str | None = Field(
        None,
        min_length=1,
        max_length=HUB_BRANCH_MAX,
        json_schema_extra={"pattern": rf"^{HUB_BRANCH_PATTERN}$"},
    )

    @field_validator("repo_id")
    @classmethod
    def _repo_form(cls, value: str) -> str:
        if not is_repo_id(value):
            raise ValueError(HUB_REPO_RULE)
        return value

    @field_validator("revision")
    @classmethod
    def _branch_form(cls, value: str | None) -> str | None:
        if value is not None and not is_branch(value):
            raise ValueError(HUB_BRANCH_RULE)
        return value


def hub_value(value: Any) -> HubTarget | None:
    """SFTConfig's `hub`: None, or a HubTarget whose errors name their field as ``hub.FIELD``."""
    if value is None or isinstance(value, HubTarget):
        return value
    try:
        return HubTarget.parse(value)
    except ConfigError as error:
        field = f"hub.{error.param}" if error.param else "hub"
        message = error.message.replace(f"bad {error.param}:", f"bad {field}:", 1)
        message = message.replace(f"missing {error.param} ", f"missing {field} ", 1)
        raise ConfigError(message, field, error.code) from None
