"""Module containers that say what they hold.

Iterating a plain nn.ModuleList or indexing an nn.ModuleDict gives a type checker a bare Module,
whose attributes (a decoder layer's `self_attn`, a Linear's `weight`) it cannot know. These are the
same containers, with the same modules and state-dict keys, typed by what they hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar, cast

from torch import nn

M = TypeVar("M", bound=nn.Module)


class ModuleSequence(nn.ModuleList, Generic[M]):
    """An nn.ModuleList of one kind of module."""

    def __init__(self, modules: Iterable[M]) -> None:
        super().__init__(modules)

    def __iter__(self) -> Iterator[M]:
        return cast(Iterator[M], super().__iter__())


class ModuleMapping(nn.ModuleDict, Generic[M]):
    """An nn.ModuleDict of one kind of module."""

    def __init__(self, modules: Mapping[str, M]) -> None:
        super().__init__(modules)

    def __getitem__(self, key: str) -> M:
        return cast(M, super().__getitem__(key))

    def values(self) -> Iterable[M]:  # type: ignore[override]  # nn.ModuleDict's says Iterable[Module]
        return cast(Iterable[M], super().values())
