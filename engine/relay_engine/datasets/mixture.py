"""Several LeRobot datasets trained on together (a recipe's ``datasets``; relay.dataset_mixture).

`open_mixture` opens each dataset with its own camera map and revision, refuses datasets whose
state or action widths or frame rates differ from the first's (naming both), and normalizes every
one of them with the mixture's statistics: computed exactly over every frame of all the datasets
together, as if they were one dataset. lerobot 0.6.1 pools its datasets' own statistics instead
(`aggregate_stats`: a frame-weighted mean, a pooled variance, and each quantile as the
frame-weighted average of the datasets' own); the mean and standard deviation agree with ours, and
the quantiles are exact here, not an average of quantiles.

`WeightedFrames` is the training split of a mixture as one map-style dataset. An epoch holds as
many samples as the training frames of all the datasets; dataset i gives share_i of them (its
weight over the sum): its frames whole as many times as they fit, and a choice of the rest drawn
afresh each epoch from the seed and the epoch. The recipe's seeded order then shuffles the epoch,
so sampling follows the weights, every batch mixes the datasets, a dataset drawn at less than its
frames' share trains on all of its frames over the epochs, and a resumed run reads the same samples
as one that never stopped.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from relay.dataset_mixture import DatasetSource, sample_shares
from relay_engine.datasets.dataset import LeRobotDataset, open_dataset
from relay_engine.datasets.norm_stats import NormalizationMethod, NormStats, compute_norm_stats
from relay_engine.errors import ConfigError
from relay_engine.image_fit import ImageFit
from relay_engine.samples import Sample


@dataclass
class DatasetMixture:
    """The opened datasets of a mixture, normalized with its statistics, and each one's share of
    the samples. The first is the mixture's robot: its features and cameras describe the output."""

    parts: list[LeRobotDataset]
    shares: list[float]

    @property
    def first(self) -> LeRobotDataset:
        return self.parts[0]

    @property
    def norm_stats(self) -> NormStats:
        return self.first.norm_stats

    def use_norm_stats(self, stats: NormStats) -> None:
        """Normalize every dataset with `stats` (a checkpoint's, with normalization "checkpoint")."""
        for part in self.parts:
            part.norm_stats = stats


def open_mixture(
    sources: Sequence[DatasetSource],
    *,
    action_horizon: int,
    cache_dir: str | os.PathLike[str] | None = None,
    normalization: NormalizationMethod = "quantile",
    image_fit: ImageFit | None = None,
) -> DatasetMixture:
    """Open, check and normalize the datasets of a mixture (see the module); `image_fit` as
    `open_dataset`'s."""
    parts = [
        open_dataset(
            source.name,
            cameras=source.cameras,
            action_horizon=action_horizon,
            cache_dir=cache_dir,
            revision=source.revision,
            normalization=normalization,
            image_fit=image_fit,
        )
        for source in sources
    ]
    check_compatible(parts)
    stats = replace(mixture_norm_stats(parts), method=normalization)
    for part in parts:
        part.norm_stats = stats
    return DatasetMixture(parts, sample_shares([source.weight for source in sources]))


def check_compatible(parts: Sequence[LeRobotDataset]) -> None:
    """ConfigError naming two datasets whose state or action widths or frame rates differ: one
    model's chunks must mean the same joints over the same time in every one of them."""
    first = parts[0].summary
    for index, part in enumerate(parts[1:], start=1):
        other = part.summary
        for what, ours, theirs in (
            ("state", first.state_dim, other.state_dim),
            ("action", first.action_dim, other.action_dim),
        ):
            if ours != theirs:
                raise ConfigError(
                    f"bad datasets[{index}]: {part.name}'s {what} is {theirs} wide and {parts[0].name}'s "
                    f"(datasets[0]) is {ours}: a mixture's datasets share their state and action widths",
                    f"datasets[{index}]",
                )
        if abs(first.fps - other.fps) > 1e-6:
            raise ConfigError(
                f"bad datasets[{index}]: {part.name} records at {other.fps:g} fps and {parts[0].name} "
                f"(datasets[0]) at {first.fps:g}: a mixture's datasets share their frame rate (an action "
                "chunk spans the same time in each)",
                f"datasets[{index}]",
            )


def mixture_norm_stats(parts: Sequence[LeRobotDataset]) -> NormStats:
    """The statistics of every frame of all `parts` together (exact quantiles, as for one dataset)."""
    columns = [part.columns() for part in parts]
    state = np.concatenate([np.asarray(state, dtype=np.float64) for state, _ in columns])
    actions = np.concatenate([np.asarray(actions, dtype=np.float64) for _, actions in columns])
    return compute_norm_stats(state, actions)


def sample_counts(sizes: Sequence[int], shares: Sequence[float]) -> list[int]:
    """How many of an epoch's sum(sizes) samples each dataset gives: its share of them, rounded by
    largest remainders so they add up, at least one each."""
    total = sum(sizes)
    exact = [share * total for share in shares]
    counts = [max(1, int(value)) for value in exact]
    for index in sorted(range(len(exact)), key=lambda i: exact[i] - int(exact[i]), reverse=True):
        if sum(counts) >= total:
            break
        counts[index] += 1
    return counts


class WeightedFrames:
    """A mixture's training frames as one map-style dataset, and each epoch's draw from them at
    the shares (see the module): ``frames[k]`` is a Sample of one dataset (`part_of` and
    `frame_of` say which), and `epoch_samples(epoch)` the k's an epoch visits."""

    def __init__(self, mixture: DatasetMixture, training: Sequence[np.ndarray], seed: int) -> None:
        self.parts = mixture.parts
        self.seed = seed
        self.sizes = [len(frames) for frames in training]
        self.counts = sample_counts(self.sizes, mixture.shares)
        self.part_of = np.concatenate(
            [np.full(len(frames), index, dtype=np.int16) for index, frames in enumerate(training)]
        )
        self.frame_of = np.concatenate([np.asarray(frames, dtype=np.int64) for frames in training])
        self._starts = np.cumsum([0, *self.sizes])[:-1]

    def __len__(self) -> int:
        return len(self.frame_of)

    def __getitem__(self, index: int) -> Sample:
        return self.parts[int(self.part_of[index])][int(self.frame_of[index])]

    def epoch_samples(self, epoch: int) -> np.ndarray:
        """The indices `epoch` visits, as many as there are training frames: each dataset's frames
        whole as many times as its count holds them, and the rest drawn afresh for each epoch (from
        the seed and the epoch alone, so a resumed run draws the same), so a dataset at less than
        its frames' share trains on all of them over the epochs."""
        rng = np.random.default_rng([self.seed, epoch, _DRAW_STREAM])
        chosen = []
        for start, size, count in zip(self._starts, self.sizes, self.counts, strict=True):
            whole, rest = divmod(count, size)
            own = np.concatenate(
                [np.tile(np.arange(size), whole), np.sort(rng.choice(size, rest, replace=False))]
            )
            chosen.append(start + own)
        return np.concatenate(chosen)


# Keeps the epochs' draws apart from the seeded shuffle of the same (seed, epoch) (BatchOrder).
_DRAW_STREAM = 1
