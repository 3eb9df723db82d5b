"""AdamParams: one AdamW step's settings, the one definition shared by the SDK and the engine.

A training-loop session sends them with every optim_step (``relay.training.types.AdamParams``); a
recipe job's fixed schedule and the local trainer build them for every step of the engine's loop.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from relay.errors import ConfigError


@dataclass(frozen=True)
class AdamParams:
    """One AdamW step's settings, passed with every ``optim_step`` (so a schedule is a line of Python)."""

    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 1.0  # 0 turns clipping off

    def __post_init__(self) -> None:
        _number(self, "learning_rate", "a number >= 0", lambda x: x >= 0)
        _number(self, "beta1", "a number from 0 to below 1", lambda x: 0 <= x < 1)
        _number(self, "beta2", "a number from 0 to below 1", lambda x: 0 <= x < 1)
        _number(self, "eps", "a number greater than 0", lambda x: x > 0)
        _number(self, "weight_decay", "a number >= 0", lambda x: x >= 0)
        _number(self, "grad_clip_norm", "a number >= 0 (0 turns clipping off)", lambda x: x >= 0)

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def _number(params: AdamParams, name: str, rule: str, ok: Any) -> None:
    value = getattr(params, name)
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise ConfigError(f"bad {name}: {value!r} (must be {rule})", param=name)
    if not math.isfinite(float(value)) or not ok(float(value)):
        raise ConfigError(f"bad {name}: {value!r} (must be {rule})", param=name)
