"""The RT-J network: per-type value encoders, relational attention blocks, per-type decoders.

Parameter names follow RelativeDB's checkpoint layout (`enc_dict`, `dec_dict`, `norm_dict`,
`mask_embs`, `blocks.N.attns.{col,feat,nbr}`, `blocks.N.norms`, `blocks.N.ffn`, `norm_out`), so a
`model.safetensors` written by either side loads in the other.

Each block runs three masked attentions, each pre-RMSNorm and residual, then a SwiGLU FFN:
  col  - a cell attends to the cells of the same column of the same table (down the column);
  feat - to the cells of its own row and of the rows its row points to (its parents);
  nbr  - to the cells of the rows that point to its row (its children).
RT-J's attention normalises queries and keys per head (QK-RMSNorm), multiplies the query by a
learned per-head scale times log(number of keys the query may see), and gates the output with
2*sigmoid(W_g x).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from relay_engine.families.rtj.batch import SEMANTIC_TYPES, RelationalBatch
from relay_engine.modules import ModuleMapping, ModuleSequence

ATTENTION_KINDS: tuple[str, ...] = ("col", "feat", "nbr")
# The views `RTJNetwork.outputs` gives, by the names RelativeDB's package uses for them.
OUTPUT_VIEWS: tuple[str, ...] = (
    "target_scores",
    "token_scores",
    "target_features",
    "target_scores_and_text",
    "embeddings",
)


@dataclass
class ModelOutput:
    """What one forward pass gives; only the fields of the view asked for are set.

    scores [B]: the number decoder summed over each context's target cells; token_scores [B, S]:
    that decoder on every cell; target_text [B, d_text]: the text decoder summed over the targets;
    features [B, d_model]: the final hidden state summed over the targets; embeddings
    [B, S, d_model]: the final hidden state of every cell."""

    scores: Tensor | None = None
    token_scores: Tensor | None = None
    target_text: Tensor | None = None
    features: Tensor | None = None
    embeddings: Tensor | None = None


@dataclass(frozen=True)
class RTJConfig:
    """The sizes of an RT-J network. `boolean_channel`: RelativeDB's layout has a boolean encoder,
    decoder, norm and mask embedding; Stanford's released layout has none."""

    num_blocks: int = 12
    d_model: int = 512
    d_text: int = 384
    num_heads: int = 8
    d_ff: int = 2048
    boolean_channel: bool = True

    def to_dict(self) -> dict[str, int | bool]:
        return asdict(self)


# The published RT-J dimensions, and a tiny model of the same shape for CPUs and tests.
NAMED_CONFIGS: dict[str, RTJConfig] = {
    "rt-j": RTJConfig(),
    "rt-j-tiny": RTJConfig(num_blocks=2, d_model=64, d_text=384, num_heads=4, d_ff=128),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, values: Tensor) -> Tensor:
        wide = values.float()
        normalized = wide * torch.rsqrt(wide.square().mean(-1, keepdim=True) + self.eps)
        return normalized.to(values.dtype) * self.scale


class RelationalAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} must be a multiple of num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.q_norm = RMSNorm(self.head_dim, device=device)
        self.k_norm = RMSNorm(self.head_dim, device=device)
        self.wq = nn.Linear(d_model, d_model, bias=False, device=device)
        self.wk = nn.Linear(d_model, d_model, bias=False, device=device)
        self.wv = nn.Linear(d_model, d_model, bias=False, device=device)
        self.wo = nn.Linear(d_model, d_model, bias=False, device=device)
        self.wg = nn.Linear(d_model, d_model, bias=False, device=device)
        self.scale = nn.Parameter(torch.ones(1, num_heads, 1, 1, device=device))

    def forward(self, values: Tensor, mask: Tensor, log_counts: Tensor, has_keys: Tensor) -> Tensor:
        """`mask` [B, 1, S, S]: which keys each query sees, with at least one key per row (rows
        that see none are zeroed by `has_keys` [B, S, 1]); `log_counts` [B, 1, S, 1]."""
        b, s, d = values.shape
        heads = (b, s, self.num_heads, self.head_dim)
        query = self.q_norm(self.wq(values).view(heads).transpose(1, 2))
        key = self.k_norm(self.wk(values).view(heads).transpose(1, 2))
        value = self.wv(values).view(heads).transpose(1, 2).to(query.dtype)
        query = query * (self.scale * log_counts.to(query.dtype))
        attended = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=1.0 / self.head_dim
        )
        attended = attended.transpose(1, 2).reshape(b, s, d) * has_keys
        gate = 2 * torch.sigmoid(self.wg(values))
        return self.wo(gate * attended)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False, device=device)
        self.w2 = nn.Linear(d_ff, d_model, bias=False, device=device)
        self.w3 = nn.Linear(d_model, d_ff, bias=False, device=device)

    def forward(self, values: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(values)) * self.w3(values))


@dataclass(frozen=True)
class AttentionMasks:
    """Per kind: the keys each query sees, log(their count) and whether there is any."""

    masks: dict[str, Tensor]
    log_counts: dict[str, Tensor]
    has_keys: dict[str, Tensor]


class RelationalBlock(nn.Module):
    def __init__(
        self, d_model: int, num_heads: int, d_ff: int, *, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.norms = nn.ModuleDict(
            {kind: RMSNorm(d_model, device=device) for kind in (*ATTENTION_KINDS, "ffn")}
        )
        self.attns = ModuleMapping(
            {kind: RelationalAttention(d_model, num_heads, device=device) for kind in ATTENTION_KINDS}
        )
        self.ffn = SwiGLU(d_model, d_ff, device=device)

    def forward(self, values: Tensor, masks: AttentionMasks) -> Tensor:
        for kind in ATTENTION_KINDS:
            values = values + self.attns[kind](
                self.norms[kind](values), masks.masks[kind], masks.log_counts[kind], masks.has_keys[kind]
            )
        return values + self.ffn(self.norms["ffn"](values))


def attention_masks(batch: RelationalBatch) -> AttentionMasks:
    """The col, feat and nbr masks of a batch (dense, [B, S, S] each)."""
    node = batch.node_idxs
    parents = batch.f2p_nbr_idxs
    real = ~batch.is_padding
    both_real = real[:, :, None] & real[:, None, :]
    same_row = node[:, :, None] == node[:, None, :]
    # key_is_parent[b, q, k]: the key's row is one of the query row's parents.
    key_is_parent = (parents[:, :, None, :] == node[:, None, :, None]).any(-1)
    same_column = (batch.col_name_idxs[:, :, None] == batch.col_name_idxs[:, None, :]) & (
        batch.table_name_idxs[:, :, None] == batch.table_name_idxs[:, None, :]
    )
    dense = {
        "col": same_column & both_real,
        "feat": (same_row | key_is_parent) & both_real,
        # The query's row is one of the key row's parents: the key is a child.
        "nbr": key_is_parent.transpose(1, 2) & both_real,
    }
    masks, log_counts, has_keys = {}, {}, {}
    for kind, mask in dense.items():
        counts = mask.sum(-1, keepdim=True)
        any_key = counts > 0
        # A query that sees nothing attends everywhere (a finite softmax) and is zeroed after.
        masks[kind] = (mask | ~any_key).unsqueeze(1)
        log_counts[kind] = counts.clamp_min(1).float().log().unsqueeze(1)
        has_keys[kind] = any_key.float()
    return AttentionMasks(masks, log_counts, has_keys)


class RTJNetwork(nn.Module):
    """RT-J. `forward` returns one score per context: the number decoder summed over the target
    cells (`target_scores`); `target_features` is the final hidden state summed over them."""

    def __init__(self, config: RTJConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = config
        d, d_text = config.d_model, config.d_text
        self.semantic_types = SEMANTIC_TYPES if config.boolean_channel else SEMANTIC_TYPES[:3]
        encoders = {"number": 1, "text": d_text, "datetime": 1, "col_name": d_text, "boolean": 1}
        decoders = {"number": 1, "text": d_text, "datetime": 1, "boolean": 1}
        kept = (*self.semantic_types, "col_name")
        self.enc_dict = nn.ModuleDict(
            {name: nn.Linear(width, d, device=device) for name, width in encoders.items() if name in kept}
        )
        self.dec_dict = ModuleMapping(
            {name: nn.Linear(d, width, device=device) for name, width in decoders.items() if name in kept}
        )
        self.norm_dict = nn.ModuleDict({name: RMSNorm(d, device=device) for name in kept})
        self.mask_embs = nn.ParameterDict(
            {name: nn.Parameter(torch.randn(d, device=device)) for name in self.semantic_types}
        )
        self.blocks = ModuleSequence(
            [
                RelationalBlock(d, config.num_heads, config.d_ff, device=device)
                for _ in range(config.num_blocks)
            ]
        )
        self.norm_out = RMSNorm(d, device=device)

    def init_weights(self) -> None:
        """RT-J's initialisation: the attention outputs, the FFN's down projection and the
        decoders start at zero, so a fresh network is the identity plus embeddings and predicts 0."""
        with torch.no_grad():
            for block in self.blocks:
                for attention in block.attns.values():
                    attention.wo.weight.zero_()
                block.ffn.w2.weight.zero_()
            for decoder in self.dec_dict.values():
                decoder.weight.zero_()
                decoder.bias.zero_()

    def embed(self, batch: RelationalBatch) -> Tensor:
        """The input embedding of every cell: its column name plus its value (or its type's mask
        embedding for a target)."""
        dtype = self.norm_out.scale.dtype
        real = ~batch.is_padding
        values = self.norm_dict["col_name"](self.enc_dict["col_name"](batch.col_name_values.to(dtype)))
        values = values * real.unsqueeze(-1)
        channels = {
            "number": batch.number_values,
            "text": batch.text_values,
            "datetime": batch.datetime_values,
            "boolean": batch.boolean_values,
        }
        for code, name in enumerate(self.semantic_types):
            of_type = (batch.sem_types == code) & real
            shown = (of_type & ~batch.is_targets).unsqueeze(-1)
            hidden = (of_type & batch.is_targets).unsqueeze(-1)
            encoded = self.norm_dict[name](self.enc_dict[name](torch.nan_to_num(channels[name].to(dtype))))
            values = values + encoded * shown + self.mask_embs[name] * hidden
        if not self.config.boolean_channel and bool(((batch.sem_types == 3) & real).any()):
            raise ValueError("sem_types: this checkpoint has no boolean channel; encode booleans as numbers")
        return values

    def encode(self, batch: RelationalBatch) -> Tensor:
        """The final hidden state of every cell, [B, S, d_model]."""
        masks = attention_masks(batch)
        values = self.embed(batch)
        for block in self.blocks:
            values = block(values, masks)
        return self.norm_out(values)

    def target_features(self, batch: RelationalBatch) -> Tensor:
        hidden = self.encode(batch)
        return (hidden * batch.is_targets.unsqueeze(-1).to(hidden.dtype)).sum(1)

    def forward(self, batch: RelationalBatch) -> Tensor:
        """target_scores: [B]."""
        hidden = self.encode(batch)
        per_cell = self.dec_dict["number"](hidden).squeeze(-1)
        return (per_cell * batch.is_targets.to(per_cell.dtype)).sum(1)

    def outputs(self, batch: RelationalBatch, output: str = "target_scores") -> ModelOutput:
        """One of OUTPUT_VIEWS of a forward pass (see ModelOutput)."""
        if output not in OUTPUT_VIEWS:
            raise ValueError(f"output must be one of {', '.join(OUTPUT_VIEWS)}, got {output!r}")
        hidden = self.encode(batch)
        if output == "embeddings":
            return ModelOutput(embeddings=hidden)
        targets = batch.is_targets.to(hidden.dtype)
        if output == "target_features":
            return ModelOutput(features=(hidden * targets.unsqueeze(-1)).sum(1))
        per_cell = self.dec_dict["number"](hidden).squeeze(-1)
        if output == "token_scores":
            return ModelOutput(token_scores=per_cell)
        scores = (per_cell * targets).sum(1)
        if output == "target_scores":
            return ModelOutput(scores=scores)
        text = (self.dec_dict["text"](hidden) * targets.unsqueeze(-1)).sum(1)
        return ModelOutput(scores=scores, target_text=text)


def parameter_count(config: RTJConfig) -> int:
    """How many weights a network of these sizes has (built on the meta device: no memory)."""
    return sum(p.numel() for p in RTJNetwork(config, device="meta").parameters())
