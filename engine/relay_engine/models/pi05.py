"""pi0.5 in PyTorch: a PaliGemma prefix, a Gemma action expert, flow matching.

Module and parameter names are lerobot's PI05Policy's, so checkpoints move both ways (see
`weights.py`):

    model.paligemma_with_expert.paligemma.model.{vision_tower.vision_model, multi_modal_projector,
                                                 language_model}
    model.paligemma_with_expert.gemma_expert.model.{layers, norm}
    model.{action_in_proj, action_out_proj, time_mlp_in, time_mlp_out}

How the joint attention runs. In every layer both stacks project their own tokens and one
attention runs over all of them; the prefix (images, then the prompt) attends bidirectionally to
its valid tokens and never to the actions, and the actions attend to the valid prefix and to each
other. Because the prefix never sees the actions, its hidden states at every layer do not depend
on them, so the joint pass splits exactly into

    1. a prefix pass through the language model that returns each layer's keys and values, and
    2. a suffix pass through the action expert whose queries attend to [prefix K/V ; own K/V].

Training and sampling share these two functions: the sampler runs the prefix once and the suffix
at each of its Euler steps, and when no prefix weight is trained the prefix runs without
autograd, so it keeps no activations. The language model's last layer only has to produce its
keys and values; its queries, output projection and MLP (and the final norm) feed nothing and
are skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import SiglipVisionConfig, SiglipVisionModel
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

from relay_engine.models.config import GemmaSize, Pi05Config, VisionSize
from relay_engine.models.layers import (
    RMS_EPS,
    AdaptiveRMSNorm,
    GemmaDecoderLayer,
    posemb_sincos,
    rope_tables,
)
from relay_engine.models.lerobot_files import RobotFeatures
from relay_engine.models.processor import Pi05Batch, Pi05Collator
from relay_engine.models.tokenizer import Tokenizer
from relay_engine.modules import ModuleSequence

# -- modules, with lerobot's names ----------------------------------------------------------------


class VisionTower(nn.Module):
    """transformers' SigLIP without the pooling head, under lerobot's `vision_model.` level."""

    def __init__(self, size: VisionSize) -> None:
        super().__init__()
        config = SiglipVisionConfig(
            hidden_size=size.width,
            intermediate_size=size.mlp_dim,
            num_hidden_layers=size.depth,
            num_attention_heads=size.num_heads,
            image_size=size.image_size,
            patch_size=size.patch_size,
            hidden_act="gelu_pytorch_tanh",
            layer_norm_eps=1e-6,
            vision_use_head=False,
        )
        config._attn_implementation = "sdpa"
        self.vision_model = SiglipVisionModel(config)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, S, S) in [-1, 1] -> patch features (N, tokens, width)."""
        return self.vision_model(pixel_values=pixels).last_hidden_state


class MultiModalProjector(nn.Module):
    def __init__(self, vision_width: int, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(vision_width, width)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features)


class GemmaStack(nn.Module):
    """Gemma decoder layers and final norm; the language model also has the token embedding."""

    def __init__(
        self, size: GemmaSize, *, vocab_size: int | None = None, cond_dim: int | None = None
    ) -> None:
        super().__init__()
        if vocab_size is not None:
            self.embed_tokens = nn.Embedding(vocab_size, size.width)
        self.layers = ModuleSequence(GemmaDecoderLayer(size, cond_dim) for _ in range(size.depth))
        self.norm = (
            GemmaRMSNorm(size.width, eps=RMS_EPS)
            if cond_dim is None
            else AdaptiveRMSNorm(size.width, cond_dim)
        )


class PaliGemmaBackbone(nn.Module):
    def __init__(self, config: Pi05Config) -> None:
        super().__init__()
        self.vision_tower = VisionTower(config.vision)
        self.multi_modal_projector = MultiModalProjector(config.vision.width, config.language.width)
        self.language_model = GemmaStack(config.language, vocab_size=config.vocab_size)


class PaliGemma(nn.Module):
    def __init__(self, config: Pi05Config) -> None:
        super().__init__()
        self.model = PaliGemmaBackbone(config)


class GemmaExpert(nn.Module):
    def __init__(self, config: Pi05Config) -> None:
        super().__init__()
        self.model = GemmaStack(config.expert, cond_dim=config.expert.width)


class PaliGemmaWithExpert(nn.Module):
    def __init__(self, config: Pi05Config) -> None:
        super().__init__()
        self.paligemma = PaliGemma(config)
        self.gemma_expert = GemmaExpert(config)


@dataclass
class PrefixCache:
    """What the action expert needs of the prefix: every layer's keys and values, and its mask."""

    keys: list[torch.Tensor]  # per layer (B, kv_heads, P, head_dim), rotated
    values: list[torch.Tensor]
    mask: torch.Tensor  # (B, P) bool
    lengths: torch.Tensor  # (B,) valid prefix tokens: where the actions' positions start

    def repeated(self, times: int) -> PrefixCache:
        """Each frame's prefix `times` times over, in a row (frame 0 `times` times, then frame 1...):
        several chunks of one frame share its prefix pass, the costly part of sampling."""
        if times == 1:
            return self
        return PrefixCache(
            keys=[k.repeat_interleave(times, dim=0) for k in self.keys],
            values=[v.repeat_interleave(times, dim=0) for v in self.values],
            mask=self.mask.repeat_interleave(times, dim=0),
            lengths=self.lengths.repeat_interleave(times, dim=0),
        )


class Pi05Model(nn.Module):
    """The network: prefix keys/values, then the velocity of a noisy action chunk."""

    def __init__(self, config: Pi05Config) -> None:
        super().__init__()
        self.config = config
        width = config.expert.width
        self.paligemma_with_expert = PaliGemmaWithExpert(config)
        self.action_in_proj = nn.Linear(config.action_dim, width)
        self.action_out_proj = nn.Linear(width, config.action_dim)
        self.time_mlp_in = nn.Linear(width, width)
        self.time_mlp_out = nn.Linear(width, width)

    # Shortcuts to the parts, for readability below and for the tuning code.
    @property
    def vision_tower(self) -> VisionTower:
        return self.paligemma_with_expert.paligemma.model.vision_tower

    @property
    def projector(self) -> MultiModalProjector:
        return self.paligemma_with_expert.paligemma.model.multi_modal_projector

    @property
    def language_model(self) -> GemmaStack:
        return self.paligemma_with_expert.paligemma.model.language_model

    @property
    def expert(self) -> GemmaStack:
        return self.paligemma_with_expert.gemma_expert.model

    def init_weights(self, *, stand_in: bool) -> None:
        """Initial weights from the global RNG (SigLIP initialises itself on construction).

        `stand_in=False` is openpi's init for training from scratch: the adaptive norms' dense
        layers start at zero, closing every expert block's gate. A model with no pretrained
        weights (pi05-tiny) uses `stand_in=True` instead: its random weights stand in for
        pretrained ones, and LoRA on the expert (the default) leaves the adaptive norms frozen,
        so zero norms would keep every expert block closed and the flow time unseen for good.
        """
        for stack in (self.language_model, self.expert):
            for module in stack.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=module.in_features**-0.5)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, GemmaRMSNorm):
                    nn.init.zeros_(module.weight)
        # The embedding is scaled by sqrt(width) in use: this gives unit-RMS token embeddings.
        nn.init.normal_(self.language_model.embed_tokens.weight, std=self.config.language.width**-0.5)
        for module in self.expert.modules():
            if isinstance(module, AdaptiveRMSNorm):
                module.reset_parameters(zero=not stand_in)

    # -- the prefix -------------------------------------------------------------------------------

    def _needs_grad(self, module: nn.Module) -> bool:
        return any(p.requires_grad for p in module.parameters())

    def embed_prefix(self, batch: Pi05Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Image tokens then prompt tokens (B, P, width), and their mask (B, P)."""
        grad = torch.is_grad_enabled()
        vision_grad = grad and self._needs_grad(self.vision_tower)
        projector_grad = vision_grad or (grad and self._needs_grad(self.projector))
        in_use = batch.cameras_in_use
        if in_use is None:
            in_use = tuple(bool(x) for x in batch.image_mask.any(0).tolist())
        # A camera slot no sample uses adds only masked tokens, which change no output: skip it.
        slots = [slot for slot, used in enumerate(in_use) if used]
        parts, masks = [], []
        if slots:
            batch_size = batch.images.shape[0]
            pixels = batch.images[:, slots].flatten(0, 1)
            with torch.set_grad_enabled(vision_grad):
                features = self.vision_tower(pixels)
            with torch.set_grad_enabled(projector_grad):
                features = self.projector(features)
            tokens_per_image = features.shape[1]
            parts.append(features.reshape(batch_size, len(slots) * tokens_per_image, -1))
            masks.append(batch.image_mask[:, slots].repeat_interleave(tokens_per_image, dim=1))
        language = self.language_model.embed_tokens(batch.tokens) * math.sqrt(self.config.language.width)
        parts.append(language.to(parts[0].dtype) if parts else language)
        masks.append(batch.token_mask)
        return torch.cat(parts, dim=1), torch.cat(masks, dim=1)

    def prefix_cache(self, batch: Pi05Batch) -> PrefixCache:
        """Run the prefix through the language model, keeping each layer's keys and values.

        Without autograd when no weight up to here is trained (the images' and the prompt's
        path), so the frozen prefix holds no activation memory.
        """
        grad = torch.is_grad_enabled() and (self._needs_grad(self.paligemma_with_expert.paligemma))
        with torch.set_grad_enabled(grad):
            hidden, mask = self.embed_prefix(batch)
            positions = torch.cumsum(mask, dim=1) - 1  # padding does not advance positions
            rope = rope_tables(positions, self.config.language.head_dim)
            keys, values = [], []
            layers = self.language_model.layers
            for index, layer in enumerate(layers):
                # The last layer's output feeds nothing: it only makes its keys and values.
                hidden, k, v = layer(hidden, rope, mask, keys_only=index == len(layers) - 1)
                keys.append(k)
                values.append(v)
        return PrefixCache(keys=keys, values=values, mask=mask, lengths=mask.sum(dim=1))

    # -- the suffix -------------------------------------------------------------------------------

    def time_condition(self, time: torch.Tensor) -> torch.Tensor:
        embedded = posemb_sincos(time, self.config.expert.width).to(self.time_mlp_in.weight.dtype)
        return F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(embedded))))

    def velocity(self, prefix: PrefixCache, noisy_actions: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """The predicted velocity (B, H, action_dim), fp32, of `noisy_actions` at `time` (B,)."""
        cond = self.time_condition(time)
        hidden = self.action_in_proj(noisy_actions)
        batch_size, horizon, _ = noisy_actions.shape
        steps = torch.arange(horizon, device=hidden.device)
        rope = rope_tables(prefix.lengths[:, None] + steps[None, :], self.config.expert.head_dim)
        key_mask = torch.cat(
            [prefix.mask, torch.ones(batch_size, horizon, dtype=torch.bool, device=prefix.mask.device)], dim=1
        )
        for layer, prefix_keys, prefix_values in zip(
            self.expert.layers, prefix.keys, prefix.values, strict=True
        ):
            hidden, _, _ = layer(hidden, rope, key_mask, cond, prefix_keys, prefix_values)
        normed, _ = self.expert.norm(hidden, cond)
        # The action head reads the expert's output in fp32, whatever the autocast.
        # (The meta device, where the memory plan runs the model for shapes, has no autocast.)
        device_type = "cpu" if normed.device.type == "meta" else normed.device.type
        with torch.autocast(device_type=device_type, enabled=False):
            return self.action_out_proj(normed.float())


# -- the policy -----------------------------------------------------------------------------------


@dataclass
class FlowOutputs:
    """One flow-matching forward pass; t = 1 is noise, t = 0 is data."""

    velocity: torch.Tensor  # (B, H, 32) fp32, the model's prediction (with grad when training)
    target: torch.Tensor  # (B, H, 32) noise - actions
    x_t: torch.Tensor  # (B, H, 32) time * noise + (1 - time) * actions
    noise: torch.Tensor  # (B, H, 32)
    time: torch.Tensor  # (B,)


def sample_flow_time(batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Beta(1.5, 1) * 0.999 + 0.001. Its CDF is x**1.5, so u**(2/3) draws it from one uniform,
    which keeps every draw on the caller's generator."""
    device = generator.device if generator is not None else torch.device("cpu")
    uniform = torch.rand(batch_size, generator=generator, device=device)
    return uniform.pow(1.0 / 1.5) * 0.999 + 0.001


def flow_matching_loss(
    outputs: FlowOutputs, batch: Pi05Batch, *, balance_padding: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per_sample): each sample's squared error over its valid steps, and their mean
    weighted by the samples' weights, sum(w_i * l_i) / sum(w_i).

    Every column is trained, the padding columns beyond the robot's width towards their zero
    targets (as openpi does, so that any Euler sampler integrates the weights alike). With
    `balance_padding`, a sample's error is the mean over its robot's columns plus the mean over
    the padding columns: a 2-column robot's own error then counts as much as the 30 easy padding
    columns together, instead of a fifteenth of them, which is what lets a small model learn to
    look (docs/models.md). Without it, or when the robot fills every column, it is the plain mean
    over all columns."""
    error = (outputs.velocity.float() - outputs.target.float()).square()
    mask = batch.action_mask.to(device=error.device, dtype=error.dtype)
    if balance_padding and batch.action_width is not None:
        columns = torch.arange(error.shape[-1], device=error.device)
        robot = columns[None, None, :] < batch.action_width.to(error.device)[:, None, None]
        parts = [mask * robot, mask * ~robot]
        per_sample = sum(
            (error * part).sum(dim=(1, 2)) / part.sum(dim=(1, 2)).clamp_min(1.0) for part in parts
        )
    else:
        per_sample = (error * mask).sum(dim=(1, 2)) / mask.sum(dim=(1, 2)).clamp_min(1.0)
    assert isinstance(per_sample, torch.Tensor)
    weights = batch.weights.to(device=error.device, dtype=error.dtype)
    total = weights.sum()
    loss = (weights * per_sample).sum() / torch.where(total > 0, total, torch.ones_like(total))
    return loss, per_sample


class Pi05Policy(nn.Module):
    """pi0.5 with its processor: `collate`, `flow_outputs`, `sample_actions`, `save_pretrained`.

    Build one with `relay_engine.models.load_policy` or `build_policy`.
    """

    # Acting (relay_engine.acting): pi05 reads its camera slots, not cameras by name.
    reads_cameras: tuple[str, ...] | None = None

    @property
    def frame_size(self) -> int | None:
        """The square size its vision tower reads (a served frame is resized to it once)."""
        return self.config.vision.image_size

    def __init__(
        self, config: Pi05Config, tokenizer: Tokenizer | None = None, source: str | None = None
    ) -> None:
        super().__init__()
        self.config = config
        self.model = Pi05Model(config)
        # A plain attribute, not a bound method, so that DataLoader workers receive no weights.
        self.collate = Pi05Collator(config, tokenizer, source)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.collate.tokenizer

    @property
    def device(self) -> torch.device:
        return self.model.action_in_proj.weight.device

    @property
    def prefix_trainable(self) -> bool:
        """Whether any weight of the prefix (vision, projector, language model) is trained.

        When not, the prefix runs without autograd. It follows `requires_grad`, which
        `relay_engine.tuning.apply_tuning` sets.
        """
        return self.model._needs_grad(self.model.paligemma_with_expert.paligemma)

    def flow_outputs(
        self,
        batch: Pi05Batch,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
        time: torch.Tensor | None = None,
    ) -> FlowOutputs:
        """Noise the batch's actions at a random flow time and predict their velocity.

        Noise and time come from `generator` (on its device) unless given.
        """
        device = self.device
        actions = batch.actions.to(device)
        if noise is None:
            noise = _randn(actions.shape, generator)
        if time is None:
            time = sample_flow_time(actions.shape[0], generator)
        noise = noise.to(device=device, dtype=actions.dtype)
        time = time.to(device=device, dtype=actions.dtype)
        expanded = time[:, None, None]
        x_t = expanded * noise + (1.0 - expanded) * actions
        prefix = self.model.prefix_cache(batch.to(device))
        velocity = self.model.velocity(prefix, x_t, time)
        return FlowOutputs(velocity=velocity, target=noise - actions, x_t=x_t, noise=noise, time=time)

    @torch.no_grad()
    def sample_actions(
        self,
        batch: Pi05Batch,
        num_steps: int = 10,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
        chunks: int = 1,
    ) -> torch.Tensor:
        """Action chunks (B, H, 32): plain Euler steps from noise at t = 1 to t = 0 over every
        column, one prefix pass. This is openpi's and lerobot's sampler, so weights trained here
        sample the same there. The columns beyond the robot's action width are trained towards
        zero (see Pi05Batch.action_mask), so they end near zero and a robot reads only its own.

        With `chunks` > 1, that many chunks per frame from independent noise, (B * chunks, H, 32),
        frame by frame (rows b * chunks to b * chunks + chunks - 1 are frame b's): the prefix pass
        runs once per frame, only the denoising runs per chunk. The noise is drawn as one
        (B * chunks, H, 32) tensor, so `chunks=1` draws exactly what it always has."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be at least 1, got {num_steps}")
        if chunks < 1:
            raise ValueError(f"chunks must be at least 1, got {chunks}")
        device = self.device
        batch = batch.to(device)
        shape = (batch.tokens.shape[0] * chunks, self.config.action_horizon, self.config.action_dim)
        x = (_randn(shape, generator) if noise is None else noise).to(device=device, dtype=torch.float32)
        prefix = self.model.prefix_cache(batch).repeated(chunks)
        dt = -1.0 / num_steps
        for step in range(num_steps):
            t = 1.0 + step * dt
            velocity = self.model.velocity(prefix, x, torch.full((shape[0],), t, device=device)).float()
            x = x + dt * velocity
        return x

    def save_pretrained(self, directory: str | Path, features: RobotFeatures | None = None) -> None:
        """model.safetensors (lerobot's names, any adapters merged), relay_config.json, and lerobot's
        config.json (with the robot's cameras, state and action as its features, when given)."""
        from relay_engine.models.weights import save_policy

        save_policy(self, Path(directory), features)


def _randn(shape: tuple[int, ...] | torch.Size, generator: torch.Generator | None) -> torch.Tensor:
    device = generator.device if generator is not None else torch.device("cpu")
    return torch.randn(shape, generator=generator, device=device)
