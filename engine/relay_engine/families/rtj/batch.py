"""RelationalBatch: a padded batch of cells, the tensors RT-J reads.

One token per cell of a sampled row. Integer fields describe the structure (which row a cell
belongs to, the rows its row points to, its column and table); value fields hold the encoded
value in the channel of the cell's semantic type. The twelve field names are the ones RelativeDB's
`relational-transformers` package uses, so a batch moves between the two unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

# Semantic types: which value channel, encoder and mask embedding a cell uses.
SEM_NUMBER, SEM_TEXT, SEM_DATETIME, SEM_BOOLEAN = 0, 1, 2, 3
SEMANTIC_TYPES: tuple[str, ...] = ("number", "text", "datetime", "boolean")
# A row points to at most this many parent rows (its foreign keys).
MAX_PARENTS = 5

INDEX_FIELDS = ("node_idxs", "f2p_nbr_idxs", "col_name_idxs", "table_name_idxs", "sem_types")
SCALAR_FIELDS = ("number_values", "datetime_values", "boolean_values")
EMBEDDING_FIELDS = ("text_values", "col_name_values")
BATCH_FIELDS: tuple[str, ...] = (
    "node_idxs",
    "f2p_nbr_idxs",
    "col_name_idxs",
    "table_name_idxs",
    "is_padding",
    "sem_types",
    "is_targets",
    "number_values",
    "datetime_values",
    "boolean_values",
    "text_values",
    "col_name_values",
)

# RelativeDB's short field names, accepted by from_mapping.
FIELD_ALIASES: dict[str, str] = {
    "f2p": "f2p_nbr_idxs",
    "col_idxs": "col_name_idxs",
    "table_idxs": "table_name_idxs",
    "is_target": "is_targets",
    "number_v": "number_values",
    "datetime_v": "datetime_values",
    "boolean_v": "boolean_values",
    "text_v": "text_values",
    "col_name_v": "col_name_values",
}


@dataclass
class RelationalBatch:
    """B contexts of S cells. Shapes: [B, S] for indices and masks, [B, S, MAX_PARENTS] for
    `f2p_nbr_idxs` (-1 where a row has fewer parents), [B, S, 1] for the scalar channels and
    [B, S, d_text] for the two embedding channels. Masks are True for padding and for targets."""

    node_idxs: Tensor
    f2p_nbr_idxs: Tensor
    col_name_idxs: Tensor
    table_name_idxs: Tensor
    is_padding: Tensor
    sem_types: Tensor
    is_targets: Tensor
    number_values: Tensor
    datetime_values: Tensor
    boolean_values: Tensor
    text_values: Tensor
    col_name_values: Tensor

    def __post_init__(self) -> None:
        for name in BATCH_FIELDS:
            value = torch.as_tensor(getattr(self, name))
            if name in INDEX_FIELDS:
                value = value.to(torch.int64)
            elif name in ("is_padding", "is_targets"):
                value = value.to(torch.bool)
            else:
                if name in SCALAR_FIELDS and value.ndim == 2:
                    value = value.unsqueeze(-1)
                if not value.is_floating_point():
                    value = value.float()
            setattr(self, name, value)
        self._check()

    def _check(self) -> None:
        """Refuse a batch whose tensors disagree on their shapes or hold values out of range."""
        self._check_shapes()
        self._check_values()

    def validate(self) -> RelationalBatch:
        """The checks construction runs (shapes, semantic types, targets, finite values), again:
        for a batch whose tensors were changed in place. ValueError names the field."""
        self._check()
        return self

    def ablate(self, cells: Sequence[int]) -> RelationalBatch:
        """A copy with the cells at these positions (in every context) turned to padding, to see
        what they contribute. Positions stay where they are, so row and parent indices still hold;
        a target cell cannot be ablated."""
        positions = list(cells)
        if bool(self.is_targets[:, positions].any()):
            raise ValueError(f"cells: {positions} include a target cell, which cannot be ablated")
        fields = self.as_dict()
        fields["is_padding"] = self.is_padding.clone()
        fields["is_padding"][:, positions] = True
        return RelationalBatch(**fields)

    def _check_shapes(self) -> None:
        """Every field's shape against node_idxs' [batch, cells]."""
        if self.node_idxs.ndim != 2:
            raise ValueError("node_idxs must have shape [batch, cells]")
        b, s = self.node_idxs.shape
        for name in ("col_name_idxs", "table_name_idxs", "is_padding", "sem_types", "is_targets"):
            if tuple(getattr(self, name).shape) != (b, s):
                raise ValueError(f"{name} must have shape {(b, s)}")
        if tuple(self.f2p_nbr_idxs.shape) != (b, s, MAX_PARENTS):
            raise ValueError(f"f2p_nbr_idxs must have shape {(b, s, MAX_PARENTS)}")
        for name in SCALAR_FIELDS:
            if tuple(getattr(self, name).shape) != (b, s, 1):
                raise ValueError(f"{name} must have shape {(b, s, 1)}")
        if self.text_values.ndim != 3 or tuple(self.text_values.shape[:2]) != (b, s):
            raise ValueError("text_values must have shape [batch, cells, d_text]")
        if self.col_name_values.shape != self.text_values.shape:
            raise ValueError("col_name_values must have the shape of text_values")

    def _check_values(self) -> None:
        """Semantic types in range, no padding cell as a target, finite channels."""
        if bool(((self.sem_types < 0) | (self.sem_types > SEM_BOOLEAN)).any()):
            raise ValueError(f"sem_types must be from 0 to {SEM_BOOLEAN}")
        if bool((self.is_targets & self.is_padding).any()):
            raise ValueError("is_targets: a padding cell cannot be a target")
        for name in (*SCALAR_FIELDS, *EMBEDDING_FIELDS):
            if not _all_finite(getattr(self, name)):
                raise ValueError(f"{name} must be finite")

    @property
    def batch_size(self) -> int:
        return int(self.node_idxs.shape[0])

    @property
    def sequence_length(self) -> int:
        return int(self.node_idxs.shape[1])

    @property
    def d_text(self) -> int:
        return int(self.text_values.shape[-1])

    def to(self, device: str | torch.device, dtype: torch.dtype | None = None) -> RelationalBatch:
        """A copy on `device`; `dtype` casts the floating-point channels."""
        moved: dict[str, Tensor] = {}
        for name in BATCH_FIELDS:
            value = getattr(self, name).to(device)
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
            moved[name] = value
        return RelationalBatch(**moved)

    def as_dict(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in BATCH_FIELDS}

    def numpy(self) -> dict[str, np.ndarray]:
        return {
            name: getattr(self, name).detach().cpu().float().numpy()
            if getattr(self, name).is_floating_point()
            else getattr(self, name).detach().cpu().numpy()
            for name in BATCH_FIELDS
        }

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RelationalBatch:
        """From a mapping of the twelve fields (arrays, tensors or nested lists); RelativeDB's short
        names (`f2p`, `col_idxs`, `number_v`, ...) stand for the long ones."""
        named = {FIELD_ALIASES.get(name, name): value for name, value in values.items()}
        missing = [name for name in BATCH_FIELDS if name not in named]
        if missing:
            raise ValueError("a relational batch needs the fields: " + ", ".join(missing))
        return cls(**{name: named[name] for name in BATCH_FIELDS})

    @classmethod
    def from_text_cells(
        cls,
        cells: np.ndarray | Tensor,
        *,
        target: int | Sequence[int],
        node_idxs: Sequence[int] | None = None,
        parents: Mapping[int, Sequence[int]] | None = None,
        table_idxs: Sequence[int] | None = None,
    ) -> RelationalBatch:
        """One context of text cells from an array [S, 2*d_text]: each row is a column-name
        embedding followed by a value embedding. Every cell is its own column; `node_idxs` groups
        cells into rows (default: all one row), `parents` maps a cell to its row's parent rows and
        `table_idxs` gives each cell's table (default 0). `target`: the cell(s) to predict."""
        array = torch.as_tensor(cells, dtype=torch.float32)
        if array.ndim != 2 or array.shape[1] % 2:
            raise ValueError(f"cells must have shape [cells, 2*d_text], got {tuple(array.shape)}")
        count, d_text = int(array.shape[0]), int(array.shape[1]) // 2
        chosen = [target] if isinstance(target, int) else list(target)
        if not all(0 <= cell < count for cell in chosen):
            raise ValueError(f"target: cell positions must be from 0 to {count - 1}, got {chosen}")
        parent_rows = torch.full((1, count, MAX_PARENTS), -1, dtype=torch.int64)
        for cell, rows in (parents or {}).items():
            listed = list(rows)
            if len(listed) > MAX_PARENTS:
                raise ValueError(f"parents: cell {cell} has {len(listed)} parents, at most {MAX_PARENTS}")
            parent_rows[0, cell, : len(listed)] = torch.as_tensor(listed, dtype=torch.int64)
        is_targets = torch.zeros((1, count), dtype=torch.bool)
        is_targets[0, chosen] = True
        nothing = torch.zeros((1, count, 1))
        return cls(
            node_idxs=torch.as_tensor(list(node_idxs) if node_idxs is not None else [0] * count).view(
                1, count
            ),
            f2p_nbr_idxs=parent_rows,
            col_name_idxs=torch.arange(count).view(1, count),
            table_name_idxs=torch.as_tensor(list(table_idxs) if table_idxs is not None else [0] * count).view(
                1, count
            ),
            is_padding=torch.zeros((1, count), dtype=torch.bool),
            sem_types=torch.full((1, count), SEM_TEXT),
            is_targets=is_targets,
            number_values=nothing,
            datetime_values=nothing.clone(),
            boolean_values=nothing.clone(),
            text_values=array[:, d_text:].reshape(1, count, d_text),
            col_name_values=array[:, :d_text].reshape(1, count, d_text),
        )


def _all_finite(value: Tensor) -> bool:
    # On the CPU numpy checks in one thread: torch's threaded kernels stall on a busy machine, and a
    # batch is checked for every context sampled.
    if value.device.type == "cpu" and value.dtype in (torch.float32, torch.float64, torch.float16):
        array = value.detach().numpy()
        with np.errstate(over="ignore", invalid="ignore"):
            return bool(np.isfinite(array.sum())) or bool(np.isfinite(array).all())
    return bool(torch.isfinite(value).all())


class LookedUpBatch(RelationalBatch):
    """A RelationalBatch whose two embedding channels are rows of shared tables, gathered when
    read. A sampled context then holds one index a cell per channel instead of 2 x d_text floats
    (3 MB for 1024 cells at d_text 384), and `collate` gathers a whole batch at once. Each table's
    last row is zeros: the row of padding and of a cell without text.

    Built from tensors the producer guarantees (the context sampler): the constructor neither
    converts nor checks them, as RelationalBatch's does; `validate()` runs the checks."""

    def __init__(
        self,
        fields: Mapping[str, Tensor],
        *,
        text_rows: Tensor,
        text_table: Tensor,
        col_name_rows: Tensor,
        col_name_table: Tensor,
    ) -> None:
        for name in BATCH_FIELDS:
            if name not in EMBEDDING_FIELDS:
                setattr(self, name, fields[name])
        self.text_rows, self.text_table = text_rows, text_table
        self.col_name_rows, self.col_name_table = col_name_rows, col_name_table

    @property
    def text_values(self) -> Tensor:  # type: ignore[override]
        return self.text_table[self.text_rows]

    @property
    def col_name_values(self) -> Tensor:  # type: ignore[override]
        return self.col_name_table[self.col_name_rows]

    @property
    def d_text(self) -> int:  # (from the table: no gather)
        return int(self.text_table.shape[-1])


def collate(batches: Sequence[RelationalBatch]) -> RelationalBatch:
    """Stack contexts into one batch, padding each to the longest (padding cells have no parents)."""
    if not batches:
        raise ValueError("collate needs at least one context")
    widths = {batch.d_text for batch in batches}
    if len(widths) != 1:
        raise ValueError(f"every context must have the same d_text, got {sorted(widths)}")
    longest = max(batch.sequence_length for batch in batches)
    shared = _shared_tables(batches)
    stacked: dict[str, Tensor] = {}
    for name in BATCH_FIELDS:
        if shared is not None and name in EMBEDDING_FIELDS:
            continue
        fill = -1 if name == "f2p_nbr_idxs" else (1 if name == "is_padding" else 0)
        stacked[name] = _padded([getattr(batch, name) for batch in batches], longest, fill)
    if shared is not None:  # one gather per channel for the whole batch; padding takes the zero row
        text_table, col_name_table = shared
        looked_up = [batch for batch in batches if isinstance(batch, LookedUpBatch)]
        text_rows = _padded([b.text_rows for b in looked_up], longest, len(text_table) - 1)
        col_name_rows = _padded([b.col_name_rows for b in looked_up], longest, len(col_name_table) - 1)
        stacked["text_values"] = text_table[text_rows]
        stacked["col_name_values"] = col_name_table[col_name_rows]
    return RelationalBatch(**stacked)


def _shared_tables(batches: Sequence[RelationalBatch]) -> tuple[Tensor, Tensor] | None:
    """The embedding tables of the batches when every one is a LookedUpBatch over the same two."""
    first = batches[0]
    if not isinstance(first, LookedUpBatch):
        return None
    for batch in batches:
        if not (
            isinstance(batch, LookedUpBatch)
            and batch.text_table is first.text_table
            and batch.col_name_table is first.col_name_table
        ):
            return None
    return first.text_table, first.col_name_table


def _padded(tensors: Sequence[Tensor], longest: int, fill: int) -> Tensor:
    """The tensors ([1 or more, S, ...]) padded along the cells with `fill` to `longest`, stacked."""
    rows = []
    for tensor in tensors:
        missing = longest - int(tensor.shape[1])
        if missing:
            shape = list(tensor.shape)
            shape[1] = missing
            tensor = torch.cat([tensor, torch.full(shape, fill, dtype=tensor.dtype)], dim=1)
        rows.append(tensor)
    return torch.cat(rows, dim=0)
