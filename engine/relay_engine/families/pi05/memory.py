"""How much memory a job needs on each GPU, for a built (or meta) policy.

The arithmetic is `relay.memory_plan`'s, torch-free, so the API refuses the jobs that fit no
worker's GPUs with the same figures; this reads the policy's sizes and tuning settings.
"""

from __future__ import annotations

from relay.catalog import LORA_RANK_DEFAULT
from relay.memory_plan import CUDA_OVERHEAD_BYTES, GIB, GPU_SIZES, MemoryPlan
from relay.memory_plan import plan_memory as plan_from_sizes
from relay.pi05_layout import tune
from relay_engine.models import Pi05Policy

__all__ = ["CUDA_OVERHEAD_BYTES", "GIB", "GPU_SIZES", "MemoryPlan", "plan_memory"]


def plan_memory(
    policy: Pi05Policy,
    *,
    batch_size: int,
    gpus: int,
    strategy: str = "auto",
    device: str = "cuda",
) -> MemoryPlan:
    """The per-GPU plan for a tuned policy (nothing is allocated: a meta policy does)."""
    tuning = policy.config.tuning or {}
    finetune = str(tuning.get("finetune", "lora"))
    return plan_from_sizes(
        policy.config,
        model=policy.config.model,
        tuned=tune(
            policy.config, finetune, tuning.get("targets"), int(tuning.get("lora_rank", LORA_RANK_DEFAULT))
        ),
        finetune=finetune,
        batch_size=batch_size,
        gpus=gpus,
        strategy=strategy,
        device=device,
    )
