"""Which samples each optimizer step reads, as a position that a checkpoint can record.

Every epoch visits the dataset in a fresh permutation drawn from (seed, epoch), so the order is a
pure function of the position: resuming from a checkpoint's position replays exactly the batches
an uninterrupted run would have read, with no sampler state to save.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import torch.utils.data


class MapDataset(Protocol):
    """What the loader reads: `len(ds)` samples and `ds[i]`. A LeRobotDataset (which is not a torch
    Dataset, so that reading datasets needs no torch), a torch Subset of one, a list of Samples."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


def select(dataset: MapDataset, indices: Sequence[int]) -> MapDataset:
    """The samples at `indices`, in that order (a torch Subset, which takes any map-style dataset)."""
    return torch.utils.data.Subset(cast("torch.utils.data.Dataset[Any]", dataset), indices)


# The dataset indices an epoch visits, before its shuffle (see BatchOrder).
EpochSamples = Callable[[int], np.ndarray]


@dataclass(frozen=True)
class DataPosition:
    epoch: int = 0
    offset: int = 0  # samples of this epoch's permutation already read

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    @classmethod
    def from_dict(cls, data: dict[str, int]) -> DataPosition:
        return cls(epoch=int(data["epoch"]), offset=int(data["offset"]))


class BatchOrder:
    """Batches of dataset indices from a position.

    With `span_epochs`, a batch that reaches an epoch's end continues into the next epoch, so every
    batch has `batch_size` samples (the recipe's fixed batch size). Without it, an epoch's last
    batch holds what is left (the local trainer's epochs).

    `epoch_samples(epoch)`, when given, says which dataset indices an epoch visits: `num_samples`
    of them, repeats allowed, a pure function of the epoch (a mixture's weighted draw). Without it
    an epoch visits every index once. Either way the epoch is then shuffled by (seed, epoch).
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        seed: int,
        *,
        span_epochs: bool,
        epoch_samples: EpochSamples | None = None,
    ) -> None:
        if num_samples <= 0:
            raise ValueError("the dataset has no samples")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.span_epochs = span_epochs
        self.epoch_samples = epoch_samples
        self._permutations: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        """The dataset indices of `epoch`, in the order it reads them."""
        if epoch not in self._permutations:
            shuffle = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
            if self.epoch_samples is not None:
                samples = self.epoch_samples(epoch)
                if len(samples) != self.num_samples:
                    raise ValueError(f"epoch {epoch} has {len(samples)} samples, not {self.num_samples}")
                shuffle = samples[shuffle]
            self._permutations = {epoch: shuffle}
        return self._permutations[epoch]

    def batches_per_epoch(self) -> int:
        """Batches in one epoch when batches don't span epochs."""
        return -(-self.num_samples // self.batch_size)

    def next_batch(self, position: DataPosition) -> tuple[list[int], DataPosition]:
        indices: list[int] = []
        epoch, offset = position.epoch, position.offset
        while len(indices) < self.batch_size:
            take = min(self.batch_size - len(indices), self.num_samples - offset)
            indices.extend(int(i) for i in self.permutation(epoch)[offset : offset + take])
            offset += take
            if offset == self.num_samples:
                epoch, offset = epoch + 1, 0
                if not self.span_epochs:
                    break
        return indices, DataPosition(epoch, offset)

    def batches(self, start: DataPosition) -> Iterator[list[int]]:
        position = start
        while True:
            indices, position = self.next_batch(position)
            yield indices


# Which [start, stop) of a batch of n samples this process reads (all of it when alone).
BatchPart = Callable[[int], tuple[int, int]]


class _BatchSampler(torch.utils.data.Sampler[list[int]]):
    """Feeds a BatchOrder to a DataLoader (which reads ahead, so positions are tracked by the caller)."""

    def __init__(self, order: BatchOrder, start: DataPosition, part: BatchPart | None) -> None:
        self.order = order
        self.start = start
        self.part = part

    def __iter__(self) -> Iterator[list[int]]:
        for indices in self.order.batches(self.start):
            if self.part is None:
                yield indices
            else:
                first, stop = self.part(len(indices))
                yield indices[first:stop]


def batch_loader(
    dataset: MapDataset,
    order: BatchOrder,
    start: DataPosition,
    collate: Callable[[Sequence[Any]], Any],
    num_workers: int,
    part: BatchPart | None = None,
) -> Iterator[Any]:
    """Collated batches from `start` on, decoded in `num_workers` processes (0: in this one).

    With `part`, only this process's part of each batch (one process of a distributed run).
    """
    loader = torch.utils.data.DataLoader(
        # DataLoader reads any map-style dataset; its annotation names the torch class.
        cast("torch.utils.data.Dataset[Any]", dataset),
        batch_sampler=_BatchSampler(order, start, part),
        collate_fn=collate,
        num_workers=num_workers,
        # Two batches in flight per worker keep the step fed without holding many images.
        prefetch_factor=2 if num_workers > 0 else None,
        persistent_workers=False,
    )
    return iter(loader)
