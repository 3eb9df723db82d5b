"""How much memory a pi0.5 or SmolVLA job needs on each GPU: weights, gradients, optimizer state,
activations.

Pure arithmetic on the model's sizes (`relay.pi05_layout`, `relay.smolvla_layout`; a family's spec
names its layout, FamilySpec.memory_layout), so the API can refuse a job that fits no worker's GPUs without
torch, and `relay models info --memory` and the engine print the same figures.

SmolVLA trains in one process, in fp32 on every device (its engine neither casts nor autocasts):
every weight in fp32, the trainable ones' fp32 gradients and two AdamW moments, and the
activations `relay.smolvla_layout.kept_activations` counts (its text says how). The rest of this
text is pi0.5's. The weights, gradients and AdamW moments follow from parameter counts and the
strategy:

- DDP: every process holds the whole model (frozen weights in bf16 on CUDA, trainable in fp32),
  the trainable weights' fp32 gradients twice (the gradients and DDP's reduction buckets), and
  their two fp32 AdamW moments.
- FSDP: every process holds 1/N of the fp32 weights, gradients and moments, plus, while a unit
  runs, its gathered weights in the compute dtype (the unit running and the one prefetched) and
  its unsharded fp32 gradients; the root unit (embeddings, heads) stays gathered for the step.

Activations are what autograd keeps for backward, counted tensor by tensor from the layers' code
(`relay_engine.models`): a test checks the count against the tensors a real step saves. Weights
are not activations, though a linear layer's backward keeps a transposed view of its weight:
that view is the weight's own memory. On top of what is kept, the largest layer's activations
are counted once more: while a layer runs (forward, or its backward) its intermediate tensors
are alive, whether autograd keeps them or not (a frozen prefix, run without autograd, costs only
this). With activation checkpointing (FSDP for full fine-tuning) a decoder layer keeps only its
input, and the layer being recomputed in backward holds its activations again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pkgutil import resolve_name
from typing import TYPE_CHECKING, Any

from relay import families, pi05_layout, smolvla_layout
from relay.catalog import MODEL_CAMERAS, auto_strategy
from relay.pi05_layout import GemmaSize, Pi05Shape, Tuned
from relay.smolvla_layout import SmolVLASizes

if TYPE_CHECKING:
    from relay.sft.config import SFTConfig

GIB = 1024**3
GB = 10**9
# GPUs by memory, to name the smallest a plan fits (the bytes a job can use, less the driver's).
GPU_SIZES: tuple[tuple[str, int], ...] = (
    ("24 GB (L4, RTX 4090)", 24 * GB),
    ("40 GB (A100 40GB)", 40 * GB),
    ("48 GB (L40S, RTX 6000 Ada)", 48 * GB),
    ("80 GB (A100 80GB, H100)", 80 * GB),
    ("141 GB (H200)", 141 * GB),
    ("192 GB (B200)", 192 * GB),
)
# The CUDA context, cuBLAS/NCCL workspaces and the allocator's fragmentation, per process.
CUDA_OVERHEAD_BYTES = int(2.0 * GIB)

F32 = 4
INT64 = 8
_VISION = "model.paligemma_with_expert.paligemma.model.vision_tower"
_PROJECTOR = "model.paligemma_with_expert.paligemma.model.multi_modal_projector"
_PALIGEMMA = "model.paligemma_with_expert.paligemma"
_LANGUAGE_LAYERS = "model.paligemma_with_expert.paligemma.model.language_model.layers"
_EXPERT_LAYERS = "model.paligemma_with_expert.gemma_expert.model.layers"
_VISION_LAYERS = _VISION + ".vision_model.encoder.layers"


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    finetune: str
    strategy: str  # ddp, fsdp, or none (one process without a group)
    gpus: int
    batch_size: int  # the global batch
    per_gpu_batch: int
    device: str  # cuda or cpu
    weights: int
    gradients: int
    optimizer: int
    activations: int
    overhead: int
    # What the activations are computed in: pi05's bf16 under autocast on CUDA, fp32 on a CPU;
    # SmolVLA's fp32 everywhere.
    compute_dtype: str = "bf16"

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    def smallest_gpu(self) -> str | None:
        return next((name for name, size in GPU_SIZES if self.total <= size), None)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "smallest_gpu": self.smallest_gpu()}


def plan_named(
    model: str,
    *,
    finetune: str,
    targets: Sequence[str] | None = None,
    lora_rank: int = 32,
    batch_size: int,
    gpus: int,
    strategy: str = "auto",
    device: str = "cuda",
) -> MemoryPlan | None:
    """The plan of a recipe on a named base model; None for a model whose family the plan does not
    know (relay.families: FamilySpec.memory_planned), or that has no named sizes. A ValueError says
    what the recipe's settings break (an unknown target, a rank out of range, SmolVLA on more than
    one GPU)."""
    layout = _layout_of(model)
    if layout is None:
        return None
    return layout.plan(
        layout.sizes[model],
        model=model,
        tuned=_named_tuning(model, finetune, None if targets is None else tuple(targets), lora_rank),
        finetune=finetune,
        batch_size=batch_size,
        gpus=gpus,
        strategy=strategy,
        device=device,
    )


def weight_count(model: str) -> int | None:
    """The base weights of a named model whose layout the plan knows (no adapters), for messages
    that say how big it is; None for any other."""
    if _layout_of(model) is None:
        return None
    return sum(w.numel for w in _named_tuning(model, "full", None, 1).base)


def _layout_of(model: str) -> MemoryLayout | None:
    spec = families.family_of(model)
    if spec is None or spec.memory_layout is None:
        return None
    layout = resolve_name(spec.memory_layout)
    if not isinstance(layout, MemoryLayout):
        raise TypeError(f"{spec.name}'s memory_layout {spec.memory_layout} is no MemoryLayout")
    return layout if model in layout.sizes else None


@functools.lru_cache(maxsize=64)
def _named_tuning(model: str, finetune: str, targets: tuple[str, ...] | None, lora_rank: int) -> Tuned:
    # The API plans on every recipe it accepts; the layout of a named model never changes.
    layout = _layout_of(model)
    assert layout is not None
    return layout.tune(layout.sizes[model], finetune, targets, lora_rank)


def plan_memory(
    shape: Pi05Shape,
    *,
    model: str,
    tuned: Tuned,
    finetune: str,
    batch_size: int,
    gpus: int,
    strategy: str = "auto",
    device: str = "cuda",
) -> MemoryPlan:
    """The per-GPU plan of one process of `gpus` sharing a global batch of `batch_size`."""
    chosen = auto_strategy(finetune) if strategy == "auto" else strategy
    cuda = device == "cuda"
    compute = 2 if cuda else 4
    every, trainable = tuned.total_params, tuned.trainable_params
    frozen = every - trainable
    per_gpu_batch = max(-(-batch_size // gpus), 1)  # rank 0's part, the largest

    if chosen == "fsdp":
        units = _unit_sizes(shape, tuned)
        largest, root = max(units), every - sum(units)
        weights = -(-every // gpus) * 4 + (root + 2 * largest) * compute
        gradients = -(-trainable // gpus) * 4 + (root + largest) * 4
        optimizer = -(-trainable // gpus) * 8
    else:
        frozen_bytes = 2 if (cuda and chosen == "ddp") else 4
        weights = frozen * frozen_bytes + trainable * 4
        gradients = trainable * 4 * (2 if chosen == "ddp" else 1)
        optimizer = trainable * 8
    checkpointed = chosen == "fsdp" and finetune == "full"
    activations = activation_bytes(
        shape, tuned, per_gpu_batch, compute=compute, cuda=cuda, checkpointed=checkpointed
    )
    return MemoryPlan(
        model=model,
        finetune=finetune,
        strategy=chosen,
        gpus=gpus,
        batch_size=batch_size,
        per_gpu_batch=per_gpu_batch,
        device=device,
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        overhead=CUDA_OVERHEAD_BYTES if cuda else 0,
        compute_dtype="bf16" if cuda else "fp32",
    )


def _unit_sizes(shape: Pi05Shape, tuned: Tuned) -> list[int]:
    """Weights (adapters included) of FSDP's units below the root: each vision layer and each
    decoder layer of both stacks (relay_engine.families.pi05.parallel.shard_units)."""
    prefixes = [
        *(f"{_VISION_LAYERS}.{i}." for i in range(shape.vision.depth)),
        *(f"{_LANGUAGE_LAYERS}.{i}." for i in range(shape.language.depth)),
        *(f"{_EXPERT_LAYERS}.{i}." for i in range(shape.expert.depth)),
    ]
    sizes = dict.fromkeys(prefixes, 0)
    for weight in tuned.base:
        unit = _unit_of(weight.name, shape)
        if unit is not None:
            sizes[unit] += weight.numel
    for weight in tuned.adapted:
        unit = _unit_of(weight.name, shape)
        if unit is not None:
            sizes[unit] += tuned.lora_rank * (weight.shape[0] + weight.shape[1])
    return list(sizes.values())


def _unit_of(name: str, shape: Pi05Shape) -> str | None:
    for stack in (_VISION_LAYERS, _LANGUAGE_LAYERS, _EXPERT_LAYERS):
        if name.startswith(stack + "."):
            index = name[len(stack) + 1 :].partition(".")[0]
            return f"{stack}.{index}."
    return None


def plan_smolvla(
    sizes: SmolVLASizes,
    *,
    model: str,
    tuned: Tuned,
    finetune: str,
    batch_size: int,
    gpus: int,
    strategy: str = "auto",
    device: str = "cuda",
) -> MemoryPlan:
    """The plan of a SmolVLA job: one process (FamilySpec.max_gpus), everything in fp32."""
    if gpus != 1 or strategy not in ("auto", "none"):
        raise ValueError(f"{model} trains in one process on one GPU: gpus must be 1 and strategy auto")
    trainable = tuned.trainable_params
    kept = smolvla_layout.kept_activations(sizes, tuned, batch_size)
    return MemoryPlan(
        model=model,
        finetune=finetune,
        strategy="none",
        gpus=1,
        batch_size=batch_size,
        per_gpu_batch=batch_size,
        device=device,
        weights=tuned.total_params * F32,
        gradients=trainable * F32,
        optimizer=trainable * 2 * F32,
        activations=kept.total + kept.largest_layer,
        overhead=CUDA_OVERHEAD_BYTES if device == "cuda" else 0,
        compute_dtype="fp32",
    )


@dataclass(frozen=True)
class MemoryLayout:
    """How a family's named models are planned: their sizes, what a recipe's settings train of
    them (sizes, finetune, targets, lora_rank -> Tuned) and the plan of one (plan_memory's
    arguments)."""

    sizes: Mapping[str, Any]
    tune: Callable[[Any, str, Sequence[str] | None, int], Tuned]
    plan: Callable[..., MemoryPlan]


# The layouts the built-in families' specs name (FamilySpec.memory_layout).
PI05_LAYOUT = MemoryLayout(pi05_layout.NAMED_SIZES, pi05_layout.tune, plan_memory)
SMOLVLA_LAYOUT = MemoryLayout(smolvla_layout.NAMED_SIZES, smolvla_layout.tune, plan_smolvla)


# -- activations ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    """One process's training step: its samples and how its tensors are stored."""

    batch: int
    compute: int  # bytes of an activation: 2 (bf16) on CUDA, 4 on the CPU
    cuda: bool  # on CUDA attention repeats the shared key/value head for every query head

    def kv_heads(self, size: GemmaSize) -> int:
        return size.num_heads if self.cuda else size.num_kv_heads


def _rms_norm(tokens: int, width: int, step: _Step) -> int:
    # Kept in fp32: the input and its normalized value (and 1/rms per token); the output, in the
    # compute dtype, is kept by the linear layers that read it.
    return 2 * tokens * width * F32 + tokens * F32 + tokens * width * step.compute


def _language_layer(tokens: int, size: GemmaSize, step: _Step, *, keys_only: bool = False) -> int:
    """A language-model layer over `tokens` (all samples' prefix tokens): its attention reads
    its own keys; the last layer only makes keys and values."""
    norm = _rms_norm(tokens, size.width, step)
    if keys_only:
        return norm
    c = step.compute
    attention = (
        2 * tokens * size.num_heads * size.head_dim * c  # queries, attention output
        + 2 * tokens * step.kv_heads(size) * size.head_dim * c  # keys, values
        + tokens * size.num_heads * F32  # the softmax's log-sum-exp
    )
    mlp = 4 * tokens * size.mlp_dim * c  # gate, gelu(gate), up, their product
    return 2 * norm + attention + mlp


def _expert_layer(tokens: int, key_tokens: int, size: GemmaSize, step: _Step) -> int:
    """An action-expert layer over `tokens` (the samples' actions) attending to `key_tokens`
    (the prefix and the actions), with adaptive norms and gated residuals."""
    c = step.compute
    norm = _rms_norm(tokens, size.width, step) + step.batch * size.width * F32  # 1 + scale
    attention = (
        2 * tokens * size.num_heads * size.head_dim * c
        + 2 * key_tokens * step.kv_heads(size) * size.head_dim * c  # [prefix ; own] keys, values
        + tokens * size.num_heads * F32
    )
    mlp = 4 * tokens * size.mlp_dim * c
    gates = 2 * tokens * size.width * c + 2 * step.batch * 3 * size.width * c  # branch outputs, gates
    return 2 * norm + attention + mlp + gates


def _vision_layer(tokens: int, width: int, mlp_dim: int, heads: int, step: _Step) -> int:
    c = step.compute
    norms = 2 * (2 * tokens * width * c + 2 * tokens * F32)  # input, output, mean and 1/std
    attention = 4 * tokens * width * c + tokens * heads * F32  # q, k, v, output; log-sum-exp
    return norms + attention + 2 * tokens * mlp_dim * c  # fc1's output, gelu's


def activation_bytes(
    shape: Pi05Shape, tuned: Tuned, batch: int, *, compute: int, cuda: bool, checkpointed: bool
) -> int:
    """Bytes of activations over one training step of `batch` samples (see the module's text)."""
    if tuned.trainable_params == 0:
        return 0
    kept = kept_activations(shape, tuned, batch, compute=compute, cuda=cuda)
    language, expert = shape.language, shape.expert
    prefix_tokens = batch * _prefix_length(shape)
    # The prefix's keys and values of every layer, alive until the action expert has read them.
    cache = 2 * language.depth * prefix_tokens * language.num_kv_heads * language.head_dim * compute
    if not checkpointed:
        return kept.total + cache + kept.largest_layer
    # Checkpointed decoder layers keep only their input hidden states (the vision tower's are
    # not checkpointed); in backward one layer at a time is recomputed, and works.
    expert_tokens = batch * shape.action_horizon
    inputs = expert.depth * expert_tokens * expert.width * compute
    if kept.prefix_grad:
        inputs += language.depth * prefix_tokens * language.width * compute
    return kept.total - kept.decoder_layers + inputs + cache + 2 * kept.largest_layer


@dataclass(frozen=True)
class KeptActivations:
    total: int  # what autograd keeps for backward over one step, without checkpointing
    decoder_layers: int  # the part kept by the decoder layers of both stacks
    largest_layer: int  # the largest layer's activations, as if it trained: a running layer's
    prefix_grad: bool  # whether gradients flow through the prefix (a prefix weight trains)


def kept_activations(
    shape: Pi05Shape, tuned: Tuned, batch: int, *, compute: int, cuda: bool
) -> KeptActivations:
    """What autograd keeps for backward over one training step of `batch` samples."""
    step = _Step(batch, compute, cuda)
    vision, language, expert = shape.vision, shape.language, shape.expert
    cameras = len(MODEL_CAMERAS)
    images = batch * cameras
    vision_tokens = images * vision.tokens_per_image
    prefix_tokens = batch * _prefix_length(shape)
    expert_tokens = batch * shape.action_horizon
    vision_grad = tuned.trains_under(_VISION)
    projector_grad = vision_grad or tuned.trains_under(_PROJECTOR)
    prefix_grad = tuned.trains_under(_PALIGEMMA)
    one_vision = _vision_layer(vision_tokens, vision.width, vision.mlp_dim, vision.num_heads, step)
    one_language = _language_layer(prefix_tokens, language, step)
    one_expert = _expert_layer(expert_tokens, prefix_tokens + expert_tokens, expert, step)

    saved = decoder = 0
    if vision_grad:
        pixels = images * 3 * vision.image_size**2 * compute
        final_norm = 2 * vision_tokens * vision.width * compute + 2 * vision_tokens * F32
        saved += pixels + vision.depth * one_vision + final_norm
    elif projector_grad:
        saved += vision_tokens * vision.width * compute  # the projector's input
    if prefix_grad:
        saved += batch * shape.max_token_len * INT64  # the prompt's token ids
        decoder += (language.depth - 1) * one_language
        decoder += _language_layer(prefix_tokens, language, step, keys_only=True)
    # The action expert always trains or passes gradients back to the prefix.
    width = expert.width
    decoder += expert.depth * one_expert
    saved += decoder
    saved += _rms_norm(expert_tokens, width, step) + batch * width * F32  # the final norm
    saved += expert_tokens * width * F32  # the action head's fp32 input
    saved += 4 * batch * width * compute  # the time MLP's inputs and activations
    saved += 5 * expert_tokens * shape.action_dim * F32  # noisy actions in; the loss's terms
    saved += _adapter_bytes(
        tuned, step, vision_tokens, prefix_tokens, expert_tokens, vision_grad, prefix_grad
    )
    return KeptActivations(saved, decoder, max(one_vision, one_language, one_expert), prefix_grad)


def _adapter_bytes(
    tuned: Tuned,
    step: _Step,
    vision_tokens: int,
    prefix_tokens: int,
    expert_tokens: int,
    vision_grad: bool,
    prefix_grad: bool,
) -> int:
    """LoRA keeps lora_A's output (tokens x rank) for lora_B's gradient, per adapted layer run."""
    rows = 0
    for weight in tuned.adapted:
        name = weight.name
        if name.startswith(_VISION):
            rows += vision_tokens if vision_grad else 0
        elif name.startswith(_PROJECTOR):
            rows += vision_tokens if prefix_grad else 0
        elif name.startswith(_PALIGEMMA):
            rows += prefix_tokens if prefix_grad else 0
        elif ".norm" in name or "layernorm" in name:
            rows += step.batch  # the adaptive norms read the time condition, one row per sample
        else:
            rows += expert_tokens
    return rows * tuned.lora_rank * step.compute


def _prefix_length(shape: Pi05Shape) -> int:
    """Tokens of one sample's prefix at most: every camera's image tokens, then the prompt."""
    return len(MODEL_CAMERAS) * shape.vision.tokens_per_image + shape.max_token_len


def gpu_shortfall(plan: MemoryPlan, gpu_bytes: int) -> str | None:
    """None when the plan fits a GPU of `gpu_bytes`; else the rule it breaks, in words."""
    if plan.total <= gpu_bytes:
        return None
    return f"needs about {plan.total / GB:.0f} GB per GPU; the largest worker GPU has {gpu_bytes / GB:.0f} GB"


def cpu_refusal(model: str, planned: MemoryPlan | None, where: str) -> str:
    """Why a job of `model` is not trained on a CPU, as one clause: the model's size, the job's
    plan on a CPU when there is one, `where` (whose CPU: "every live worker trains on its CPU",
    "this worker trains on its CPU") and what to do. The API's refusal and a worker's say it alike."""
    weights = weight_count(model)
    size = f"{model} is sized for GPUs" if weights is None else f"{model} has {weights / 1e9:.2f} B weights"
    if planned is not None:
        size += f"; this job's memory plan needs about {planned.total / GB:.0f} GB on a CPU"
    return (
        f"{size}, and {where}: use {_cpu_sized_kin(model)} here, or a GPU; "
        "RELAY_ALLOW_CPU_FULL_SIZE=true lets a CPU train it"
    )


def _cpu_sized_kin(model: str) -> str:
    """The models of `model`'s own family that a CPU trains (smolvla's: smolvla-tiny): what a
    refusal on a CPU suggests instead."""
    spec = families.family_of(model)
    kin = () if spec is None else tuple(m for m in spec.models if m not in spec.gpu_sized_models)
    return " or ".join(kin) if kin else "a smaller model"


def plan_of_recipe(config: SFTConfig, device: str = "cuda") -> MemoryPlan | None:
    """plan_named for a recipe's own settings, per process of its `gpus` (1 when not chosen yet)."""
    return plan_named(
        config.model,
        finetune=config.finetune,
        targets=config.targets,
        lora_rank=config.lora_rank,
        batch_size=config.batch_size,
        gpus=config.gpus or 1,
        device=device,
    )
