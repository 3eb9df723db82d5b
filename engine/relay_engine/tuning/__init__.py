"""Where training goes: LoRA (peft) or full fine-tuning of a Pi05Policy's targets.

model = apply_tuning(policy, "lora", targets=None, lora_rank=32)   # in place; returns the policy
trainable_state_dict(model) / load_trainable_state_dict(model, state)  # checkpoints
merged_policy(model)                                               # adapters merged, original names
parameter_counts(model)                                            # per target, for `relay models info`
"""

from relay_engine.tuning.targets import PLACES, validate_targets
from relay_engine.tuning.tuning import (
    LORA_RANK_RANGE,
    apply_tuning,
    load_trainable_state_dict,
    merged_policy,
    parameter_counts,
    trainable_state_dict,
)

__all__ = [
    "LORA_RANK_RANGE",
    "PLACES",
    "apply_tuning",
    "load_trainable_state_dict",
    "merged_policy",
    "parameter_counts",
    "trainable_state_dict",
    "validate_targets",
]
