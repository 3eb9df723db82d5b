"""Model families: each a folder (pi05/, rtj/) over the shared core (relay_engine.core), and this
registry, which the recipe driver, the worker's sessions and the CLI ask for a model's family.

A family is added with one call, `register_family(family)`, which also registers its spec with
the SDK (relay.families), so that SFTConfig and SessionConfig take its models. The built-in
families register themselves when this package is imported; an installed package's families are
found then too, under the entry-point group `relay.families` (its specs, for processes without the
engine such as the API, under `relay.family_specs`: docs/development.md, "A family as a package").
"""

from __future__ import annotations

from relay.families import forget_family_spec, register_family_spec
from relay_engine.errors import ConfigError
from relay_engine.families.base import EvaluationRequest, Family, ModelDescription, PreparedRecipe, RecipeRun

__all__ = [
    "EvaluationRequest",
    "Family",
    "ModelDescription",
    "PreparedRecipe",
    "RecipeRun",
    "families",
    "family_for",
    "family_named",
    "family_owning",
    "forget_family",
    "register_family",
]

_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Add a family (or replace one of the same name), and its spec on the SDK's side."""
    register_family_spec(family.spec)
    _FAMILIES[family.name] = family
    return family


def forget_family(name: str) -> None:
    """Remove a family added with register_family, and its spec (a test's, once it is done)."""
    _FAMILIES.pop(name, None)
    forget_family_spec(name)


def families() -> tuple[Family, ...]:
    return tuple(_FAMILIES.values())


def family_named(name: str) -> Family:
    """A family by its own name (relay.families.PI05, RTJ, or one registered since)."""
    family = _FAMILIES.get(name)
    if family is None:
        raise ConfigError(f"unknown model family {name!r}; known: {', '.join(_FAMILIES)}")
    return family


def family_for(model_name: str) -> Family:
    """The family of a named base model; ConfigError for a name no family holds."""
    for family in _FAMILIES.values():
        if model_name in family.spec.models:
            return family
    known = ", ".join(model for family in _FAMILIES.values() for model in family.spec.models)
    raise ConfigError(f"unknown model {model_name!r}; known models: {known}")


def family_owning(name_or_dir: str, *, takes_task: bool = False) -> Family:
    """The family of a base model's name or of a saved model's directory (`relay local eval`).

    A name is its family's; a directory is the family's that claims it (an RT-J checkpoint's
    config.json), else the family that reads other models (pi05: a Hub repo or an output). With
    `takes_task`, only families whose recipes name a task are asked."""
    candidates = [f for f in _FAMILIES.values() if not takes_task or f.spec.task == "required"]
    if not candidates:
        raise ConfigError("no model family takes a task")
    for family in candidates:
        if name_or_dir in family.spec.models:
            return family
    for family in candidates:
        if family.owns_model(name_or_dir):
            return family
    return next((f for f in candidates if f.reads_other_models), candidates[0])


# The built-in families, registered once (each package's __init__ is its registration).
from relay_engine.families import pi05, rtj, smolvla  # noqa: E402, F401

# The entry-point group under which an installed package names its families: each entry is a Family,
# or a class or function of no arguments that makes one.
FAMILY_ENTRY_POINTS = "relay.families"


def _register_installed_families() -> None:
    from relay.families import installed

    # Family is abstract; `installed` only tests instances against it.
    for family in installed(FAMILY_ENTRY_POINTS, Family):  # type: ignore[type-abstract]
        register_family(family)


_register_installed_families()
