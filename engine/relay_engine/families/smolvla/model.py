"""SmolVLA's network: a SmolVLM2 backbone (its vision tower, connector and first text layers) beside
a narrower action expert, trained by flow matching, laid out as lerobot 0.6.1's `SmolVLAPolicy` so
that its `model.safetensors` loads here strictly and the numbers agree.

The backbone's modules are transformers' own (`SmolVLMForConditionalGeneration`, and a Llama model
for the expert); how the two streams meet is written here. Layer by layer, the backbone reads the
prefix (the images, the prompt, the state) and the expert the suffix (the noisy action chunk at a
flow time). Every `self_attn_every_n_layers`-th layer attends jointly: both streams' queries, keys
and values in one sequence, under the prefix-LM mask (the prefix sees itself, each action token
sees the prefix and the action tokens before it). The others cross-attend: the backbone attends
over the prefix alone, and the expert's queries attend over the backbone's keys and values of that
layer, projected to the expert's width by the expert's own key and value projections (its
cross-attending layers' projections take the backbone's key-value width).

Sampling computes the prefix once (every layer attending over the prefix, its keys and values
kept) and then integrates the velocity from noise (t = 1) to actions (t = 0) in `num_steps` Euler
steps, the expert reading the kept keys and values.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, SmolVLMConfig, SmolVLMForConditionalGeneration
from transformers.models.gemma.modeling_gemma import rotate_half

from relay_engine.families.smolvla.config import SmolVLAConfig
from relay_engine.models.layers import posemb_sincos, rope_tables


def expert_mlp_width(width: int, multiplier: int = 4, multiple_of: int = 256) -> int:
    """The expert's MLP width for its hidden width, as lerobot sizes it (Llama's rule: 2/3 of
    `multiplier` x width, rounded up to a multiple of 256)."""
    hidden = int(multiplier * int(2 * width / 3))
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def make_attention_mask(pad_mask: torch.Tensor, block_starts: torch.Tensor) -> torch.Tensor:
    """(B, L, L) boolean: token i sees token j when both are real (not padding) and j's block
    started no later than i's (`block_starts` (B, L): 1 where a new block starts, big_vision's
    `mask_ar`)."""
    blocks = torch.cumsum(block_starts, dim=1)
    sees = blocks[:, None, :] <= blocks[:, :, None]
    return sees & (pad_mask[:, None, :] & pad_mask[:, :, None])


def with_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embeddings at `positions` (B, L) on x (B, L, heads, head_dim), computed in fp32."""
    cos, sin = rope_tables(positions, x.shape[-1])
    x32 = x.float()
    return (x32 * cos[:, :, None] + rotate_half(x32) * sin[:, :, None]).to(x.dtype)


def attend(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Grouped-query attention, (B, L, H, D) queries over (B, S, KV, D) keys and values where `mask`
    (B, L, S) is True; scores and softmax in fp32. A row with nothing to see (a padding token's)
    spreads evenly instead of dividing by zero, as lerobot's does, so that no NaN reaches the
    tokens that do see."""
    batch, length, heads, head_dim = queries.shape
    groups = heads // keys.shape[2]
    keys = keys.repeat_interleave(groups, dim=2)
    values = values.repeat_interleave(groups, dim=2)
    scores = torch.matmul(queries.float().transpose(1, 2), keys.float().permute(0, 2, 3, 1))
    scores = scores * head_dim**-0.5
    scores = torch.where(mask[:, None], scores, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1).to(values.dtype)
    attended = torch.matmul(probs, values.transpose(1, 2))  # (B, H, L, D)
    return attended.transpose(1, 2).reshape(batch, length, heads * head_dim)


def _queries_keys_values(layer: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A decoder layer's normed input projected to (B, L, heads, head_dim) queries, keys, values."""
    attention = layer.self_attn
    normed = layer.input_layernorm(hidden)
    shape = (*normed.shape[:-1], -1, attention.head_dim)
    return (
        attention.q_proj(normed).view(shape),
        attention.k_proj(normed).view(shape),
        attention.v_proj(normed).view(shape),
    )


def _finish_layer(layer: Any, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """The rest of a decoder layer after attention: output projection, residual, MLP, residual."""
    hidden = layer.self_attn.o_proj(attended) + hidden
    return layer.mlp(layer.post_attention_layernorm(hidden)) + hidden


@dataclass(frozen=True)
class PrefixInputs:
    """What the prefix is made of, processed: images (B, 3, H, W) in [-1, 1] at the backbone's
    size with which samples have each (B,), prompt tokens and their mask (B, T), the state padded
    to `max_state_dim` (B, 32)."""

    images: list[torch.Tensor]
    image_masks: list[torch.Tensor]
    tokens: torch.Tensor
    token_mask: torch.Tensor
    state: torch.Tensor


@dataclass
class PrefixCache:
    """The prefix's keys (rotated) and values of every backbone layer, (B, P, KV, D) each."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class BackboneWithExpert(nn.Module):
    """SmolVLM2's backbone, cut to its first `num_vlm_layers` text layers, and the action expert."""

    def __init__(self, config: SmolVLAConfig, backbone: SmolVLMConfig) -> None:
        super().__init__()
        self.vlm = SmolVLMForConditionalGeneration(backbone)
        text: Any = self.vlm.model.text_model
        if config.num_vlm_layers > 0:
            text.layers = text.layers[: config.num_vlm_layers]
        self.num_vlm_layers = len(text.layers)
        text_config: Any = backbone.text_config
        expert_config = copy.deepcopy(text_config)
        expert_config.hidden_size = int(text_config.hidden_size * config.expert_width_multiplier)
        expert_config.intermediate_size = expert_mlp_width(expert_config.hidden_size)
        expert_config.num_hidden_layers = (
            config.num_expert_layers if config.num_expert_layers > 0 else self.num_vlm_layers
        )
        if self.num_vlm_layers % expert_config.num_hidden_layers:
            raise ValueError(
                f"num_expert_layers ({expert_config.num_hidden_layers}) must divide the backbone's "
                f"{self.num_vlm_layers} layers"
            )
        self.lm_expert: Any = AutoModel.from_config(expert_config)
        self.joint_every = config.self_attn_every_n_layers
        backbone_kv = text_config.num_key_value_heads * text_config.head_dim
        expert_kv = expert_config.num_key_value_heads * expert_config.head_dim
        for index, layer in enumerate(self.lm_expert.layers):
            if not self.is_joint(index):  # it projects the backbone's keys and values
                bias = expert_config.attention_bias
                layer.self_attn.k_proj = nn.Linear(backbone_kv, expert_kv, bias=bias)
                layer.self_attn.v_proj = nn.Linear(backbone_kv, expert_kv, bias=bias)
        self.lm_expert.embed_tokens = None  # the expert reads embeddings, never tokens
        self.expert_width = expert_config.hidden_size
        self.layers_per_expert_layer = self.num_vlm_layers // expert_config.num_hidden_layers

    def is_joint(self, index: int) -> bool:
        return self.joint_every > 0 and index % self.joint_every == 0

    @property
    def text_model(self) -> Any:
        return self.vlm.model.text_model

    def expert_layer(self, index: int) -> Any | None:
        """The expert's layer beside backbone layer `index`; None between them when the expert has
        fewer layers (its stream then passes that layer unchanged)."""
        if index % self.layers_per_expert_layer:
            return None
        return self.lm_expert.layers[index // self.layers_per_expert_layer]

    def embed_image(self, pixels: torch.Tensor) -> torch.Tensor:
        model: Any = self.vlm.model
        features = model.vision_model(pixel_values=pixels.to(model.vision_model.dtype)).last_hidden_state
        return model.connector(features)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.text_model.get_input_embeddings()(tokens)

    def forward(
        self, prefix: torch.Tensor, suffix: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Training: both streams through every layer; the expert's output (B, S, expert width).
        `mask` (B, P+S, P+S) and `positions` (B, P+S) cover the prefix, then the suffix."""
        length = prefix.shape[1]
        for index, layer in enumerate(self.text_model.layers):
            expert = self.expert_layer(index)
            if self.is_joint(index):
                prefix, suffix = self._joint(layer, expert, prefix, suffix, mask, positions)
                continue
            queries, keys, values = _queries_keys_values(layer, prefix)
            keys = with_rope(keys, positions[:, :length])
            attended = attend(
                with_rope(queries, positions[:, :length]), keys, values, mask[:, :length, :length]
            )
            if expert is not None:
                suffix = self._cross(
                    expert, suffix, keys, values, mask[:, length:, :length], positions[:, length:]
                )
            prefix = _finish_layer(layer, prefix, attended)
        return self.lm_expert.norm(suffix)

    def _joint(
        self,
        layer: Any,
        expert: Any | None,
        prefix: torch.Tensor,
        suffix: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        length = prefix.shape[1]
        parts = [_queries_keys_values(layer, prefix)]
        if expert is not None:
            parts.append(_queries_keys_values(expert, suffix))
        seen = sum(part[0].shape[1] for part in parts)
        queries, keys, values = (torch.cat([part[i] for part in parts], dim=1) for i in range(3))
        attended = attend(
            with_rope(queries, positions[:, :seen]),
            with_rope(keys, positions[:, :seen]),
            values,
            mask[:, :seen, :seen],
        )
        prefix = _finish_layer(layer, prefix, attended[:, :length])
        if expert is not None:
            suffix = _finish_layer(expert, suffix, attended[:, length:])
        return prefix, suffix

    @staticmethod
    def _cross(
        expert: Any,
        suffix: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """The expert's queries over the backbone's (rotated) keys and values of the prefix. Its
        queries' positions count from 0: the backbone's keys carry the prefix's own."""
        attention = expert.self_attn
        normed = expert.input_layernorm(suffix)
        queries = attention.q_proj(normed).view(*normed.shape[:-1], -1, attention.head_dim)
        flat_keys = keys.reshape(*keys.shape[:2], -1)
        flat_values = values.reshape(*values.shape[:2], -1)
        keys = attention.k_proj(flat_keys).view(*flat_keys.shape[:-1], -1, attention.head_dim)
        values = attention.v_proj(flat_values).view(*flat_values.shape[:-1], -1, attention.head_dim)
        own_positions = positions - positions.min(dim=1, keepdim=True).values
        attended = attend(with_rope(queries, own_positions), keys, values, mask)
        return _finish_layer(expert, suffix, attended)

    def prefix_cache(self, prefix: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> PrefixCache:
        """Sampling's first pass: every backbone layer attends over the prefix; its keys and values
        are kept for the expert."""
        kept_keys, kept_values = [], []
        for layer in self.text_model.layers:
            queries, keys, values = _queries_keys_values(layer, prefix)
            keys = with_rope(keys, positions)
            kept_keys.append(keys)
            kept_values.append(values)
            prefix = _finish_layer(layer, prefix, attend(with_rope(queries, positions), keys, values, mask))
        return PrefixCache(kept_keys, kept_values)

    def denoise(
        self, suffix: torch.Tensor, cache: PrefixCache, mask: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The expert alone over the kept prefix: `mask` (B, S, P+S), `positions` (B, S) the suffix's,
        counted after the prefix's real tokens."""
        length = cache.keys[0].shape[1]
        for index in range(self.num_vlm_layers):
            expert = self.expert_layer(index)
            if expert is None:
                continue
            keys, values = cache.keys[index], cache.values[index]
            if not self.is_joint(index):
                suffix = self._cross(expert, suffix, keys, values, mask[:, :, :length], positions)
                continue
            queries, own_keys, own_values = _queries_keys_values(expert, suffix)
            attended = attend(
                with_rope(queries, positions),
                torch.cat([keys, with_rope(own_keys, positions)], dim=1),
                torch.cat([values, own_values], dim=1),
                mask,
            )
            suffix = _finish_layer(expert, suffix, attended)
        return self.lm_expert.norm(suffix)


class SmolVLAFlow(nn.Module):
    """The flow-matching model: prefix and suffix embeddings around `BackboneWithExpert`. Inputs
    are processed already (`PrefixInputs`; actions and noise padded to `max_action_dim`)."""

    def __init__(self, config: SmolVLAConfig, backbone: SmolVLMConfig) -> None:
        super().__init__()
        self.config = config
        self.vlm_with_expert = BackboneWithExpert(config, backbone)
        text_config: Any = backbone.text_config
        width = text_config.hidden_size
        expert = self.vlm_with_expert.expert_width
        self.state_proj = nn.Linear(config.max_state_dim, width)
        self.action_in_proj = nn.Linear(config.max_action_dim, expert)
        self.action_out_proj = nn.Linear(expert, config.max_action_dim)
        self.action_time_mlp_in = nn.Linear(expert * 2, expert)
        self.action_time_mlp_out = nn.Linear(expert, expert)

    def embed_prefix(self, inputs: PrefixInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(embeddings, pad mask, block starts) of images, prompt and state. The images and the
        prompt are one block; the state starts its own (they do not see it)."""
        embeddings, pads = [], []
        for image, image_mask in zip(inputs.images, inputs.image_masks, strict=True):
            embedded = self.vlm_with_expert.embed_image(image)
            embedded = embedded * torch.tensor(embedded.shape[-1] ** 0.5, dtype=embedded.dtype)
            embeddings.append(embedded)
            pads.append(image_mask[:, None].expand(-1, embedded.shape[1]))
        words = self.vlm_with_expert.embed_tokens(inputs.tokens)
        embeddings.append(words * math.sqrt(words.shape[-1]))
        pads.append(inputs.token_mask)
        embeddings.append(self.state_proj(inputs.state)[:, None])
        pads.append(torch.ones_like(inputs.token_mask[:, :1]))
        pad_mask = torch.cat(pads, dim=1)
        block_starts = torch.zeros_like(pad_mask)
        block_starts[:, -1] = True
        return torch.cat(embeddings, dim=1), pad_mask, block_starts

    def embed_suffix(
        self, noisy_actions: torch.Tensor, time: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(embeddings, pad mask, block starts) of the noisy chunk at `time`: each action token
        starts a block, so it sees the ones before it and not those after."""
        actions = self.action_in_proj(noisy_actions)
        width = self.vlm_with_expert.expert_width
        times = posemb_sincos(time, width, self.config.min_period, self.config.max_period).to(actions.dtype)
        fused = torch.cat([actions, times[:, None].expand_as(actions)], dim=2)
        fused = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(fused)))
        ones = torch.ones(fused.shape[:2], dtype=torch.bool, device=fused.device)
        return fused, ones, ones

    def losses(
        self, inputs: PrefixInputs, actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """Squared errors (B, chunk, max_action_dim) of the predicted velocity at x_t =
        t * noise + (1 - t) * actions against noise - actions."""
        t = time[:, None, None]
        noisy = t * noise + (1 - t) * actions
        prefix, prefix_pad, prefix_blocks = self.embed_prefix(inputs)
        suffix, suffix_pad, suffix_blocks = self.embed_suffix(noisy, time)
        pad_mask = torch.cat([prefix_pad, suffix_pad], dim=1)
        mask = make_attention_mask(pad_mask, torch.cat([prefix_blocks, suffix_blocks], dim=1))
        positions = torch.cumsum(pad_mask, dim=1) - 1
        out = self.vlm_with_expert(prefix, suffix, mask, positions)
        velocity = self.action_out_proj(out[:, -self.config.chunk_size :].float())
        return F.mse_loss(noise - actions, velocity, reduction="none")

    @torch.no_grad()
    def sample(self, inputs: PrefixInputs, noise: torch.Tensor, num_steps: int | None = None) -> torch.Tensor:
        """A chunk (B, chunk, max_action_dim) integrated from `noise` at t = 1 to t = 0."""
        steps = num_steps or self.config.num_steps
        prefix, prefix_pad, prefix_blocks = self.embed_prefix(inputs)
        positions = torch.cumsum(prefix_pad, dim=1) - 1
        cache = self.vlm_with_expert.prefix_cache(
            prefix, make_attention_mask(prefix_pad, prefix_blocks), positions
        )
        dt = -1.0 / steps
        x = noise
        batch = noise.shape[0]
        for step in range(steps):
            time = torch.full((batch,), 1.0 + step * dt, dtype=torch.float32, device=noise.device)
            x = x + dt * self._velocity(x, time, cache, prefix_pad)
        return x

    def _velocity(
        self, x: torch.Tensor, time: torch.Tensor, cache: PrefixCache, prefix_pad: torch.Tensor
    ) -> torch.Tensor:
        suffix, suffix_pad, suffix_blocks = self.embed_suffix(x, time)
        length = suffix.shape[1]
        sees_prefix = prefix_pad[:, None, :].expand(-1, length, -1)
        mask = torch.cat([sees_prefix, make_attention_mask(suffix_pad, suffix_blocks)], dim=2)
        positions = prefix_pad.sum(dim=1, keepdim=True) + torch.cumsum(suffix_pad, dim=1) - 1
        out = self.vlm_with_expert.denoise(suffix, cache, mask, positions)
        return self.action_out_proj(out[:, -self.config.chunk_size :].float())
