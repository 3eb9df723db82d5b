"""LoRA on a SmolVLA policy, where lerobot puts it by default (`SmolVLAPolicy._get_default_peft_targets`
in lerobot 0.6.1): the action expert's query and value projections, and the state, action and
time projections that map the robot into the model and back. Everything else stays frozen.

peft's adapters are injected in place (lora_B starts at zero, so a freshly adapted policy acts as
the base one). The output a job writes has the adapters merged in, under lerobot's names
(`SmolVLAPolicy.save_lerobot`), so lerobot and every Relay path load it as a plain SmolVLA.
"""

from __future__ import annotations

import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import LoraLayer

from relay.smolvla_layout import LORA_TARGETS
from relay_engine.errors import ConfigError
from relay_engine.families.smolvla.policy import SmolVLAPolicy

# LORA_TARGETS (module paths; peft matches the whole path against it) is the SDK's, whose layout
# counts the adapters for the memory plan without torch.
ADAPTER = "default"


def apply_lora(policy: SmolVLAPolicy, rank: int, alpha: float, seed: int) -> SmolVLAPolicy:
    """Adapt `policy` in place with LoRA of `rank` (updates scaled by alpha / rank); only the
    adapters train."""
    if is_adapted(policy):
        raise ConfigError("this SmolVLA is already tuned with LoRA; tune a freshly loaded one")
    config = LoraConfig(
        r=rank,
        # peft annotates lora_alpha as an int; it only divides it by r, so any alpha > 0 works.
        lora_alpha=alpha,  # type: ignore[arg-type]
        lora_dropout=0.0,
        bias="none",
        target_modules=LORA_TARGETS,
    )
    # peft draws lora_A from the global RNG: seeding it makes two runs of one recipe start alike.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(config, policy, adapter_name=ADAPTER)
    for name, parameter in policy.named_parameters():
        parameter.requires_grad_(".lora_" in name)
    return policy


def is_adapted(policy: torch.nn.Module) -> bool:
    return any(isinstance(module, LoraLayer) for module in policy.modules())
