"""What the service offers: base models, cameras and the vocabulary of training targets.

Pure data, shared by the SDK's validation (SFTConfig, training sessions) and by the engine,
which maps each target name to modules of the model (``relay_engine.tuning.targets``). The rules of
each model family (which models, their own defaults, task, finetune and GPU limits) are
``relay.families``'.
"""

from __future__ import annotations

from typing import Literal, get_args

# `pi05` is the real model (about 3.35B parameters, a GPU); `pi05-tiny` runs the same code at
# tiny sizes, for CPUs, the demo and the tests.
MODELS: tuple[str, ...] = ("pi05", "pi05-tiny")
# Models sized for GPUs: a worker without GPUs takes a job of one only where the service allows it
# (RELAY_ALLOW_CPU_FULL_SIZE); the API refuses it otherwise (relay_api.fine_tunes.check_memory).
GPU_SIZED_MODELS: tuple[str, ...] = ("pi05",)

# RT-J, the relational transformer, for tasks on relational databases: `rt-j` has the published
# dimensions (85,562,530 weights in Stanford's layout); `rt-j-tiny` is the same network, small.
RELATIONAL_MODELS: tuple[str, ...] = ("rt-j", "rt-j-tiny")
# SmolVLA, lerobot's small robot policy: `smolvla` is lerobot/smolvla_base (about 450M weights);
# `smolvla-tiny` runs the same code at tiny sizes, for CPUs and the tests.
SMOLVLA_MODELS: tuple[str, ...] = ("smolvla", "smolvla-tiny")
# Which models exist (what a recipe or a session may name) is the registry's alone:
# relay.families.model_names(), the built-in families above and any a package adds.
# The problem types an RT-J session trains: its task loss is BCE (binary) or Huber (regression).
RelationalSessionProblem = Literal["binary", "regression"]
RELATIONAL_SESSION_PROBLEMS: tuple[str, ...] = get_args(RelationalSessionProblem)


# pi0.5 always has these three camera slots; a slot with no image is masked.
MODEL_CAMERAS: tuple[str, ...] = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")

# States and actions are padded with zeros to this width.
ACTION_DIM = 32
STATE_DIM = 32
# Actions per chunk that pi0.5 predicts and trains on, unless a session or recipe says otherwise.
ACTION_HORIZON = 10

# Where training goes. With finetune="lora", a target's attention, MLP (and, for `.norm`, the
# adaptive-norm) linear layers get LoRA adapters, except `heads`, which are trained in full because
# they are tiny. With finetune="full", every weight of the target is trained.
TARGETS: dict[str, str] = {
    "all": "the whole model: LoRA on every linear layer (heads in full), or every weight in full",
    "vision": "the SigLIP vision tower",
    "vision.attn": "the vision tower's attention projections",
    "vision.mlp": "the vision tower's MLPs",
    "projector": "the projection from image features to the language model",
    "language": "the PaliGemma (Gemma 2B) language model",
    "language.attn": "the language model's attention projections (q, k, v, o)",
    "language.mlp": "the language model's MLPs (gate, up, down)",
    "action_expert": "the action expert (Gemma 300M)",
    "action_expert.attn": "the action expert's attention projections (q, k, v, o)",
    "action_expert.mlp": "the action expert's MLPs (gate, up, down)",
    "action_expert.norm": "the action expert's adaptive RMSNorm layers (the time conditioning)",
    "heads": "action_in_proj, action_out_proj, time_mlp_in and time_mlp_out: trained in full, even "
    "with LoRA, when targeted (they are in the default targets and in `all`; explicit targets "
    "without `heads` leave them frozen)",
}

DEFAULT_LORA_TARGETS: tuple[str, ...] = ("action_expert.attn", "action_expert.mlp", "heads")
DEFAULT_FULL_TARGETS: tuple[str, ...] = ("all",)

FINETUNE_METHODS: tuple[str, ...] = ("lora", "full")
# How the processes of one job share the model: auto picks fsdp for full and ddp for lora.
STRATEGIES: tuple[str, ...] = ("auto", "ddp", "fsdp")


def auto_strategy(finetune: str) -> str:
    """What `auto` means: FSDP when the full model trains, DDP when only adapters (or a small part) do."""
    return "fsdp" if finetune == "full" else "ddp"


# The LoRA adapters' rank: 1 to LORA_RANK_MAX; LORA_RANK_DEFAULT where a recipe or session names none.
LORA_RANK_DEFAULT = 32
LORA_RANK_MAX = 256


def default_targets(finetune: str) -> tuple[str, ...]:
    """The targets used when a recipe or session names none."""
    return DEFAULT_LORA_TARGETS if finetune == "lora" else DEFAULT_FULL_TARGETS


def check_targets(targets: list[str] | tuple[str, ...]) -> None:
    """Raise ValueError naming the first unknown target and listing the valid ones."""
    if not targets:
        raise ValueError("targets must name at least one place; valid: " + ", ".join(TARGETS))
    for target in targets:
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}; valid targets: " + ", ".join(TARGETS))


def check_cameras(cameras: dict[str, str]) -> None:
    """Raise ValueError for a camera map whose keys are not model cameras."""
    for camera, feature in cameras.items():
        if camera not in MODEL_CAMERAS:
            raise ValueError(
                f"unknown model camera {camera!r}; valid model cameras: " + ", ".join(MODEL_CAMERAS)
            )
        if not isinstance(feature, str) or not feature:
            raise ValueError(f"camera {camera!r} must map to a dataset feature name")
