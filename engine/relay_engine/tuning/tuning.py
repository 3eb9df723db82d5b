"""LoRA or full fine-tuning of a Pi05Policy, on the targets a recipe or session names.

`apply_tuning` changes the policy in place and returns it: peft's LoRA layers are injected into
the targeted linear layers (lora_B starts at zero, so a freshly tuned policy acts as the base
one), and `requires_grad` says what trains. The policy reads `requires_grad` to decide whether
its prefix needs autograd (`Pi05Policy.prefix_trainable`).
"""

from __future__ import annotations

from typing import Any

import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import LoraLayer

from relay.catalog import FINETUNE_METHODS, LORA_RANK_DEFAULT, LORA_RANK_MAX, TARGETS, default_targets
from relay_engine.errors import ConfigError
from relay_engine.models import Pi05Policy, exported_state_dict, materialize_buffers
from relay_engine.tuning.targets import PLACES, any_of, module_of, under, validate_targets

LORA_RANK_RANGE = (1, LORA_RANK_MAX)
ADAPTER = "default"


def apply_tuning(
    policy: Pi05Policy,
    finetune: str = "lora",
    targets: list[str] | tuple[str, ...] | None = None,
    lora_rank: int = LORA_RANK_DEFAULT,
    lora_alpha: float | None = None,
) -> Pi05Policy:
    """Make `targets` trainable by `finetune` ("lora" or "full"); everything else is frozen.

    LoRA updates are scaled by lora_alpha / lora_rank; lora_alpha defaults to the rank.
    """
    if finetune not in FINETUNE_METHODS:
        raise ConfigError(f"finetune must be one of {', '.join(FINETUNE_METHODS)}, got {finetune!r}")
    targets = validate_targets(default_targets(finetune) if targets is None else targets)
    if any(isinstance(m, LoraLayer) for m in policy.modules()):
        raise ConfigError("this policy is already tuned with LoRA; tune a freshly loaded one")
    places = [PLACES[t] for t in targets]
    settings: dict[str, Any] = {"finetune": finetune, "targets": list(targets)}
    if finetune == "lora":
        rank, alpha = _check_lora(lora_rank, lora_alpha)
        settings.update(lora_rank=rank, lora_alpha=alpha)
        full = any_of([p for place in places for p in place.full_with_lora])
        linear = any_of([p for place in places for p in place.lora])
        if linear is not None:
            config = LoraConfig(
                r=rank,
                # peft annotates lora_alpha as an int; it only divides it by r, so any alpha > 0 works.
                lora_alpha=alpha,  # type: ignore[arg-type]
                lora_dropout=0.0,
                bias="none",
                target_modules=linear.pattern,
            )
            # peft draws lora_A's initial values from the global RNG; seeding it from the
            # policy's seed makes two runs of one recipe start from the same adapters.
            cuda = [policy.device.index or 0] if policy.device.type == "cuda" else []
            with torch.random.fork_rng(devices=cuda):
                torch.manual_seed(policy.config.seed)
                inject_adapter_in_model(config, policy, adapter_name=ADAPTER)
        for name, parameter in policy.named_parameters():
            parameter.requires_grad_(".lora_" in name or under(full, module_of(name)))
    else:
        full = any_of([p for place in places for p in place.full])
        for name, parameter in policy.named_parameters():
            parameter.requires_grad_(under(full, module_of(name)))
    if not any(p.requires_grad for p in policy.parameters()):
        raise ConfigError(f"targets {list(targets)} select no weights to train")
    policy.config = policy.config.replace(tuning=settings)
    return policy


def _check_lora(rank: int, alpha: float | None) -> tuple[int, float]:
    low, high = LORA_RANK_RANGE
    if isinstance(rank, bool) or not isinstance(rank, int) or not low <= rank <= high:
        raise ConfigError(f"lora_rank must be an integer from {low} to {high}, got {rank!r}")
    alpha = float(rank) if alpha is None else float(alpha)
    if not alpha > 0:
        raise ConfigError(f"lora_alpha must be greater than 0, got {alpha}")
    return rank, alpha


def trainable_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trained weights only, under names that are the same for every policy tuned alike."""
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


def load_trainable_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy a `trainable_state_dict` back; the names and shapes must be exactly this model's."""
    parameters = {name: p for name, p in model.named_parameters() if p.requires_grad}
    missing = sorted(set(parameters) - set(state))
    unexpected = sorted(set(state) - set(parameters))
    if missing or unexpected:
        raise ConfigError(
            "these weights were saved from a model tuned differently (model, finetune, targets or rank): "
            f"{len(missing)} missing {missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}"
        )
    with torch.no_grad():
        for name, parameter in parameters.items():
            value = state[name]
            if value.shape != parameter.shape:
                raise ConfigError(
                    f"{name}: saved shape {tuple(value.shape)}, model shape {tuple(parameter.shape)}"
                )
            parameter.copy_(value)


def merged_policy(model: Pi05Policy) -> Pi05Policy:
    """A plain Pi05Policy with the adapters merged in and the original names (a copy)."""
    with torch.device("meta"):
        merged = Pi05Policy(model.config, tokenizer=model.collate.tokenizer)
    state = {name: tensor.clone() for name, tensor in exported_state_dict(model).items()}
    merged.load_state_dict(state, strict=True, assign=True)
    materialize_buffers(merged, model.device)
    return merged


def parameter_counts(model: torch.nn.Module) -> dict[str, dict[str, int]]:
    """Per target (relay.catalog.TARGETS, `all` as the total): weights, adapter weights, trainable.

    Rows overlap: `language` includes `language.attn`. Works on the meta device.
    """
    rows: dict[str, dict[str, int]] = {}
    named = [(name, module_of(name), p) for name, p in model.named_parameters()]
    for target in TARGETS:
        scope = any_of(PLACES[target].full)
        row = {"params": 0, "adapter_params": 0, "trainable": 0}
        for name, module, parameter in named:
            if not under(scope, module):
                continue
            row["adapter_params" if ".lora_" in name else "params"] += parameter.numel()
            row["trainable"] += parameter.numel() if parameter.requires_grad else 0
        rows[target] = row
    return rows
