"""What `relay models info rt-j` reports: weights per part, in both checkpoint layouts."""

from __future__ import annotations

import dataclasses
from typing import Any

from relay_engine.families.rtj.network import NAMED_CONFIGS, RTJConfig, RTJNetwork


def _part_of(name: str) -> str:
    if name.startswith("blocks."):
        _, _, kind, *rest = name.split(".")
        return f"blocks.{kind}.{rest[0]}" if kind in ("attns", "norms") else f"blocks.{kind}"
    return name.split(".")[0]


def describe(config: RTJConfig, model: str) -> dict[str, Any]:
    """Parameter counts per part for the RelativeDB layout (with the boolean channel) and for
    Stanford's (without), built on the meta device."""
    relativedb = RTJNetwork(config, device="meta")
    stanford = RTJNetwork(dataclasses.replace(config, boolean_channel=False), device="meta")
    parts: dict[str, int] = {}
    for name, parameter in relativedb.named_parameters():
        parts[_part_of(name)] = parts.get(_part_of(name), 0) + parameter.numel()
    with_boolean = sum(p.numel() for p in relativedb.parameters())
    without = sum(p.numel() for p in stanford.parameters())
    boolean_parts = {
        name: p.numel()
        for name, p in relativedb.named_parameters()
        if ".boolean" in name or name.endswith("boolean")
    }
    return {
        "model": model,
        "sizes": config.to_dict(),
        "stanford_params": without,
        "relativedb_params": with_boolean,
        "boolean_channel_params": with_boolean - without,
        "boolean_channel": boolean_parts,
        "parts": parts,
    }


def describe_named(name: str) -> dict[str, Any]:
    return describe(NAMED_CONFIGS[name], name)
