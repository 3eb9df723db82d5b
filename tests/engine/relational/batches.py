"""Hand-built RelationalBatches for the model tests: every field set, padding, several targets per
context and all four semantic types."""

from __future__ import annotations

import torch

from relay_engine.relational import MAX_PARENTS, RelationalBatch


def mixed_batch(
    *, d_text: int = 384, seed: int = 0, batch: int = 3, cells: int = 24
) -> dict[str, torch.Tensor]:
    """The twelve fields as tensors. Context b has cells - 4*b real cells (the rest padding), rows
    of four cells, each row pointing to up to two earlier rows, and targets in two rows."""
    g = torch.Generator().manual_seed(seed)
    node = torch.arange(cells).div(4, rounding_mode="floor").repeat(batch, 1)
    parents = torch.full((batch, cells, MAX_PARENTS), -1, dtype=torch.long)
    for cell in range(cells):
        row = cell // 4
        if row >= 1:
            parents[:, cell, 0] = row - 1
        if row >= 2:
            parents[:, cell, 1] = 0
    padding = torch.zeros(batch, cells, dtype=torch.bool)
    for b in range(batch):
        padding[b, cells - 4 * b :] = True
    targets = torch.zeros(batch, cells, dtype=torch.bool)
    targets[:, 1] = True
    targets[:, 6] = True  # a second target, in another row
    sem = torch.arange(cells).remainder(4).repeat(batch, 1)  # number, text, datetime, boolean
    fields = {
        "node_idxs": node,
        "f2p_nbr_idxs": parents,
        "col_name_idxs": torch.arange(cells).remainder(4).repeat(batch, 1),
        "table_name_idxs": (node >= 3).long(),
        "is_padding": padding,
        "sem_types": sem,
        "is_targets": targets,
        "number_values": torch.randn(batch, cells, 1, generator=g),
        "datetime_values": torch.randn(batch, cells, 1, generator=g),
        "boolean_values": torch.randint(0, 2, (batch, cells, 1), generator=g).float(),
        "text_values": torch.randn(batch, cells, d_text, generator=g),
        "col_name_values": torch.randn(batch, cells, d_text, generator=g),
    }
    return fields


def our_batch(**kwargs: int) -> RelationalBatch:
    return RelationalBatch(**mixed_batch(**kwargs))
