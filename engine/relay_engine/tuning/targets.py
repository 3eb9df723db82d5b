"""Where training goes: each name of relay.catalog.TARGETS as module paths of a Pi05Policy.

The places themselves (`PLACES`: regular expressions over module paths) are defined once,
torch-free, in `relay.pi05_layout`, where the memory plan counts from them too; this module adds
what the engine needs on top (the module of a peft-wrapped parameter, ConfigError).
"""

from __future__ import annotations

from relay.catalog import check_targets
from relay.pi05_layout import PLACES, Place, any_of, under
from relay_engine.errors import ConfigError

__all__ = ["PLACES", "Place", "any_of", "module_of", "under", "validate_targets"]


def validate_targets(targets: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    try:
        check_targets(list(targets))
    except ValueError as error:
        raise ConfigError(f"targets: {error}") from None
    return tuple(dict.fromkeys(targets))


def module_of(parameter_name: str) -> str:
    """The original module path of a parameter, seen through peft's wrapping:
    `x.q_proj.base_layer.weight` and `x.q_proj.lora_A.default.weight` both belong to `x.q_proj`."""
    name = parameter_name.replace(".base_layer.", ".")
    marker = name.find(".lora_")
    if marker >= 0:
        return name[:marker]
    return name.rpartition(".")[0]
