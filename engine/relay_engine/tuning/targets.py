"""Where training goes: each name of relay.catalog.TARGETS as module paths of a Pi05Policy.

A target has three parts, all regular expressions over module paths (fully matched):
- `lora`: the linear layers that get LoRA adapters with finetune="lora";
- `full`: the modules whose every weight is trained with finetune="full";
- `full_with_lora`: the modules trained in full even with finetune="lora" (the four small heads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from relay.catalog import TARGETS, check_targets
from relay_engine.errors import ConfigError

_ROOT = r"model\.paligemma_with_expert"
VISION = _ROOT + r"\.paligemma\.model\.vision_tower"
_VISION_LAYER = VISION + r"\.vision_model\.encoder\.layers\.\d+"
PROJECTOR = _ROOT + r"\.paligemma\.model\.multi_modal_projector"
LANGUAGE = _ROOT + r"\.paligemma\.model\.language_model"
EXPERT = _ROOT + r"\.gemma_expert"
_EXPERT_LAYER = EXPERT + r"\.model\.layers\.\d+"
HEADS = r"model\.(action_in_proj|action_out_proj|time_mlp_in|time_mlp_out)"


def _gemma_attn(stack_layer: str) -> str:
    return stack_layer + r"\.self_attn\.[qkvo]_proj"


def _gemma_mlp(stack_layer: str) -> str:
    return stack_layer + r"\.mlp\.(gate|up|down)_proj"


VISION_ATTN = _VISION_LAYER + r"\.self_attn\.(q|k|v|out)_proj"
VISION_MLP = _VISION_LAYER + r"\.mlp\.fc[12]"
PROJECTOR_LINEAR = PROJECTOR + r"\.linear"
LANGUAGE_ATTN = _gemma_attn(LANGUAGE + r"\.layers\.\d+")
LANGUAGE_MLP = _gemma_mlp(LANGUAGE + r"\.layers\.\d+")
EXPERT_ATTN = _gemma_attn(_EXPERT_LAYER)
EXPERT_MLP = _gemma_mlp(_EXPERT_LAYER)
EXPERT_NORM = EXPERT + r"\.model\.(layers\.\d+\.(input|post_attention)_layernorm|norm)\.dense"


@dataclass(frozen=True)
class Place:
    lora: tuple[str, ...]
    full: tuple[str, ...]
    full_with_lora: tuple[str, ...] = ()


PLACES: dict[str, Place] = {
    "all": Place(
        lora=(
            VISION_ATTN,
            VISION_MLP,
            PROJECTOR_LINEAR,
            LANGUAGE_ATTN,
            LANGUAGE_MLP,
            EXPERT_ATTN,
            EXPERT_MLP,
            EXPERT_NORM,
        ),
        full=(r"model",),
        full_with_lora=(HEADS,),
    ),
    "vision": Place(lora=(VISION_ATTN, VISION_MLP), full=(VISION,)),
    "vision.attn": Place(lora=(VISION_ATTN,), full=(VISION_ATTN,)),
    "vision.mlp": Place(lora=(VISION_MLP,), full=(VISION_MLP,)),
    "projector": Place(lora=(PROJECTOR_LINEAR,), full=(PROJECTOR,)),
    "language": Place(lora=(LANGUAGE_ATTN, LANGUAGE_MLP), full=(LANGUAGE,)),
    "language.attn": Place(lora=(LANGUAGE_ATTN,), full=(LANGUAGE_ATTN,)),
    "language.mlp": Place(lora=(LANGUAGE_MLP,), full=(LANGUAGE_MLP,)),
    "action_expert": Place(lora=(EXPERT_ATTN, EXPERT_MLP, EXPERT_NORM), full=(EXPERT,)),
    "action_expert.attn": Place(lora=(EXPERT_ATTN,), full=(EXPERT_ATTN,)),
    "action_expert.mlp": Place(lora=(EXPERT_MLP,), full=(EXPERT_MLP,)),
    "action_expert.norm": Place(lora=(EXPERT_NORM,), full=(EXPERT_NORM,)),
    "heads": Place(lora=(), full=(HEADS,), full_with_lora=(HEADS,)),
}
assert set(PLACES) == set(TARGETS), "relay.catalog.TARGETS and the engine's places differ"


def validate_targets(targets: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    try:
        check_targets(list(targets))
    except ValueError as error:
        raise ConfigError(f"targets: {error}") from None
    return tuple(dict.fromkeys(targets))


def any_of(patterns: tuple[str, ...] | list[str]) -> re.Pattern[str] | None:
    """One pattern fully matching any of `patterns`; None for none."""
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None


def module_of(parameter_name: str) -> str:
    """The original module path of a parameter, seen through peft's wrapping:
    `x.q_proj.base_layer.weight` and `x.q_proj.lora_A.default.weight` both belong to `x.q_proj`."""
    name = parameter_name.replace(".base_layer.", ".")
    marker = name.find(".lora_")
    if marker >= 0:
        return name[:marker]
    return name.rpartition(".")[0]


def under(pattern: re.Pattern[str] | None, module_path: str) -> bool:
    """Whether `module_path` is a module matched by `pattern` or lies inside one."""
    if pattern is None:
        return False
    parts = module_path.split(".")
    return any(pattern.fullmatch(".".join(parts[:end])) for end in range(1, len(parts) + 1))
