"""The building blocks of pi0.5's two Gemma stacks, named as lerobot names them.

transformers supplies the MLP, the plain RMSNorm and the rotary helper. The adaptive RMSNorm
and the attention projections are ours: a layer here does not run its own attention, because
pi0.5's attention spans both stacks (see `pi05.py`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from transformers import GemmaConfig
from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm, rotate_half

from relay_engine.models.config import GemmaSize

RMS_EPS = 1e-6
ROPE_MAX_WAVELENGTH = 10_000.0


class AdaptiveRMSNorm(nn.Module):
    """RMSNorm whose scale, shift and residual gate come from the flow-matching time.

    `dense` maps the time condition to (scale, shift, gate); it starts at zero, so at init the
    norm is a plain RMSNorm and every gated residual branch is closed (openpi `RMSNorm` with
    `cond`, lerobot `PiGemmaRMSNorm`).
    """

    def __init__(self, width: int, cond_dim: int, eps: float = RMS_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * width)

    def reset_parameters(self, *, zero: bool = True) -> None:
        """openpi's init (zero: closed gates, identity norm); or, for a model that has no
        pretrained weights to stand for, random modulation around open gates."""
        nn.init.zeros_(self.dense.bias)
        if zero:
            nn.init.zeros_(self.dense.weight)
            return
        nn.init.normal_(self.dense.weight, std=0.5 * self.dense.in_features**-0.5)
        with torch.no_grad():
            self.dense.bias.chunk(3)[2].fill_(1.0)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale, shift, gate = self.dense(cond)[:, None, :].chunk(3, dim=-1)
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        out = normed * (1.0 + scale.float()) + shift.float()
        return out.type_as(x), gate


class GemmaAttentionProjections(nn.Module):
    """q, k, v and o of one Gemma layer; the attention itself runs across both stacks."""

    def __init__(self, width: int, size: GemmaSize) -> None:
        super().__init__()
        self.num_heads = size.num_heads
        self.num_kv_heads = size.num_kv_heads
        self.head_dim = size.head_dim
        self.q_proj = nn.Linear(width, size.num_heads * size.head_dim, bias=False)
        self.k_proj = nn.Linear(width, size.num_kv_heads * size.head_dim, bias=False)
        self.v_proj = nn.Linear(width, size.num_kv_heads * size.head_dim, bias=False)
        self.o_proj = nn.Linear(size.num_heads * size.head_dim, width, bias=False)

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, count, self.head_dim).transpose(1, 2)

    def keys_values(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values, (B, kv_heads, L, head_dim)."""
        keys = apply_rope(self._heads(self.k_proj(x), self.num_kv_heads), rope)
        return keys, self._heads(self.v_proj(x), self.num_kv_heads)

    def queries(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rotated queries, (B, heads, L, head_dim)."""
        return apply_rope(self._heads(self.q_proj(x), self.num_heads), rope)

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        """(B, heads, L, head_dim) -> (B, L, width)."""
        batch, _, length, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(batch, length, -1))


class GemmaDecoderLayer(nn.Module):
    """Pre-norm Gemma block; with `cond_dim` its norms are adaptive (the action expert)."""

    def __init__(self, size: GemmaSize, cond_dim: int | None = None) -> None:
        super().__init__()
        self.self_attn = GemmaAttentionProjections(size.width, size)
        self.mlp = GemmaMLP(gemma_mlp_config(size))
        if cond_dim is None:
            self.input_layernorm: nn.Module = GemmaRMSNorm(size.width, eps=RMS_EPS)
            self.post_attention_layernorm: nn.Module = GemmaRMSNorm(size.width, eps=RMS_EPS)
        else:
            self.input_layernorm = AdaptiveRMSNorm(size.width, cond_dim)
            self.post_attention_layernorm = AdaptiveRMSNorm(size.width, cond_dim)
        # Recompute this layer's activations in backward instead of keeping them (full fine-tuning
        # on many GPUs turns it on: see relay_engine.families.pi05.parallel).
        self.checkpoint_activations = False

    def forward(
        self,
        hidden: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        key_mask: torch.Tensor,
        cond: torch.Tensor | None = None,
        prefix_keys: torch.Tensor | None = None,
        prefix_values: torch.Tensor | None = None,
        keys_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One block: (hidden after it, its keys, its values).

        A language-model layer (no `cond`) attends over its own tokens; with `keys_only` it only
        makes its keys and values and leaves `hidden` as it was. An action-expert layer (`cond`
        given) attends over [prefix keys/values ; its own]. Going through `forward` (rather than
        the parts) is what lets FSDP gather a layer's weights and checkpointing recompute it.
        """
        if self.checkpoint_activations and torch.is_grad_enabled():
            outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = torch.utils.checkpoint.checkpoint(
                self._block,
                hidden,
                rope,
                key_mask,
                cond,
                prefix_keys,
                prefix_values,
                keys_only,
                use_reentrant=False,
            )
            return outputs
        return self._block(hidden, rope, key_mask, cond, prefix_keys, prefix_values, keys_only)

    def _block(
        self,
        hidden: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        key_mask: torch.Tensor,
        cond: torch.Tensor | None,
        prefix_keys: torch.Tensor | None,
        prefix_values: torch.Tensor | None,
        keys_only: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if cond is None:
            normed = self.input_layernorm(hidden)
            keys, values = self.self_attn.keys_values(normed, rope)
            if keys_only:
                return hidden, keys, values
            attended = attend(self.self_attn.queries(normed, rope), keys, values, key_mask)
            hidden = hidden + self.self_attn.output(attended)
            hidden = hidden + self.mlp(self.post_attention_layernorm(hidden))
            return hidden, keys, values
        assert prefix_keys is not None and prefix_values is not None
        normed, gate = self.input_layernorm(hidden, cond)
        keys, values = self.self_attn.keys_values(normed, rope)
        all_keys = torch.cat([prefix_keys.to(keys.dtype), keys], dim=2)
        all_values = torch.cat([prefix_values.to(values.dtype), values], dim=2)
        attended = attend(self.self_attn.queries(normed, rope), all_keys, all_values, key_mask)
        hidden = hidden + self.self_attn.output(attended) * gate
        normed, gate = self.post_attention_layernorm(hidden, cond)
        hidden = hidden + self.mlp(normed) * gate
        return hidden, keys, values


def gemma_mlp_config(size: GemmaSize) -> GemmaConfig:
    return GemmaConfig(
        hidden_size=size.width,
        intermediate_size=size.mlp_dim,
        hidden_act="gelu_pytorch_tanh",
        num_hidden_layers=size.depth,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        head_dim=size.head_dim,
    )


def rope_tables(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (B, L, head_dim), fp32, of half-split rotary embeddings at `positions`."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (ROPE_MAX_WAVELENGTH**exponents)
    angles = positions[..., None].float() * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    # In fp32, as openpi does, whatever the activations' dtype.
    cos, sin = (t.unsqueeze(1) for t in rope)
    x32 = x.float()
    return (x32 * cos + rotate_half(x32) * sin).to(x.dtype)


def attend(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_mask: torch.Tensor
) -> torch.Tensor:
    """Multi-query attention where each query sees the keys whose `key_mask` (B, S) is True.

    No query row is ever fully masked (every sequence has a BOS token), so a boolean mask is safe.
    """
    keys, values = keys.to(queries.dtype), values.to(queries.dtype)
    mask = key_mask[:, None, None, :]
    if queries.device.type == "cpu":
        # The CPU's fused kernel takes the shared key/value head as it is.
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, enable_gqa=True)
    # On CUDA only the math kernel does grouped heads with a mask; repeating the shared head
    # lets the memory-efficient kernel run instead.
    groups = queries.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask)


def posemb_sincos(
    time: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0
) -> torch.Tensor:
    """Sine-cosine embedding (B, dim) of flow-matching times in [0, 1] (openpi `posemb_sincos`)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=time.device)
    period = min_period * (max_period / min_period) ** fraction
    angles = time.to(torch.float64)[:, None] * (2 * math.pi / period)[None, :]
    return torch.cat((angles.sin(), angles.cos()), dim=-1).float()
