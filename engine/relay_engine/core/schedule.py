"""The recipe's learning-rate schedule: linear warmup, then cosine decay to zero.

Warmup covers the first tenth of the steps, at most 200. Steps are counted from 0; step s of the
warmup uses peak * (s + 1) / warmup, so the first step already learns (openpi and optax start
at peak / (warmup + 1) for the same reason). After warmup the rate follows half a cosine that
reaches zero at the end of the last step.
"""

from __future__ import annotations

import math

MAX_WARMUP_STEPS = 200


def warmup_steps(total_steps: int) -> int:
    return min(MAX_WARMUP_STEPS, total_steps // 10)


def learning_rate(step: int, total_steps: int, peak: float) -> float:
    """The rate for optimizer step `step` (0-based) of a run of `total_steps` steps."""
    if not 0 <= step < total_steps:
        raise ValueError(f"step {step} is outside a run of {total_steps} steps")
    warmup = warmup_steps(total_steps)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / (total_steps - warmup)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
