"""pi0.5's sizes and the layout of its weights, without torch.

The one definition of each model size (the engine builds its modules from these), of every
weight's name and shape (lerobot's names: the engine's `Pi05Policy.named_parameters()` yields
exactly these, which a test checks), and of where each training target (relay.catalog.TARGETS)
lies among them. With these the SDK and the API count what a recipe trains, and the memory plan
(`relay.memory_plan`) what it needs, without building the model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from relay.catalog import (
    ACTION_DIM,
    ACTION_HORIZON,
    FINETUNE_METHODS,
    LORA_RANK_MAX,
    TARGETS,
    check_targets,
    default_targets,
)


@dataclass(frozen=True)
class VisionSize:
    """A SigLIP vision tower."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int
    image_size: int

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class GemmaSize:
    """A Gemma decoder (openpi's `gemma.Config`)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


SIGLIP_SO400M_224 = VisionSize(
    width=1152, depth=27, mlp_dim=4304, num_heads=16, patch_size=14, image_size=224
)
GEMMA_2B = GemmaSize(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256)
GEMMA_300M = GemmaSize(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256)
GEMMA_DUMMY = GemmaSize(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16)
SIGLIP_TINY = VisionSize(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8, image_size=32)

PALIGEMMA_VOCAB_SIZE = 257_152
# Byte-level vocabulary: 0 pad, 1 bos, 2 eos, then the 256 byte values.
BYTE_VOCAB_SIZE = 3 + 256


class Pi05Shape(Protocol):
    """What the layout and the memory plan read of a model: its sizes (the engine's Pi05Config
    has these attributes, and so has Pi05Sizes)."""

    @property
    def vision(self) -> VisionSize: ...
    @property
    def language(self) -> GemmaSize: ...
    @property
    def expert(self) -> GemmaSize: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def max_token_len(self) -> int: ...
    @property
    def action_horizon(self) -> int: ...
    @property
    def action_dim(self) -> int: ...


@dataclass(frozen=True)
class Pi05Sizes:
    """A named model's sizes (the engine's Pi05Config adds its tokenizer, seed and tuning)."""

    vision: VisionSize
    language: GemmaSize
    expert: GemmaSize
    vocab_size: int
    tokenizer: str  # "paligemma" (SentencePiece) or "bytes"
    # Prompts (task and discretized state) longer than this many tokens are cut.
    max_token_len: int
    action_horizon: int = ACTION_HORIZON
    action_dim: int = ACTION_DIM


# `pi05` is openpi's gemma_2b + gemma_300m with a SigLIP So400m/14 tower at 224 px; `pi05-tiny` is
# the same architecture at openpi's `dummy` sizes with a small tower and a byte-level tokenizer.
NAMED_SIZES: dict[str, Pi05Sizes] = {
    "pi05": Pi05Sizes(
        vision=SIGLIP_SO400M_224,
        language=GEMMA_2B,
        expert=GEMMA_300M,
        vocab_size=PALIGEMMA_VOCAB_SIZE,
        tokenizer="paligemma",
        max_token_len=200,
    ),
    # Bytes are longer than SentencePiece tokens: 32 state values take up to 128.
    "pi05-tiny": Pi05Sizes(
        vision=SIGLIP_TINY,
        language=GEMMA_DUMMY,
        expert=GEMMA_DUMMY,
        vocab_size=BYTE_VOCAB_SIZE,
        tokenizer="bytes",
        max_token_len=256,
    ),
}


# -- the weights, by name -------------------------------------------------------------------------

_ROOT = "model.paligemma_with_expert"
_VISION_ROOT = _ROOT + ".paligemma.model.vision_tower.vision_model"
_LANGUAGE_ROOT = _ROOT + ".paligemma.model.language_model"
_EXPERT_ROOT = _ROOT + ".gemma_expert.model"


@dataclass(frozen=True)
class Weight:
    name: str
    shape: tuple[int, ...]
    linear: bool  # a linear layer's weight (where LoRA can go); its module is name minus ".weight"

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    @property
    def module(self) -> str:
        return self.name.rpartition(".")[0]


def _linear(path: str, inputs: int, outputs: int, *, bias: bool = True) -> list[Weight]:
    weights = [Weight(path + ".weight", (outputs, inputs), linear=True)]
    return weights + ([Weight(path + ".bias", (outputs,), linear=False)] if bias else [])


def _vector(path: str, size: int, *, bias: bool) -> list[Weight]:
    names = (".weight", ".bias") if bias else (".weight",)
    return [Weight(path + name, (size,), False) for name in names]


def _gemma_layer(path: str, size: GemmaSize, cond_dim: int | None) -> list[Weight]:
    width, heads, kv = size.width, size.num_heads * size.head_dim, size.num_kv_heads * size.head_dim
    weights = [
        *_linear(path + ".self_attn.q_proj", width, heads, bias=False),
        *_linear(path + ".self_attn.k_proj", width, kv, bias=False),
        *_linear(path + ".self_attn.v_proj", width, kv, bias=False),
        *_linear(path + ".self_attn.o_proj", heads, width, bias=False),
        *_linear(path + ".mlp.gate_proj", width, size.mlp_dim, bias=False),
        *_linear(path + ".mlp.up_proj", width, size.mlp_dim, bias=False),
        *_linear(path + ".mlp.down_proj", size.mlp_dim, width, bias=False),
    ]
    for norm in ("input_layernorm", "post_attention_layernorm"):
        if cond_dim is None:
            weights += _vector(f"{path}.{norm}", width, bias=False)
        else:
            weights += _linear(f"{path}.{norm}.dense", cond_dim, 3 * width)
    return weights


def weights(shape: Pi05Shape) -> list[Weight]:
    """Every weight of a pi0.5 policy of these sizes, in the engine's order."""
    vision, language, expert = shape.vision, shape.language, shape.expert
    out = [
        Weight(
            _VISION_ROOT + ".embeddings.patch_embedding.weight",
            (vision.width, 3, vision.patch_size, vision.patch_size),
            False,
        ),
        Weight(_VISION_ROOT + ".embeddings.patch_embedding.bias", (vision.width,), False),
        Weight(
            _VISION_ROOT + ".embeddings.position_embedding.weight",
            (vision.tokens_per_image, vision.width),
            False,
        ),
    ]
    for index in range(vision.depth):
        layer = f"{_VISION_ROOT}.encoder.layers.{index}"
        out += _vector(layer + ".layer_norm1", vision.width, bias=True)
        for projection in ("k_proj", "v_proj", "q_proj", "out_proj"):
            out += _linear(f"{layer}.self_attn.{projection}", vision.width, vision.width)
        out += _vector(layer + ".layer_norm2", vision.width, bias=True)
        out += _linear(layer + ".mlp.fc1", vision.width, vision.mlp_dim)
        out += _linear(layer + ".mlp.fc2", vision.mlp_dim, vision.width)
    out += _vector(_VISION_ROOT + ".post_layernorm", vision.width, bias=True)
    out += _linear(_ROOT + ".paligemma.model.multi_modal_projector.linear", vision.width, language.width)
    out.append(Weight(_LANGUAGE_ROOT + ".embed_tokens.weight", (shape.vocab_size, language.width), False))
    for index in range(language.depth):
        out += _gemma_layer(f"{_LANGUAGE_ROOT}.layers.{index}", language, None)
    out += _vector(_LANGUAGE_ROOT + ".norm", language.width, bias=False)
    for index in range(expert.depth):
        out += _gemma_layer(f"{_EXPERT_ROOT}.layers.{index}", expert, expert.width)
    out += _linear(_EXPERT_ROOT + ".norm.dense", expert.width, 3 * expert.width)
    out += _linear("model.action_in_proj", shape.action_dim, expert.width)
    out += _linear("model.action_out_proj", expert.width, shape.action_dim)
    out += _linear("model.time_mlp_in", expert.width, expert.width)
    out += _linear("model.time_mlp_out", expert.width, expert.width)
    return out


# -- where each target lies -----------------------------------------------------------------------
# A target has three parts, all regular expressions over module paths (fully matched):
# - `lora`: the linear layers that get LoRA adapters with finetune="lora";
# - `full`: the modules whose every weight is trained with finetune="full";
# - `full_with_lora`: the modules trained in full even with finetune="lora" (the four small heads).

VISION = r"model\.paligemma_with_expert\.paligemma\.model\.vision_tower"
_VISION_LAYER = VISION + r"\.vision_model\.encoder\.layers\.\d+"
PROJECTOR = r"model\.paligemma_with_expert\.paligemma\.model\.multi_modal_projector"
LANGUAGE = r"model\.paligemma_with_expert\.paligemma\.model\.language_model"
EXPERT = r"model\.paligemma_with_expert\.gemma_expert"
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
assert set(PLACES) == set(TARGETS), "relay.catalog.TARGETS and the places of pi05's weights differ"


def any_of(patterns: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern fully matching any of `patterns`; None for none."""
    patterns = list(patterns)
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None


def under(pattern: re.Pattern[str] | None, module_path: str) -> bool:
    """Whether `module_path` is a module matched by `pattern` or lies inside one."""
    if pattern is None:
        return False
    parts = module_path.split(".")
    return any(pattern.fullmatch(".".join(parts[:end])) for end in range(1, len(parts) + 1))


def chosen_targets(finetune: str, targets: Sequence[str] | None) -> tuple[str, ...]:
    """The targets a recipe trains (its own, or the defaults of its finetune), each once.
    Raises ValueError for an unknown finetune or target."""
    if finetune not in FINETUNE_METHODS:
        raise ValueError(f"finetune must be one of {', '.join(FINETUNE_METHODS)}, got {finetune!r}")
    chosen = default_targets(finetune) if targets is None else tuple(targets)
    check_targets(list(chosen))
    return tuple(dict.fromkeys(chosen))


@dataclass(frozen=True)
class Tuned:
    """What a recipe's tuning makes of the weights: which base weights train, and the LoRA
    adapters added to which linear layers (lora_A is rank x in, lora_B out x rank; both train)."""

    base: list[Weight]
    trained: frozenset[str]  # names of base weights that train
    adapted: list[Weight]  # the linear weights that get adapters
    lora_rank: int

    @property
    def adapter_params(self) -> int:
        return sum(self.lora_rank * (w.shape[0] + w.shape[1]) for w in self.adapted)

    @property
    def total_params(self) -> int:
        return sum(w.numel for w in self.base) + self.adapter_params

    @property
    def trainable_params(self) -> int:
        return sum(w.numel for w in self.base if w.name in self.trained) + self.adapter_params

    def trains_under(self, prefix: str) -> bool:
        """Whether any weight under the module path `prefix` trains (an adapter's included)."""
        return any(name.startswith(prefix + ".") for name in self.trained) or any(
            w.name.startswith(prefix + ".") for w in self.adapted
        )


def tune(shape: Pi05Shape, finetune: str, targets: Sequence[str] | None, lora_rank: int) -> Tuned:
    """What `finetune` on `targets` trains, as `relay_engine.tuning.apply_tuning` does it."""
    places = [PLACES[t] for t in chosen_targets(finetune, targets)]
    base = weights(shape)
    if finetune == "lora":
        if isinstance(lora_rank, bool) or not 1 <= lora_rank <= LORA_RANK_MAX:
            raise ValueError(f"lora_rank must be an integer from 1 to {LORA_RANK_MAX}, got {lora_rank!r}")
        full = any_of(p for place in places for p in place.full_with_lora)
        linear = any_of(p for place in places for p in place.lora)
        adapted = [w for w in base if w.linear and linear is not None and linear.fullmatch(w.module)]
        trained = frozenset(w.name for w in base if under(full, w.module))
        return Tuned(base, trained, adapted, lora_rank)
    full = any_of(p for place in places for p in place.full)
    return Tuned(base, frozenset(w.name for w in base if under(full, w.module)), [], lora_rank)
