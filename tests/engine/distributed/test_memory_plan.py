"""The per-GPU memory plan (`relay.memory_plan`, torch-free) against the model it plans for.

The SDK's layout of pi0.5's weights must be the engine's, weight for weight, and the activations
it counts must be what a real training step keeps for backward (counted here by hooking every
tensor autograd saves, on the CPU). `relay models info --memory` prints the plan.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from relay.cli import app
from relay.memory_plan import kept_activations
from relay.pi05_layout import NAMED_SIZES, tune, weights
from relay_engine.families.pi05.memory import plan_memory
from relay_engine.models import Pi05Batch, Pi05Policy, build_policy, flow_matching_loss
from relay_engine.models.config import GemmaSize, Pi05Config, VisionSize, named_config
from relay_engine.tuning import apply_tuning

# The real architecture at a size a CPU test can run a step of.
SMALL_GEMMA = GemmaSize(width=128, depth=3, mlp_dim=512, num_heads=4, num_kv_heads=1, head_dim=32)
SMALL = named_config("pi05-tiny").replace(
    model="pi05-small",
    vision=VisionSize(width=96, depth=2, mlp_dim=384, num_heads=3, patch_size=14, image_size=56),
    language=SMALL_GEMMA,
    expert=SMALL_GEMMA,
    max_token_len=24,
)
TUNINGS = [
    ("lora", None),
    ("full", None),
    ("lora", ["all"]),
    ("full", ["language", "heads"]),
    ("lora", ["vision.attn", "projector"]),
]

PARTS = ("weights", "gradients", "optimizer", "activations", "overhead")


def plan(
    finetune: str, gpus: int, batch_size: int = 8, strategy: str = "auto", model: str = "pi05-tiny"
) -> dict[str, int]:
    policy = apply_tuning(build_policy(model, device="meta"), finetune)
    return plan_memory(policy, batch_size=batch_size, gpus=gpus, strategy=strategy).to_dict()


def test_the_cli_prints_every_part_and_the_smallest_gpu() -> None:
    done = CliRunner().invoke(
        app,
        [
            "models",
            "info",
            "pi05-tiny",
            "--finetune",
            "full",
            "--batch-size",
            "8",
            "--gpus",
            "2",
            "--memory",
            "--json",
        ],
    )
    assert done.exit_code == 0, done.output
    printed = json.loads(done.output)
    assert printed["strategy"] == "fsdp" and printed["per_gpu_batch"] == 4
    assert printed["total"] == sum(printed[part] for part in PARTS)
    assert all(printed[part] > 0 for part in PARTS)
    assert printed["smallest_gpu"].startswith("24 GB")


def test_the_cli_prints_smolvla_s_plan_in_one_process_in_fp32() -> None:
    """SmolVLA's plan is relay.smolvla_layout's arithmetic (tests/engine/families/smolvla/
    test_memory_plan.py checks it against the model); --keys and --targets stay pi05's."""
    runner = CliRunner()
    done = runner.invoke(app, ["models", "info", "smolvla-tiny", "--memory", "--batch-size", "16", "--json"])
    assert done.exit_code == 0, done.output
    printed = json.loads(done.output)
    assert (printed["finetune"], printed["strategy"], printed["gpus"]) == ("full", "none", 1)
    assert printed["compute_dtype"] == "fp32" and printed["per_gpu_batch"] == 16
    assert printed["total"] == sum(printed[part] for part in PARTS)
    assert all(printed[part] > 0 for part in PARTS)
    shown = runner.invoke(app, ["models", "info", "smolvla-tiny", "--memory", "--finetune", "lora"])
    assert shown.exit_code == 0, shown.output
    assert (
        "smolvla-tiny lora: batch 32 on 1 GPU(s), 32 samples each, one process, fp32 compute" in shown.output
    )
    assert "fits: 24 GB" in shown.output
    more = runner.invoke(app, ["models", "info", "smolvla", "--memory", "--gpus", "2"])
    assert more.exit_code == 1 and "smolvla trains in one process on one GPU" in more.output
    rtj = runner.invoke(app, ["models", "info", "rt-j-tiny", "--memory"])
    assert rtj.exit_code == 1 and "--memory is for pi05, pi05-tiny, smolvla, smolvla-tiny" in rtj.output


def test_sharding_divides_the_full_model_and_ddp_does_not() -> None:
    one, four = plan("full", 1), plan("full", 4)
    # FSDP: each GPU keeps a quarter of the moments (AdamW's two fp32 copies of every weight).
    assert four["optimizer"] == pytest.approx(one["optimizer"] / 4, rel=0.01)
    assert four["activations"] < one["activations"]  # 2 samples a GPU instead of 8
    lora_one, lora_four = plan("lora", 1), plan("lora", 4)
    assert lora_four["weights"] == lora_one["weights"] and lora_four["optimizer"] == lora_one["optimizer"]


def test_bad_flags_name_the_flag_and_the_rule() -> None:
    done = CliRunner().invoke(
        app, ["models", "info", "pi05-tiny", "--memory", "--batch-size", "4", "--gpus", "8"]
    )
    assert done.exit_code == 1
    assert "bad --gpus: 8 (must be at most --batch-size, 4" in done.output


@pytest.mark.parametrize("name", sorted(NAMED_SIZES))
def test_the_sdk_layout_is_the_engines_model_weight_for_weight(name: str) -> None:
    policy = build_policy(name, device="meta")
    assert [(w.name, w.shape) for w in weights(NAMED_SIZES[name])] == [
        (n, tuple(p.shape)) for n, p in policy.named_parameters()
    ]
    for finetune, targets in TUNINGS:
        tuned = apply_tuning(build_policy(name, device="meta"), finetune, targets, lora_rank=16)
        counted = tune(NAMED_SIZES[name], finetune, targets, 16)
        assert counted.total_params == sum(p.numel() for p in tuned.parameters())
        assert counted.trainable_params == sum(p.numel() for p in tuned.parameters() if p.requires_grad)


def saved_for_backward(policy: Pi05Policy, batch: Pi05Batch) -> int:
    """Bytes of the distinct storages a training forward pass saves for backward, less the
    weights' own (a linear layer saves a transposed view of its weight)."""
    weight_storages = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weight_storages:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        outputs = policy.flow_outputs(
            batch, noise=torch.zeros_like(batch.actions), time=torch.full((2,), 0.5)
        )
        loss, _ = flow_matching_loss(outputs, batch)
    assert loss.requires_grad
    return sum(saved.values())


def full_batch(config: Pi05Config, size: int = 2) -> Pi05Batch:
    """Every camera and a prompt of max_token_len tokens: the longest prefix, as the plan assumes."""
    generator = torch.Generator().manual_seed(0)
    image = config.vision.image_size
    shape = (size, config.action_horizon, config.action_dim)
    return Pi05Batch(
        images=torch.rand(size, 3, 3, image, image, generator=generator) * 2 - 1,
        image_mask=torch.ones(size, 3, dtype=torch.bool),
        tokens=torch.randint(1, config.vocab_size, (size, config.max_token_len), generator=generator),
        token_mask=torch.ones(size, config.max_token_len, dtype=torch.bool),
        actions=torch.randn(shape, generator=generator),
        action_mask=torch.ones(shape, dtype=torch.bool),
        weights=torch.ones(size),
        cameras_in_use=(True, True, True),
    )


@pytest.mark.parametrize(("finetune", "targets"), TUNINGS)
def test_the_activations_counted_are_what_a_real_step_keeps(finetune: str, targets: list[str] | None) -> None:
    torch.manual_seed(0)
    policy = apply_tuning(build_policy(SMALL), finetune, targets)
    measured = saved_for_backward(policy, full_batch(SMALL))
    counted = kept_activations(SMALL, tune(SMALL, finetune, targets, 32), 2, compute=4, cuda=False).total
    if targets is None:  # the default targets of each: counted tensor by tensor
        assert counted == pytest.approx(measured, rel=0.03)
    else:
        # Other targets leave some linear layers frozen inside a part gradients flow through;
        # those keep no input, which the plan does not tell apart: it may count more, never less.
        assert measured * 0.99 <= counted <= measured * 1.6


def test_the_real_pi05_plan_in_numbers() -> None:
    """Issue 10's arithmetic: about 3.35 B weights; fp32 weights, gradients and AdamW moments
    of the full model are 16 bytes a weight, over 50 GB before activations on one GPU."""
    one = plan("full", 1, batch_size=32, model="pi05")
    every = tune(NAMED_SIZES["pi05"], "full", None, 32).total_params
    assert 3.3e9 < every < 3.4e9
    assert one["optimizer"] == every * 8
    eight = plan("full", 8, batch_size=32, model="pi05")
    assert eight["total"] < one["total"] / 4  # sharded, and 4 samples a GPU instead of 32


def test_the_plan_is_printed_for_the_cpu_too() -> None:
    """`--device cpu`: fp32 weights and activations in one process's memory, no CUDA overhead."""
    runner = CliRunner()
    args = ["models", "info", "pi05", "--memory", "--batch-size", "1"]
    on_gpu = json.loads(runner.invoke(app, [*args, "--json"]).output)
    done = runner.invoke(app, [*args, "--device", "cpu", "--json"])
    assert done.exit_code == 0, done.output
    on_cpu = json.loads(done.output)
    assert on_cpu["device"] == "cpu" and on_cpu["overhead"] == 0
    assert on_cpu["weights"] > on_gpu["weights"]  # the frozen weights in fp32, not bf16
    shown = runner.invoke(app, [*args, "--device", "cpu"])
    assert "on the CPU" in shown.output and "fp32 compute" in shown.output and "GPU" not in shown.output
    bad = runner.invoke(app, [*args, "--device", "tpu"])
    assert bad.exit_code == 1 and "bad --device: 'tpu' (must be one of cuda, cpu)" in bad.output


@pytest.mark.parametrize(("model", "suggested"), [("pi05", "pi05-tiny"), ("smolvla", "smolvla-tiny")])
def test_a_refusal_on_a_cpu_suggests_the_models_own_small_kin(model: str, suggested: str) -> None:
    # A SmolVLA user refused on a CPU was told to use pi05-tiny: another family's model.
    from relay.memory_plan import cpu_refusal

    message = cpu_refusal(model, None, "every live worker trains on its CPU")
    assert f"use {suggested} here, or a GPU" in message
    assert ("pi05-tiny" in message) == (suggested == "pi05-tiny")
