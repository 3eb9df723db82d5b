"""SmolVLA's sizes, the layout of its weights, what its two ways of tuning train, and the
activations a training step keeps, without torch.

The engine reads SmolVLA's sizes from lerobot's `config.json` and the backbone's (SmolVLM2's)
`config.json` (`relay_engine.families.smolvla.config`); the named sizes here are those files'
numbers: `smolvla-tiny`'s shipped folder, and `lerobot/smolvla_base` (lerobot 0.6.1's defaults over
`HuggingFaceTB/SmolVLM2-500M-Video-Instruct`). A test builds the engine's model from the same
numbers and checks every weight's name and shape, and what each way trains. With these the memory
plan (`relay.memory_plan`) sizes a SmolVLA job without building it.

What a training step keeps for backward (`kept_activations`), counted from the engine's forward
(`relay_engine.families.smolvla.model`), which runs in fp32 on every device (no autocast):

- The vision tower and the connector keep nothing: their weights are frozen and their input needs
  no gradient. They only cost their largest layer's working set while they run (below).
- The backbone's text layers do keep activations, though their weights are frozen: the state's
  projection trains (lerobot's train_state_proj, and LoRA adapts it), and the state is a token of
  the prefix, which passes every backbone layer as one tensor. So every layer keeps, over the
  whole prefix (every camera's image tokens, the prompt at tokenizer_max_length, the state), its
  RMS norms' inputs and the MLP's gate, SiLU and up outputs; a frozen linear layer keeps no input.
- Attention (Relay's `attend`, not a fused kernel) keeps the queries, and the keys and values
  repeated to every head, as the copies its matmuls make, the fp32 softmax over queries x keys,
  and the rotary tables. Every `self_attn_every_n_layers`-th layer attends over prefix and actions
  together; the others over the prefix, beside the expert's cross-attention over the prefix.
- The action expert (the suffix: chunk_size action tokens) keeps, when its weights train ("full"),
  every linear layer's input, the norms' normalized values and the MLP's intermediates; with LoRA
  only what the adapters on q and v need (their input and lora_A's output) beside what flows
  through (norm inputs, MLP intermediates).
- The state, action and time projections, the final norm, the loss's terms and the attention mask.

On top of what is kept, the largest layer's working set is counted once more, as pi05's plan does:
the larger of a decoder layer's kept activations and the vision tower's layer running over every
camera's patches (its input, normed input and MLP intermediates: no grad, nothing else is alive).

What is approximate: the prompt is taken at its longest (tokenizer_max_length; pad_language_to
"longest" makes it shorter for short tasks), the images at `PLANNED_CAMERAS` cameras (SmolVLA
reads every camera of the dataset: a dataset with more needs more), and the vision tower's and a
layer's transient tensors as one layer's worth. A test checks `kept_activations` against the bytes
a real smolvla-tiny step saves for backward.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from relay.catalog import FINETUNE_METHODS, LORA_RANK_MAX
from relay.pi05_layout import Tuned, VisionSize, Weight

# How many cameras a plan assumes a sample has: lerobot/smolvla_base was pretrained on three, and
# pi05's plan assumes three too (relay.catalog.MODEL_CAMERAS).
PLANNED_CAMERAS = 3
F32 = 4


@dataclass(frozen=True)
class TextSize:
    """SmolVLM2's text model, a Llama decoder (its config.json's text_config)."""

    width: int
    depth: int  # as the backbone is published; SmolVLA keeps its first num_vlm_layers
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int


@dataclass(frozen=True)
class SmolVLASizes:
    """A named SmolVLA's sizes: the backbone's (SmolVLM2's config.json: a SigLIP vision tower, a
    pixel-shuffle connector, a Llama text model) and lerobot's SmolVLAConfig fields that size the
    network and its inputs."""

    vision: VisionSize
    text: TextSize
    scale_factor: int  # the connector's pixel shuffle: scale_factor**2 patches make one token
    chunk_size: int
    num_vlm_layers: int
    resize_imgs_with_padding: tuple[int, int]  # (width, height) every camera is resized to
    tokenizer_max_length: int = 48
    num_expert_layers: int = -1
    self_attn_every_n_layers: int = 2
    expert_width_multiplier: float = 0.75
    max_state_dim: int = 32
    max_action_dim: int = 32

    @property
    def vlm_layers(self) -> int:
        """The backbone's text layers SmolVLA keeps (the first num_vlm_layers)."""
        depth = self.text.depth
        return min(self.num_vlm_layers, depth) if self.num_vlm_layers > 0 else depth

    @property
    def expert_layers(self) -> int:
        return self.num_expert_layers if self.num_expert_layers > 0 else self.vlm_layers

    @property
    def layers_per_expert_layer(self) -> int:
        return self.vlm_layers // self.expert_layers

    @property
    def expert_width(self) -> int:
        return int(self.text.width * self.expert_width_multiplier)

    @property
    def expert_mlp_dim(self) -> int:
        """lerobot's rule (Llama's): 2/3 of 4 x width, rounded up to a multiple of 256."""
        hidden = 4 * int(2 * self.expert_width / 3)
        return 256 * ((hidden + 255) // 256)

    def is_joint(self, layer: int) -> bool:
        """Whether backbone layer `layer` attends jointly over prefix and actions."""
        every = self.self_attn_every_n_layers
        return every > 0 and layer % every == 0

    def expert_layer_at(self, layer: int) -> int | None:
        """The expert's layer beside backbone layer `layer`; None where it has none."""
        if layer % self.layers_per_expert_layer:
            return None
        return layer // self.layers_per_expert_layer

    @property
    def image_tokens(self) -> int:
        """Prefix tokens of one camera's image: its patches at the resized size, pixel-shuffled."""
        width, height = self.resize_imgs_with_padding
        patches = (width // self.vision.patch_size) * (height // self.vision.patch_size)
        return patches // self.scale_factor**2

    def prefix_length(self, cameras: int = PLANNED_CAMERAS) -> int:
        """Tokens of one sample's prefix at most: every camera's image, the prompt, the state."""
        return cameras * self.image_tokens + self.tokenizer_max_length + 1


# `smolvla`: lerobot/smolvla_base, lerobot 0.6.1's SmolVLAConfig defaults (its config.json, and
# relay_engine.families.smolvla.files.lerobot_config) over SmolVLM2-500M-Video-Instruct's
# config.json. `smolvla-tiny`: the folder Relay ships (engine/relay_engine/families/smolvla/tiny).
NAMED_SIZES: dict[str, SmolVLASizes] = {
    "smolvla": SmolVLASizes(
        vision=VisionSize(width=768, depth=12, mlp_dim=3072, num_heads=12, patch_size=16, image_size=512),
        text=TextSize(
            width=960, depth=32, mlp_dim=2560, num_heads=15, num_kv_heads=5, head_dim=64, vocab_size=49_280
        ),
        scale_factor=4,
        chunk_size=50,
        num_vlm_layers=16,
        resize_imgs_with_padding=(512, 512),
    ),
    "smolvla-tiny": SmolVLASizes(
        vision=VisionSize(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8, image_size=32),
        text=TextSize(
            width=64, depth=4, mlp_dim=128, num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=320
        ),
        scale_factor=2,
        chunk_size=10,
        num_vlm_layers=4,
        resize_imgs_with_padding=(32, 32),
    ),
}


# -- the weights, by name -------------------------------------------------------------------------

_JOINT = "model.vlm_with_expert"
VLM = _JOINT + ".vlm"
_VISION = VLM + ".model.vision_model"
_TEXT = VLM + ".model.text_model"
EXPERT = _JOINT + ".lm_expert"
PROJECTIONS = (
    "model.state_proj",
    "model.action_in_proj",
    "model.action_out_proj",
    "model.action_time_mlp_in",
    "model.action_time_mlp_out",
)
# Where LoRA goes (lerobot 0.6.1's SmolVLAPolicy._get_default_peft_targets): the expert's query and
# value projections and the five projections; peft matches whole module paths against it. The
# engine adapts with this pattern (relay_engine.families.smolvla.tuning).
LORA_TARGETS = (
    r"model\.(vlm_with_expert\.lm_expert\..*\.(q|v)_proj"
    r"|state_proj|action_in_proj|action_out_proj|action_time_mlp_in|action_time_mlp_out)"
)


def _linear(path: str, inputs: int, outputs: int, *, bias: bool) -> list[Weight]:
    weights = [Weight(path + ".weight", (outputs, inputs), linear=True)]
    return weights + ([Weight(path + ".bias", (outputs,), linear=False)] if bias else [])


def _vector(path: str, size: int, *, bias: bool) -> list[Weight]:
    names = (".weight", ".bias") if bias else (".weight",)
    return [Weight(path + name, (size,), linear=False) for name in names]


def _llama_layer(path: str, width: int, mlp_dim: int, text: TextSize, kv_inputs: int) -> list[Weight]:
    """A Llama decoder layer of `width`; its key and value projections read `kv_inputs` features
    (the expert's cross-attending layers read the backbone's keys and values)."""
    heads, kv = text.num_heads * text.head_dim, text.num_kv_heads * text.head_dim
    return [
        *_linear(path + ".self_attn.q_proj", width, heads, bias=False),
        *_linear(path + ".self_attn.k_proj", kv_inputs, kv, bias=False),
        *_linear(path + ".self_attn.v_proj", kv_inputs, kv, bias=False),
        *_linear(path + ".self_attn.o_proj", heads, width, bias=False),
        *_linear(path + ".mlp.gate_proj", width, mlp_dim, bias=False),
        *_linear(path + ".mlp.up_proj", width, mlp_dim, bias=False),
        *_linear(path + ".mlp.down_proj", mlp_dim, width, bias=False),
        *_vector(path + ".input_layernorm", width, bias=False),
        *_vector(path + ".post_attention_layernorm", width, bias=False),
    ]


def weights(sizes: SmolVLASizes) -> list[Weight]:
    """Every weight of a SmolVLA policy of these sizes, in the engine's order (lerobot's names)."""
    vision, text = sizes.vision, sizes.text
    out = [
        Weight(
            _VISION + ".embeddings.patch_embedding.weight",
            (vision.width, 3, vision.patch_size, vision.patch_size),
            linear=False,
        ),
        Weight(_VISION + ".embeddings.patch_embedding.bias", (vision.width,), linear=False),
        Weight(
            _VISION + ".embeddings.position_embedding.weight",
            (vision.tokens_per_image, vision.width),
            linear=False,
        ),
    ]
    for index in range(vision.depth):
        layer = f"{_VISION}.encoder.layers.{index}"
        for projection in ("k_proj", "v_proj", "q_proj", "out_proj"):
            out += _linear(f"{layer}.self_attn.{projection}", vision.width, vision.width, bias=True)
        out += _vector(layer + ".layer_norm1", vision.width, bias=True)
        out += _linear(layer + ".mlp.fc1", vision.width, vision.mlp_dim, bias=True)
        out += _linear(layer + ".mlp.fc2", vision.mlp_dim, vision.width, bias=True)
        out += _vector(layer + ".layer_norm2", vision.width, bias=True)
    out += _vector(_VISION + ".post_layernorm", vision.width, bias=True)
    shuffled = vision.width * sizes.scale_factor**2
    out += _linear(VLM + ".model.connector.modality_projection.proj", shuffled, text.width, bias=False)
    out.append(Weight(_TEXT + ".embed_tokens.weight", (text.vocab_size, text.width), linear=False))
    backbone_kv = text.num_kv_heads * text.head_dim
    for index in range(sizes.vlm_layers):
        out += _llama_layer(f"{_TEXT}.layers.{index}", text.width, text.mlp_dim, text, text.width)
    out += _vector(_TEXT + ".norm", text.width, bias=False)
    out += _linear(VLM + ".lm_head", text.width, text.vocab_size, bias=False)
    width = sizes.expert_width
    for index in range(sizes.expert_layers):
        # Which expert layers read the backbone's keys and values goes by the expert's own index,
        # as the engine (and lerobot) build them.
        kv_inputs = width if sizes.is_joint(index) else backbone_kv
        out += _llama_layer(f"{EXPERT}.layers.{index}", width, sizes.expert_mlp_dim, text, kv_inputs)
    out += _vector(EXPERT + ".norm", width, bias=False)
    out += _linear("model.state_proj", sizes.max_state_dim, text.width, bias=True)
    out += _linear("model.action_in_proj", sizes.max_action_dim, width, bias=True)
    out += _linear("model.action_out_proj", width, sizes.max_action_dim, bias=True)
    out += _linear("model.action_time_mlp_in", 2 * width, width, bias=True)
    out += _linear("model.action_time_mlp_out", width, width, bias=True)
    return out


# -- what each way trains -------------------------------------------------------------------------


def tune(sizes: SmolVLASizes, finetune: str, targets: Sequence[str] | None, lora_rank: int) -> Tuned:
    """What `finetune` trains, as the engine does: "full" is lerobot's default (train_expert_only,
    train_state_proj: the action expert and the five projections; SmolVLAPolicy.trainable), "lora"
    adapts LORA_TARGETS (relay_engine.families.smolvla.tuning.apply_lora). SmolVLA chooses its own
    targets: `targets` may only be left out or be ["all"] (what SFTConfig fills in)."""
    if finetune not in FINETUNE_METHODS:
        raise ValueError(f"finetune must be one of {', '.join(FINETUNE_METHODS)}, got {finetune!r}")
    if targets is not None and list(targets) != ["all"]:
        raise ValueError("SmolVLA trains what lerobot trains by default: its targets cannot be chosen")
    base = weights(sizes)
    if finetune == "lora":
        if isinstance(lora_rank, bool) or not 1 <= lora_rank <= LORA_RANK_MAX:
            raise ValueError(f"lora_rank must be an integer from 1 to {LORA_RANK_MAX}, got {lora_rank!r}")
        pattern = re.compile(LORA_TARGETS)
        adapted = [w for w in base if w.linear and pattern.fullmatch(w.module)]
        return Tuned(base, frozenset(), adapted, lora_rank)
    trained = frozenset(w.name for w in base if w.name.startswith(EXPERT + ".") or w.module in PROJECTIONS)
    return Tuned(base, trained, [], lora_rank)


# -- activations ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeptActivations:
    total: int  # what autograd keeps for backward over one step
    largest_layer: int  # the largest layer's working set, alive while it runs


@dataclass(frozen=True)
class _Step:
    """One training step: its samples, each one's prefix and action tokens, and what trains."""

    sizes: SmolVLASizes
    batch: int
    prefix_length: int  # one sample's prefix tokens
    full: bool  # the expert's own weights train (else LoRA adapters do)
    rank: int  # LoRA's rank; 0 for "full"

    @property
    def prefix(self) -> int:
        """The prefix tokens of all samples."""
        return self.batch * self.prefix_length

    @property
    def suffix(self) -> int:
        """The action tokens of all samples."""
        return self.batch * self.sizes.chunk_size


def _rms_norm(tokens: int, width: int, *, trains: bool) -> int:
    """A Llama RMS norm keeps its input and 1/rms per token; with its weight trained, also the
    normalized input it multiplies by."""
    return (2 if trains else 1) * tokens * width * F32 + tokens * F32


def _mlp(tokens: int, width: int, mlp_dim: int, *, trains: bool) -> int:
    """Gate's output (SiLU's input), SiLU's and up's outputs; trained, also the linear layers'
    inputs: the normed input (of gate and up) and down's input."""
    kept = 3 * tokens * mlp_dim * F32
    return kept + (tokens * width + tokens * mlp_dim) * F32 if trains else kept


def _attention(step: _Step, queries: int, keys: int) -> int:
    """Relay's attend over `queries` x `keys` tokens of each sample: the queries, and the keys and
    values repeated to every head (the copies its matmuls keep), and the fp32 softmax."""
    text = step.sizes.text
    return step.batch * text.num_heads * ((queries + 2 * keys) * text.head_dim + queries * keys) * F32


def _rope(tokens: int, text: TextSize) -> int:
    """The cos and sin tables (tokens x head_dim, fp32) a rotation keeps."""
    return 2 * tokens * text.head_dim * F32


def _backbone_layer(step: _Step, *, joint: bool) -> int:
    """A backbone layer over the prefix (frozen: its linear layers keep no input), with its
    attention: over prefix and actions together when joint (queries and keys both rotated), else
    over the prefix alone."""
    text = step.sizes.text
    kept = 2 * _rms_norm(step.prefix, text.width, trains=False)
    kept += _mlp(step.prefix, text.width, text.mlp_dim, trains=False)
    if joint:
        length = step.prefix_length + step.sizes.chunk_size
        return kept + 2 * _rope(step.batch * length, text) + _attention(step, length, length)
    return kept + 2 * _rope(step.prefix, text) + _attention(step, step.prefix_length, step.prefix_length)


def _expert_layer(step: _Step, *, joint: bool) -> int:
    """An expert layer over the action tokens, less its attention (the backbone layer's count
    holds a joint layer's, `_cross` a cross-attending one's)."""
    tokens, width, text = step.suffix, step.sizes.expert_width, step.sizes.text
    # The input norm's output is kept either way: the input of q, k and v when they train, of the
    # adapters on q and v with LoRA.
    kept = _rms_norm(tokens, width, trains=step.full) + tokens * width * F32
    kept += _rms_norm(tokens, width, trains=step.full)
    kept += _mlp(tokens, width, step.sizes.expert_mlp_dim, trains=step.full)
    if step.full:
        return kept + tokens * text.num_heads * text.head_dim * F32  # o_proj's input
    return kept + (2 if joint else 1) * tokens * step.rank * F32  # lora_A's outputs of q (and v)


def _cross(step: _Step) -> int:
    """The expert's cross-attention over the prefix: its queries' rotation, the attention, and
    what its key and value projections keep of the backbone's keys and values (their inputs when
    they train; with LoRA, v's adapter's input and lora_A's output)."""
    text = step.sizes.text
    prefix_kv = step.prefix * text.num_kv_heads * text.head_dim * F32
    kept = _rope(step.suffix, text) + _attention(step, step.sizes.chunk_size, step.prefix_length)
    if step.full:
        return kept + 2 * prefix_kv
    return kept + prefix_kv + step.prefix * step.rank * F32


def _vision_working_set(sizes: SmolVLASizes, batch: int, cameras: int) -> int:
    """A vision layer running over every camera's patches without autograd: its input, its normed
    input and either the attention's queries, keys, values and output or the MLP's two
    intermediates (whichever is larger), all alive at once."""
    vision = sizes.vision
    width, height = sizes.resize_imgs_with_padding
    tokens = batch * cameras * (width // vision.patch_size) * (height // vision.patch_size)
    return tokens * (2 * vision.width + max(4 * vision.width, 2 * vision.mlp_dim)) * F32


def kept_activations(
    sizes: SmolVLASizes, tuned: Tuned, batch: int, *, cameras: int = PLANNED_CAMERAS
) -> KeptActivations:
    """What autograd keeps over one training step of `batch` samples (see the module's text)."""
    full = bool(tuned.trained)
    step = _Step(sizes, batch, sizes.prefix_length(cameras), full, 0 if full else tuned.lora_rank)
    width, suffix, rank = sizes.expert_width, step.suffix, step.rank
    kept = largest_layer = 0
    for index in range(sizes.vlm_layers):
        joint = sizes.is_joint(index)
        layer = _backbone_layer(step, joint=joint)
        if sizes.expert_layer_at(index) is not None:
            layer += _expert_layer(step, joint=joint) + (0 if joint else _cross(step))
        largest_layer = max(largest_layer, layer)
        kept += layer
    # The state's projection (its input; LoRA: and lora_A's output), the attention mask (bool).
    kept += batch * sizes.max_state_dim * F32 + batch * rank * F32
    kept += batch * (step.prefix_length + sizes.chunk_size) ** 2
    # The suffix: noisy actions into action_in_proj, [actions ; time] into the time MLP, its SiLU's
    # input and output; with LoRA, lora_A's output of each of the three.
    kept += suffix * (sizes.max_action_dim + 4 * width) * F32 + 3 * suffix * rank * F32
    # The final norm, its output (action_out_proj's input; LoRA: and lora_A's output), the loss's
    # two terms (the target velocity, the prediction) and the mask of steps inside the episode.
    kept += _rms_norm(suffix, width, trains=full) + suffix * width * F32 + suffix * rank * F32
    kept += 2 * suffix * sizes.max_action_dim * F32 + suffix
    return KeptActivations(kept, max(largest_layer, _vision_working_set(sizes, batch, cameras)))
