"""How one model trains across the processes of a group: DDP or FSDP2.

- DDP (DistributedDataParallel) keeps a whole copy of the model in every process and averages
  the trainable weights' gradients after each backward. It suits LoRA and other small trainable
  parts: the gradients to average are small, and the frozen weights are only read.
- FSDP2 (`fully_shard`) keeps 1/N of every weight, gradient and optimizer moment in each process
  and gathers one block's weights just before it runs. It suits full fine-tuning, where the
  weights, gradients and AdamW moments of pi05 do not fit one GPU. Each decoder and vision layer
  is its own unit (gathered, then freed, in turn); activation checkpointing of the decoder
  layers is on for full fine-tuning. On CUDA the weights compute in bf16 while the sharded
  master weights, the reductions and the optimizer stay fp32.

Both reduce a gradient as the mean over processes; pi05's learner (Pi05Learner) divides by the
global weight, so the update is the one a single process would make on the whole batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, cast

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from relay.catalog import STRATEGIES, auto_strategy
from relay_engine.core.group import GroupCollectives, World
from relay_engine.errors import ConfigError
from relay_engine.models import FlowOutputs, Pi05Batch, Pi05Policy
from relay_engine.models.layers import GemmaDecoderLayer

Strategy = Literal["ddp", "fsdp"]


def choose_strategy(requested: str, finetune: str) -> Strategy:
    """`auto`: FSDP when the full model trains, DDP when only adapters (or a small part) do."""
    if requested not in STRATEGIES:
        raise ConfigError(f"bad strategy: {requested!r} (must be one of {', '.join(STRATEGIES)})")
    if requested == "auto":
        return cast(Strategy, auto_strategy(finetune))
    return cast(Strategy, requested)


class _FlowForward(nn.Module):
    """The policy's training forward as a module `forward`, which is what DDP hooks."""

    def __init__(self, policy: Pi05Policy) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, batch: Pi05Batch, noise: torch.Tensor, time: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.policy.flow_outputs(batch, noise=noise, time=time)
        return out.velocity, out.target, out.x_t, out.noise, out.time


class Parallel(GroupCollectives):
    """A pi05 policy made ready for a group (DDP or FSDP2), with the group's collectives."""

    def __init__(self, policy: Pi05Policy, world: World, strategy: Strategy) -> None:
        super().__init__(world)
        self.policy = policy
        self.strategy = strategy
        # FSDP leaves each rank a shard: only DDP's rank 0 can evaluate the model alone.
        self.whole_on_each_rank = strategy == "ddp"
        self._ddp: DistributedDataParallel | None = None
        if strategy == "ddp":
            if world.device.type == "cuda":
                _store_frozen_in_bf16(policy)
            # Every process builds the same weights from the same seed and files, so the initial
            # broadcast of all 3B weights is skipped; the only buffers (SigLIP's position ids)
            # are constants, so they are not synced either.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
                self._ddp = DistributedDataParallel(
                    _FlowForward(policy),
                    device_ids=None,
                    broadcast_buffers=False,
                    find_unused_parameters=trains_unreached_weights(policy),
                    init_sync=False,
                )
        else:
            _shard(policy, world, checkpoint_activations=_trains_everything(policy))

    def flow_outputs(self, batch: Pi05Batch, noise: torch.Tensor, time: torch.Tensor) -> FlowOutputs:
        if self._ddp is not None:
            velocity, target, x_t, noise_out, time_out = self._ddp(batch, noise, time)
            return FlowOutputs(velocity=velocity, target=target, x_t=x_t, noise=noise_out, time=time_out)
        return self.policy.flow_outputs(batch, noise=noise, time=time)

    @contextmanager
    def no_gradient_sync(self) -> Iterator[None]:
        """Backward passes inside keep their gradients local (all but a step's last micro-batch)."""
        if self._ddp is not None:
            with self._ddp.no_sync():
                yield
            return
        module = cast(FSDPModule, self.policy)
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    @staticmethod
    def full_norm(norm: torch.Tensor) -> torch.Tensor:
        """A total gradient norm as a plain tensor (FSDP's is a DTensor over the shards)."""
        return norm.full_tensor() if isinstance(norm, DTensor) else norm


def trains_unreached_weights(policy: Pi05Policy) -> bool:
    """Whether a trainable weight gets no gradient from a training pass.

    The prefix's last layer only makes keys and values, and the language model's final norm is
    never used (see Pi05Model.prefix_cache). DDP must then look for such weights every step (a
    walk over the graph) and give them zero gradients; it is told to only when there are some.
    """
    language = policy.model.language_model
    last = language.layers[-1]
    assert isinstance(last, GemmaDecoderLayer)
    used_by_last = {
        id(p)
        for part in (last.input_layernorm, last.self_attn.k_proj, last.self_attn.v_proj)
        for p in part.parameters()
    }
    unreached = [*language.norm.parameters(), *(p for p in last.parameters() if id(p) not in used_by_last)]
    return any(p.requires_grad for p in unreached)


def _trains_everything(policy: nn.Module) -> bool:
    return bool((policy.config.tuning or {}).get("finetune") == "full")  # type: ignore[union-attr, operator]


def _store_frozen_in_bf16(policy: nn.Module) -> None:
    """Frozen weights are only read, in bf16 under autocast anyway: keep them in bf16 (half the memory)."""
    for parameter in policy.parameters():
        if not parameter.requires_grad and parameter.dtype == torch.float32:
            parameter.data = parameter.data.to(torch.bfloat16)


def shard_units(policy: Pi05Policy) -> list[nn.Module]:
    """FSDP's units below the root: each vision layer and each decoder layer of both stacks.

    Everything else (embeddings, projector, action and time heads, final norms) is the root unit.
    """
    model = policy.model
    return [
        *model.vision_tower.vision_model.encoder.layers,
        *model.language_model.layers,
        *model.expert.layers,
    ]


def _shard(policy: Pi05Policy, world: World, *, checkpoint_activations: bool) -> None:
    mixed = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if world.device.type == "cuda"
        else MixedPrecisionPolicy()
    )
    for unit in shard_units(policy):
        if isinstance(unit, GemmaDecoderLayer):
            unit.checkpoint_activations = checkpoint_activations
        fully_shard(unit, mp_policy=mixed)
    fully_shard(policy, mp_policy=mixed)
    # The policy trains and samples through these methods, not `forward`.
    register_fsdp_forward_method(policy, "flow_outputs")
    register_fsdp_forward_method(policy, "sample_actions")
