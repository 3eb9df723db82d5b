"""A deliberately plain pi0.5 forward, for checking the model's split prefix/suffix passes.

One sequence [prefix ; actions], openpi's 2-D mask from input and autoregressive masks
(`make_attn_mask`), eager attention with an explicit softmax, every layer of both stacks run in
full. It shares only the weights and the embedding/time helpers with the model under test.
"""

from __future__ import annotations

import torch
from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb

from relay_engine.models import Pi05Batch
from relay_engine.models.layers import rope_tables
from relay_engine.models.pi05 import Pi05Model

MASKED = -2.3819763e38


def make_attn_mask(input_mask: torch.Tensor, ar_mask: torch.Tensor) -> torch.Tensor:
    """openpi: token q may attend to k iff cumsum(ar)[k] <= cumsum(ar)[q], both valid."""
    cumsum = torch.cumsum(ar_mask.int(), dim=1)
    allowed = cumsum[:, None, :] <= cumsum[:, :, None]
    return allowed & input_mask[:, None, :] & input_mask[:, :, None]


def _heads(x: torch.Tensor, count: int, head_dim: int) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1], count, head_dim).transpose(1, 2)


def joint_forward(
    model: Pi05Model, batch: Pi05Batch, x_t: torch.Tensor, time: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(velocity, the prefix's hidden states after every layer)."""
    config = model.config
    size = config.language
    prefix, prefix_mask = model.embed_prefix(batch)
    cond = model.time_condition(time)
    suffix = model.action_in_proj(x_t)
    batch_size, prefix_len, _ = prefix.shape
    horizon = suffix.shape[1]
    input_mask = torch.cat([prefix_mask, torch.ones(batch_size, horizon, dtype=torch.bool)], dim=1)
    ar_mask = torch.zeros(batch_size, prefix_len + horizon, dtype=torch.bool)
    ar_mask[:, prefix_len] = True
    mask = make_attn_mask(input_mask, ar_mask)[:, None]
    cos, sin = rope_tables(torch.cumsum(input_mask.int(), dim=1) - 1, size.head_dim)
    hidden_p, hidden_s = prefix, suffix
    prefix_states = []
    for lm_layer, ex_layer in zip(model.language_model.layers, model.expert.layers, strict=True):
        xp = lm_layer.input_layernorm(hidden_p)
        xs, gate = ex_layer.input_layernorm(hidden_s, cond)
        projections = []
        for name, count in (
            ("q_proj", size.num_heads),
            ("k_proj", size.num_kv_heads),
            ("v_proj", size.num_kv_heads),
        ):
            joined = torch.cat(
                [getattr(lm_layer.self_attn, name)(xp), getattr(ex_layer.self_attn, name)(xs)], dim=1
            )
            projections.append(_heads(joined, count, size.head_dim))
        q, k, v = projections
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        repeat = size.num_heads // size.num_kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        logits = (q @ k.transpose(-1, -2)) * size.head_dim**-0.5
        probs = logits.masked_fill(~mask, MASKED).float().softmax(dim=-1)
        attended = (probs @ v).transpose(1, 2).reshape(batch_size, prefix_len + horizon, -1)
        hidden_p = hidden_p + lm_layer.self_attn.o_proj(attended[:, :prefix_len])
        hidden_s = hidden_s + ex_layer.self_attn.o_proj(attended[:, prefix_len:]) * gate
        hidden_p = hidden_p + lm_layer.mlp(lm_layer.post_attention_layernorm(hidden_p))
        xs, gate = ex_layer.post_attention_layernorm(hidden_s, cond)
        hidden_s = hidden_s + ex_layer.mlp(xs) * gate
        prefix_states.append(hidden_p)
    out, _ = model.expert.norm(hidden_s, cond)
    return model.action_out_proj(out.float()), prefix_states
