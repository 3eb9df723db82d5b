"""SmolVLA's layout and memory plan (`relay.smolvla_layout`, torch-free) against the engine's model.

The SDK's named sizes must build the engine's SmolVLA weight for weight (smolvla-tiny from its
shipped files; the published size from lerobot's defaults, as the engine writes them, over
SmolVLM2-500M's sizes, on the meta device: its backbone's config.json is not here), "full" and
"lora" must train what the engine's `trainable()` does, and the activations counted must be what a
real smolvla-tiny training step keeps for backward (counted by hooking every tensor autograd saves,
on the CPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import SmolVLMConfig

from relay.memory_plan import plan_named
from relay.smolvla_layout import NAMED_SIZES, kept_activations, tune, weights
from relay_engine.families.smolvla.config import DEFAULT_BACKBONE, SmolVLAConfig, read_lerobot_config
from relay_engine.families.smolvla.files import TINY_BASE_DIR, lerobot_config
from relay_engine.families.smolvla.learner import SmolVLABatch, SmolVLALearner
from relay_engine.families.smolvla.policy import (
    ACTION,
    ACTION_IS_PAD,
    STATE,
    TOKEN_MASK,
    TOKENS,
    SmolVLAPolicy,
)
from relay_engine.families.smolvla.tuning import apply_lora

# HuggingFaceTB/SmolVLM2-500M-Video-Instruct's config.json, the sizes in it (lerobot/smolvla_base's
# backbone), written out here independently of the SDK's numbers.
PUBLISHED_BACKBONE = {
    "text_config": {
        "model_type": "llama",
        "hidden_size": 960,
        "intermediate_size": 2560,
        "num_hidden_layers": 32,
        "num_attention_heads": 15,
        "num_key_value_heads": 5,
        "head_dim": 64,
        "vocab_size": 49_280,
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "patch_size": 16,
        "image_size": 512,
    },
    "scale_factor": 4,
    "tie_word_embeddings": False,
}
# Three cameras, as the plan assumes; the robot's state and actions narrower than SmolVLA's 32.
CAMERAS = ("observation.images.top", "observation.images.wrist", "observation.images.side")
ROBOT_DIM = 6
# The SmolVLAConfig fields that size the network's inputs rather than its weights.
INPUT_FIELDS = (
    "chunk_size",
    "resize_imgs_with_padding",
    "tokenizer_max_length",
    "num_vlm_layers",
    "num_expert_layers",
    "self_attn_every_n_layers",
    "expert_width_multiplier",
    "max_state_dim",
    "max_action_dim",
)


def engine_config(name: str) -> SmolVLAConfig:
    """smolvla-tiny's shipped config.json; the published base's, as the engine writes lerobot's."""
    if name == "smolvla-tiny":
        return read_lerobot_config(TINY_BASE_DIR)
    cameras = {camera: (3, 480, 640) for camera in CAMERAS}
    return SmolVLAConfig.from_lerobot(lerobot_config(cameras, ROBOT_DIM, ROBOT_DIM, DEFAULT_BACKBONE))


def backbone_dir(name: str, tmp_path: Path) -> Path:
    if name == "smolvla-tiny":
        return TINY_BASE_DIR / "vlm"
    SmolVLMConfig(**PUBLISHED_BACKBONE).save_pretrained(tmp_path)
    return tmp_path


def meta_policy(name: str, tmp_path: Path, finetune: str, rank: int = 16) -> SmolVLAPolicy:
    """The engine's model on the meta device (shapes only: the published size costs nothing)."""
    with torch.device("meta"):
        policy = SmolVLAPolicy(engine_config(name), backbone_dir(name, tmp_path), CAMERAS, ROBOT_DIM)
        if finetune == "lora":
            apply_lora(policy, rank, float(rank), seed=0)
    return policy


@pytest.mark.parametrize("name", sorted(NAMED_SIZES))
def test_the_sdk_layout_is_the_engines_model_weight_for_weight(name: str, tmp_path: Path) -> None:
    sizes = NAMED_SIZES[name]
    policy = meta_policy(name, tmp_path, "full")
    assert [(w.name, w.shape) for w in weights(sizes)] == [
        (n, tuple(p.shape)) for n, p in policy.named_parameters()
    ]
    config = engine_config(name)
    assert {f: getattr(sizes, f) for f in INPUT_FIELDS} == {f: getattr(config, f) for f in INPUT_FIELDS}
    for finetune in ("full", "lora"):
        tuned = meta_policy(name, tmp_path, finetune, rank=16)
        counted = tune(sizes, finetune, None, 16)
        assert counted.total_params == sum(p.numel() for p in tuned.parameters())
        assert counted.trainable_params == sum(p.numel() for p in tuned.trainable())
    if name == "smolvla":  # "SmolVLA 450M", as lerobot publishes it
        assert tune(sizes, "full", None, 16).total_params == 450_046_176


def saved_for_backward(learner: SmolVLALearner, batch: SmolVLABatch) -> int:
    """Bytes of the distinct storages a training step's forward saves for backward, less the
    weights' own (a linear layer saves its weight, or a view of it)."""
    weight_storages = {p.untyped_storage().data_ptr() for p in learner.model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weight_storages:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        learner.forward_backward(batch)
    return sum(saved.values())


def full_batch(config: SmolVLAConfig, size: int = 2) -> SmolVLABatch:
    """Every camera and a prompt of tokenizer_max_length tokens: the longest prefix, as the plan
    assumes."""
    generator = torch.Generator().manual_seed(0)
    width, height = config.resize_imgs_with_padding
    tensors = {camera: torch.rand(size, 3, height, width, generator=generator) for camera in CAMERAS}
    tensors[STATE] = torch.randn(size, ROBOT_DIM, generator=generator)
    tensors[ACTION] = torch.randn(size, config.chunk_size, ROBOT_DIM, generator=generator)
    tensors[ACTION_IS_PAD] = torch.zeros(size, config.chunk_size, dtype=torch.bool)
    tensors[TOKENS] = torch.randint(0, 300, (size, config.tokenizer_max_length), generator=generator)
    tensors[TOKEN_MASK] = torch.ones(size, config.tokenizer_max_length, dtype=torch.bool)
    return SmolVLABatch(tensors, torch.ones(size))


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_the_activations_counted_are_what_a_real_step_keeps(finetune: str) -> None:
    torch.manual_seed(0)
    config = engine_config("smolvla-tiny")
    policy = SmolVLAPolicy(config, TINY_BASE_DIR / "vlm", CAMERAS, ROBOT_DIM)
    if finetune == "lora":
        apply_lora(policy, 8, 8.0, seed=0)
    measured = saved_for_backward(SmolVLALearner(policy), full_batch(config))
    sizes = NAMED_SIZES["smolvla-tiny"]
    counted = kept_activations(sizes, tune(sizes, finetune, None, 8), 2).total
    # Counted tensor by tensor: within 1% (a few bytes apart when this was written).
    assert counted == pytest.approx(measured, rel=0.01)


def test_the_plan_is_one_process_in_fp32() -> None:
    full = plan_named("smolvla", finetune="full", batch_size=64, gpus=1)
    lora = plan_named("smolvla", finetune="lora", lora_rank=32, batch_size=64, gpus=1)
    assert full is not None and lora is not None
    every = tune(NAMED_SIZES["smolvla"], "full", None, 32)
    assert (full.strategy, full.per_gpu_batch, full.compute_dtype) == ("none", 64, "fp32")
    assert full.weights == every.total_params * 4  # the frozen backbone too: nothing is cast
    assert full.optimizer == every.trainable_params * 8 == 2 * full.gradients
    assert lora.gradients < full.gradients / 50 and lora.activations < full.activations
    # On a CPU: the same bytes, less the CUDA overhead.
    on_cpu = plan_named("smolvla", finetune="full", batch_size=64, gpus=1, device="cpu")
    assert on_cpu is not None and on_cpu.total == full.total - full.overhead
    with pytest.raises(ValueError, match="smolvla trains in one process on one GPU"):
        plan_named("smolvla", finetune="full", batch_size=64, gpus=2)
    with pytest.raises(ValueError, match="its targets cannot be chosen"):
        plan_named("smolvla-tiny", finetune="lora", targets=["vision"], batch_size=4, gpus=1)
