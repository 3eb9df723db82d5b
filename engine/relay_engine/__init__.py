"""Relay's training engine: LeRobot datasets, pi0.5, LoRA/full tuning, the loop and its checkpoints.

    from relay_engine import Trainer, TrainingArguments, load_policy, open_dataset
    from relay_engine import evaluate_in_env   # closed-loop evaluation in Gymnasium environments

The names below load on first use, so `import relay_engine.errors` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "open_dataset": "relay_engine.datasets",
    "load_policy": "relay_engine.models",
    "apply_tuning": "relay_engine.tuning",
    "Trainer": "relay_engine.families.pi05.trainer",
    "TrainingArguments": "relay_engine.families.pi05.trainer",
    "Learner": "relay_engine.core.learner",
    "Pi05Learner": "relay_engine.families.pi05.learner",
    "AdamParams": "relay.optimizer",
    "Recipe": "relay_engine.recipe",
    "run_recipe": "relay_engine.recipe",
    "evaluate_in_env": "relay_engine.envs.evaluate",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'relay_engine' has no attribute {name!r}")
