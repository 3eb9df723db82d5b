"""LoRA and full tuning: what trains, the prefix without autograd, merging, checkpoints."""

from __future__ import annotations

import pytest
import torch
from peft.tuners.lora import LoraLayer

from relay.catalog import TARGETS
from relay_engine.errors import ConfigError
from relay_engine.models import Pi05Policy, build_policy, flow_matching_loss, load_policy
from relay_engine.tuning import (
    apply_tuning,
    load_trainable_state_dict,
    merged_policy,
    parameter_counts,
    trainable_state_dict,
)
from tests.engine.models.samples import make_samples


def trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_default_lora_on_pi05_trains_16026656_weights() -> None:
    policy = apply_tuning(build_policy("pi05", device="meta"), "lora", lora_rank=32)
    assert trainable(policy) == 16_026_656
    assert not policy.prefix_trainable
    counts = parameter_counts(policy)
    assert counts["all"]["trainable"] == 16_026_656
    assert counts["heads"]["trainable"] == 2_165_792
    assert counts["action_expert.attn"]["adapter_params"] == 18 * 32 * (3072 + 1280 + 1280 + 3072)
    assert counts["vision"]["trainable"] == 0


def test_full_default_trains_everything_on_pi05() -> None:
    policy = apply_tuning(build_policy("pi05", device="meta"), "full")
    assert trainable(policy) == 3_353_433_872
    assert policy.prefix_trainable


@pytest.mark.parametrize("finetune", ["lora", "full"])
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_target_selects_its_modules(finetune: str, target: str) -> None:
    policy = apply_tuning(build_policy("pi05-tiny"), finetune, [target], lora_rank=4)
    counts = parameter_counts(policy)
    assert counts[target]["trainable"] > 0
    # Nothing outside the target trains (heads, under LoRA's `all`, are part of `all`).
    assert counts["all"]["trainable"] == counts[target]["trainable"]
    adapters = [name for name, m in policy.named_modules() if isinstance(m, LoraLayer)]
    if finetune == "full" or target == "heads":
        assert adapters == []
    else:
        assert adapters and all(
            isinstance(policy.get_submodule(n).get_base_layer(), torch.nn.Linear) for n in adapters
        )


def test_targets_and_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"unknown target 'lm'.*valid targets: all, vision"):
        apply_tuning(build_policy("pi05-tiny"), "lora", ["lm"])
    with pytest.raises(ConfigError, match="at least one"):
        apply_tuning(build_policy("pi05-tiny"), "lora", [])
    with pytest.raises(ConfigError, match="finetune must be one of lora, full"):
        apply_tuning(build_policy("pi05-tiny"), "qlora")
    for rank in (0, 257, 2.5):
        with pytest.raises(ConfigError, match="lora_rank must be an integer from 1 to 256"):
            apply_tuning(build_policy("pi05-tiny"), "lora", lora_rank=rank)
    with pytest.raises(ConfigError, match="lora_alpha"):
        apply_tuning(build_policy("pi05-tiny"), "lora", lora_alpha=0)
    tuned = apply_tuning(build_policy("pi05-tiny"), "lora")
    with pytest.raises(ConfigError, match="already tuned"):
        apply_tuning(tuned, "lora")


def test_lora_update_is_scaled_by_alpha_over_rank() -> None:
    policy = apply_tuning(
        build_policy("pi05-tiny"), "lora", ["action_expert.mlp"], lora_rank=4, lora_alpha=12
    )
    layer = policy.get_submodule("model.paligemma_with_expert.gemma_expert.model.layers.0.mlp.up_proj")
    torch.nn.init.normal_(layer.lora_B["default"].weight)
    x = torch.randn(3, 64)
    base = layer.get_base_layer()(x)
    delta = x @ layer.lora_A["default"].weight.T @ layer.lora_B["default"].weight.T
    torch.testing.assert_close(layer(x), base + 3.0 * delta, atol=1e-5, rtol=1e-5)
    assert policy.config.tuning == {
        "finetune": "lora",
        "targets": ["action_expert.mlp"],
        "lora_rank": 4,
        "lora_alpha": 12.0,
    }


def _train_step(policy: Pi05Policy) -> torch.Tensor:
    batch = policy.collate(make_samples(2))
    outputs = policy.flow_outputs(batch, generator=torch.Generator().manual_seed(0))
    loss, _ = flow_matching_loss(outputs, batch)
    loss.backward()
    return loss


def _prefix_outputs_requiring_grad(policy: Pi05Policy) -> list[bool]:
    """Train one step; for each output of the prefix (vision tower, projector, language layers and
    their key and value projections), whether it required grad."""
    seen: list[bool] = []
    model = policy.model
    prefix_modules = [model.vision_tower, model.projector, *model.language_model.layers]
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: seen.append(_requires_grad(out))) for m in prefix_modules
    ]
    for layer in model.language_model.layers:
        for proj in ("k_proj", "v_proj"):
            module = getattr(layer.self_attn, proj)
            hooks.append(module.register_forward_hook(lambda _m, _i, out: seen.append(out.requires_grad)))
    try:
        _train_step(policy)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _requires_grad(output: object) -> bool:
    # A decoder layer returns (hidden, keys, values); the other modules return a tensor.
    tensors = output if isinstance(output, tuple) else (output,)
    return all(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def test_frozen_prefix_runs_without_autograd() -> None:
    policy = apply_tuning(build_policy("pi05-tiny"), "lora")
    seen = _prefix_outputs_requiring_grad(policy)
    assert seen and not any(seen)
    assert all(p.grad is None for p in policy.model.paligemma_with_expert.paligemma.parameters())
    assert policy.model.action_in_proj.weight.grad is not None
    lora_grads = [p.grad for n, p in policy.named_parameters() if ".lora_" in n]
    assert lora_grads and all(g is not None for g in lora_grads)


def test_trained_prefix_gets_gradients() -> None:
    policy = apply_tuning(build_policy("pi05-tiny"), "lora", ["vision.attn", "heads"])
    assert policy.prefix_trainable
    seen = _prefix_outputs_requiring_grad(policy)
    assert all(seen)
    # lora_B starts at zero, so it is lora_B that gets a gradient first.
    vision_lora = [p for n, p in policy.named_parameters() if ".lora_B" in n]
    assert vision_lora and all(p.grad is not None and p.grad.abs().sum() > 0 for p in vision_lora)


def test_merged_policy_acts_like_the_adapted_one() -> None:
    policy = apply_tuning(build_policy("pi05-tiny"), "lora", ["all"], lora_rank=8, lora_alpha=16)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if ".lora_B" in name or name.startswith("model.action_out_proj"):
                parameter.normal_(std=0.05, generator=generator)
    batch = policy.collate(make_samples(3))
    noise = torch.randn(3, 10, 32, generator=generator)
    merged = merged_policy(policy)
    assert not any(isinstance(m, LoraLayer) for m in merged.modules())
    assert set(merged.state_dict()) == set(build_policy("pi05-tiny").state_dict())
    adapted, plain = policy.sample_actions(batch, noise=noise), merged.sample_actions(batch, noise=noise)
    torch.testing.assert_close(plain, adapted, atol=1e-5, rtol=0)
    with torch.no_grad():
        for module in policy.modules():
            if isinstance(module, LoraLayer):
                module.lora_B["default"].weight.zero_()
    without_adapters = policy.sample_actions(batch, noise=noise)
    assert (without_adapters - adapted).abs().max() > 1e-3, "the adapters must matter for this test"


def test_saving_a_tuned_policy_writes_merged_weights(tmp_path) -> None:
    policy = apply_tuning(build_policy("pi05-tiny"), "lora", lora_rank=4)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if ".lora_B" in name:
                parameter.normal_(std=0.1)
    policy.save_pretrained(tmp_path / "out")
    loaded = load_policy(tmp_path / "out")
    assert loaded.config.tuning == policy.config.tuning
    batch = policy.collate(make_samples(2))
    noise = torch.randn(2, 10, 32)
    torch.testing.assert_close(
        loaded.sample_actions(batch, noise=noise),
        policy.sample_actions(batch, noise=noise),
        atol=1e-5,
        rtol=0,
    )


def test_trainable_state_dict_round_trip() -> None:
    first = apply_tuning(build_policy("pi05-tiny"), "lora", lora_rank=4)
    _train_step(first)
    with torch.no_grad():
        for parameter in first.parameters():
            if parameter.requires_grad:
                parameter.add_(0.01)
    state = trainable_state_dict(first)
    assert sum(t.numel() for t in state.values()) == trainable(first)
    second = apply_tuning(build_policy("pi05-tiny"), "lora", lora_rank=4)
    load_trainable_state_dict(second, state)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    other_rank = apply_tuning(build_policy("pi05-tiny"), "lora", lora_rank=8)
    with pytest.raises(ConfigError, match="shape"):
        load_trainable_state_dict(other_rank, state)
    other_targets = apply_tuning(build_policy("pi05-tiny"), "lora", ["action_expert.attn"], lora_rank=4)
    with pytest.raises(ConfigError, match="tuned differently"):
        load_trainable_state_dict(other_targets, state)
