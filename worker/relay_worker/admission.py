"""Whether this worker can hold a job it is handed: the worker's own side of admission.

The API admits a job against the live workers' heartbeats (relay_api.fine_tunes.check_memory), but
a job can still reach a worker that cannot hold it: one created before any worker beat, a worker
restarted with fewer or smaller GPUs, a plan computed by an older API. Training it would end in an
out-of-memory kill or a CPU grinding a 3 B model, after retries. The worker asks the same memory
plan (relay.memory_plan) before it trains. When another live worker can hold the job, it leaves the
job to that one; when none can, it ends the job at once with the reason (no retries).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from relay import families
from relay.memory_plan import GB, cpu_refusal, plan_of_recipe
from relay.sft.config import SFTConfig
from relay_api.settings import Settings
from relay_api.workers import LiveWorker

THIS_CPU = "this worker trains on its CPU"


def refusal(stored: Mapping[str, Any], settings: Settings, gpu_memory: int | None) -> str | None:
    """Why a worker with GPUs of `gpu_memory` bytes (None: its CPU) cannot hold the job of the
    `stored` recipe, as the job's error; None when it can (or when the recipe no longer reads as
    one: the engine then says what is wrong with it)."""
    try:
        config = SFTConfig.model_validate(dict(stored))
    except ValidationError:
        return None
    if gpu_memory is None:
        if settings.allow_cpu_full_size or not families.is_gpu_sized(config.model):
            return None
        return (
            f"this job cannot run here: {cpu_refusal(config.model, plan_of_recipe(config, 'cpu'), THIS_CPU)}"
        )
    planned = plan_of_recipe(config, "cuda")
    if planned is None or planned.total <= gpu_memory:
        return None
    spec = families.family_of(config.model)
    # A one-process family (SmolVLA) cannot spread over more GPUs.
    changes = (
        "a smaller batch_size or"
        if spec is not None and spec.one_process
        else "a smaller batch_size, more gpus or"
    )
    return (
        f"this job cannot run here: its memory plan needs about {planned.total / GB:.0f} GB on each "
        f"GPU, and this worker's GPUs have {gpu_memory / GB:.0f} GB ({changes} finetune lora may fit; "
        "relay models info MODEL --memory plans it)"
    )


def another_can_hold(stored: Mapping[str, Any], settings: Settings, workers: list[LiveWorker]) -> bool:
    """Whether some live worker (by its heartbeat) holds the job, so this one should leave it."""
    return any(refusal(stored, settings, worker.gpu_memory) is None for worker in workers)
