"""How much memory a job needs on each GPU: weights, gradients, optimizer state, activations.

The weights, gradients and AdamW moments follow from parameter counts and the strategy:

- DDP: every process holds the whole model (frozen weights in bf16 on CUDA, trainable in fp32),
  the trainable weights' fp32 gradients twice (the gradients and DDP's reduction buckets), and
  their two fp32 AdamW moments.
- FSDP: every process holds 1/N of the fp32 weights, gradients and moments, plus, while a unit
  runs, its gathered weights in the compute dtype (the unit running and the one prefetched) and
  its unsharded fp32 gradients; the root unit (embeddings, heads) stays gathered for the step.

Activations are not guessed: the policy runs one forward pass on PyTorch's meta device (shapes,
no memory) at the process's batch, and the plan adds up the bytes of every tensor autograd saves
for backward. With activation checkpointing (FSDP for full fine-tuning) that count holds only
the layers' inputs, and one layer's activations are added back for its recomputation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from relay.catalog import MODEL_CAMERAS
from relay_engine.distributed.group import batch_slice
from relay_engine.distributed.parallel import Strategy, choose_strategy, shard_units
from relay_engine.models import Pi05Batch, Pi05Policy, flow_matching_loss
from relay_engine.models.layers import GemmaDecoderLayer

GIB = 1024**3
# GPUs by memory, to name the smallest a plan fits (the bytes a job can use, less the driver's).
GPU_SIZES: tuple[tuple[str, int], ...] = (
    ("24 GB (L4, RTX 4090)", 24 * 10**9),
    ("40 GB (A100 40GB)", 40 * 10**9),
    ("48 GB (L40S, RTX 6000 Ada)", 48 * 10**9),
    ("80 GB (A100 80GB, H100)", 80 * 10**9),
    ("141 GB (H200)", 141 * 10**9),
    ("192 GB (B200)", 192 * 10**9),
)
# The CUDA context, cuBLAS/NCCL workspaces and the allocator's fragmentation, per process.
CUDA_OVERHEAD_BYTES = int(2.0 * GIB)


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    finetune: str
    strategy: str  # ddp, fsdp, or none (one process without a group)
    gpus: int
    batch_size: int  # the global batch
    per_gpu_batch: int
    device: str  # cuda (bf16 compute) or cpu (fp32)
    weights: int
    gradients: int
    optimizer: int
    activations: int
    overhead: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    def smallest_gpu(self) -> str | None:
        return next((name for name, size in GPU_SIZES if self.total <= size), None)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "smallest_gpu": self.smallest_gpu()}


def plan_memory(
    policy: Pi05Policy,
    *,
    batch_size: int,
    gpus: int,
    strategy: str = "auto",
    device: str = "cuda",
) -> MemoryPlan:
    """The per-GPU plan for a tuned policy (built on the meta device: nothing is allocated)."""
    finetune = str((policy.config.tuning or {}).get("finetune", "lora"))
    chosen: Strategy | str = choose_strategy(strategy, finetune) if strategy != "none" else "none"
    cuda = device == "cuda"
    compute_bytes = 2 if cuda else 4
    params = list(policy.parameters())
    every = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    frozen = every - trainable
    per_gpu_batch = max(batch_slice(batch_size, 0, gpus)[1], 1)

    if chosen == "fsdp":
        units = shard_units(policy)
        largest = max(sum(p.numel() for p in unit.parameters()) for unit in units)
        root = every - sum(sum(p.numel() for p in unit.parameters()) for unit in units)
        weights = math.ceil(every / gpus) * 4 + (root + 2 * largest) * compute_bytes
        gradients = math.ceil(trainable / gpus) * 4 + (root + largest) * 4
        optimizer = math.ceil(trainable / gpus) * 8
    else:
        frozen_bytes = 2 if (cuda and chosen == "ddp") else 4
        weights = frozen * frozen_bytes + trainable * 4
        gradients = trainable * 4 * (2 if chosen == "ddp" else 1)
        optimizer = trainable * 8
    checkpointed = chosen == "fsdp" and finetune == "full"
    activations = activation_bytes(policy, per_gpu_batch, compute_bytes, checkpointed)
    return MemoryPlan(
        model=policy.config.model,
        finetune=finetune,
        strategy=str(chosen),
        gpus=gpus,
        batch_size=batch_size,
        per_gpu_batch=per_gpu_batch,
        device=device,
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        overhead=CUDA_OVERHEAD_BYTES if cuda else 0,
    )


def activation_bytes(policy: Pi05Policy, batch: int, compute_bytes: int, checkpointed: bool) -> int:
    """Bytes autograd keeps for backward over one training step of `batch` samples (meta device)."""
    if not any(p.requires_grad for p in policy.parameters()):
        return 0
    layers = [m for m in policy.modules() if isinstance(m, GemmaDecoderLayer)]
    kept = _saved_bytes(policy, batch, compute_bytes, layers, checkpoint=False)
    if not checkpointed:
        return kept
    inputs_only = _saved_bytes(policy, batch, compute_bytes, layers, checkpoint=True)
    # While one layer recomputes in backward its activations are back; the prefix layers are the
    # largest (hundreds of tokens against the expert's few), so the mean is a fair stand-in.
    recompute = (kept - inputs_only) // max(len(layers), 1)
    return inputs_only + 2 * recompute


def _saved_bytes(
    policy: Pi05Policy, batch: int, compute_bytes: int, layers: list[GemmaDecoderLayer], *, checkpoint: bool
) -> int:
    meta = _meta_copy(policy, torch.bfloat16 if compute_bytes == 2 else torch.float32)
    for layer in (m for m in meta.modules() if isinstance(m, GemmaDecoderLayer)):
        layer.checkpoint_activations = checkpoint
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, nn.Parameter):  # weights are counted as weights
            storages[id(tensor.untyped_storage())] = tensor.untyped_storage().nbytes()
        return tensor

    batch_data = _meta_batch(meta, batch, next(meta.parameters()).dtype)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _keep_storages() as alive:
        outputs = meta.flow_outputs(
            batch_data,
            noise=torch.zeros_like(batch_data.actions),
            time=torch.full((batch,), 0.5, device="meta"),
        )
        loss, _ = flow_matching_loss(outputs, batch_data)
        alive.append(loss)
    return sum(storages.values())


@contextmanager
def _keep_storages() -> Iterator[list[Any]]:
    # Holding the graph's output keeps every saved tensor alive (so no storage id is reused).
    alive: list[Any] = []
    yield alive


def _meta_copy(policy: Pi05Policy, dtype: torch.dtype) -> Pi05Policy:
    """The same policy structure and trainable flags, on the meta device, in the compute dtype."""
    with torch.device("meta"):
        copy = Pi05Policy(policy.config, tokenizer=policy.collate.tokenizer)
    copy.to(dtype)
    flags = {name: p.requires_grad for name, p in policy.named_parameters()}
    if set(flags) != {name for name, _ in copy.named_parameters()}:
        # A LoRA policy has adapter weights the plain structure lacks: rebuild it tuned.
        from relay_engine.tuning import apply_tuning

        tuning = dict(policy.config.tuning or {})
        with torch.device("meta"):
            copy = Pi05Policy(policy.config, tokenizer=policy.collate.tokenizer)
        copy = apply_tuning(
            copy,
            tuning["finetune"],
            tuning.get("targets"),
            tuning.get("lora_rank", 32),
            tuning.get("lora_alpha"),
        )
        copy.to(dtype)
    for name, parameter in copy.named_parameters():
        parameter.requires_grad_(flags[name])
    return copy


def _meta_batch(policy: Pi05Policy, batch: int, dtype: torch.dtype) -> Pi05Batch:
    config = policy.config
    size = config.vision.image_size
    cameras = len(MODEL_CAMERAS)
    horizon, width, tokens = config.action_horizon, config.action_dim, config.max_token_len
    with torch.device("meta"):
        return Pi05Batch(
            images=torch.empty(batch, cameras, 3, size, size, dtype=dtype),
            image_mask=torch.ones(batch, cameras, dtype=torch.bool),
            tokens=torch.zeros(batch, tokens, dtype=torch.long),
            token_mask=torch.ones(batch, tokens, dtype=torch.bool),
            actions=torch.empty(batch, horizon, width, dtype=torch.float32),
            action_mask=torch.ones(batch, horizon, width, dtype=torch.bool),
            weights=torch.ones(batch),
            cameras_in_use=(True,) * cameras,
        )
