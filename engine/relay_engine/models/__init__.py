"""pi0.5 ("pi05") in PyTorch: the model, its processor, and loading and saving it.

policy = load_policy("pi05-tiny" | "pi05" | "/path/to/output_dir", device="cpu")
batch = policy.collate(samples)             # relay_engine.samples.Sample -> Pi05Batch
loss, per_sample = flow_matching_loss(policy.flow_outputs(batch), batch)
actions = policy.sample_actions(batch)      # (B, action_horizon, 32)
policy.save_pretrained(directory)           # lerobot-compatible model.safetensors + config.json
"""

from relay_engine.models.config import GemmaSize, Pi05Config, VisionSize, named_config
from relay_engine.models.pi05 import (
    FlowOutputs,
    Pi05Policy,
    PrefixCache,
    flow_matching_loss,
    sample_flow_time,
)
from relay_engine.models.processor import Pi05Batch, Pi05Collator, image_fit, model_image
from relay_engine.models.tokenizer import ByteTokenizer, discretize_state, format_prompt
from relay_engine.models.weights import (
    build_policy,
    exported_state_dict,
    load_policy,
    materialize_buffers,
    to_lerobot_state_dict,
    to_policy_state_dict,
)

__all__ = [
    "ByteTokenizer",
    "FlowOutputs",
    "GemmaSize",
    "Pi05Batch",
    "Pi05Collator",
    "Pi05Config",
    "Pi05Policy",
    "PrefixCache",
    "VisionSize",
    "build_policy",
    "discretize_state",
    "exported_state_dict",
    "flow_matching_loss",
    "format_prompt",
    "image_fit",
    "load_policy",
    "materialize_buffers",
    "model_image",
    "named_config",
    "sample_flow_time",
    "to_lerobot_state_dict",
    "to_policy_state_dict",
]
