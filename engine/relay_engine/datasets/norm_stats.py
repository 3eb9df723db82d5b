"""Normalization statistics of states and actions, in openpi's `norm_stats.json` layout.

pi0.5 uses quantile normalization: `x' = (x - q01) / (q99 - q01 + 1e-6) * 2 - 1`, so the 1st
percentile maps to -1 and the 99th to +1 (no clipping); the inverse maps model actions back to
dataset units. Padding to the model's width of 32 happens after normalizing (the dataset does it).
SmolVLA, as lerobot's processor does, normalizes by the mean and standard deviation instead:
`x' = (x - mean) / (std + 1e-8)` (`NormStats.method` "mean_std").

Quantiles here are exact: numpy's linear interpolation (`np.quantile(..., method="linear")`) over
every frame of the dataset, computed per dimension in float64. openpi instead approximates them with
5000-bin histograms (its q01/q99 are a bin edge, within one bin width, (max - min) / 5000, of the
exact value); exact ones are as fast to get here because the columns fit in memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

EPSILON = 1e-6
# lerobot's NormalizerProcessorStep's eps, for mean/std normalization.
MEAN_STD_EPSILON = 1e-8
QUANTILES = (0.01, 0.99)
# How a model normalizes: openpi's quantiles (pi05) or lerobot's mean and standard deviation (SmolVLA).
NormalizationMethod = Literal["quantile", "mean_std"]
_FIELDS = ("mean", "std", "q01", "q99")


@dataclass(frozen=True)
class Stats:
    """Per-dimension statistics of one quantity (float64 arrays of its width)."""

    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray
    q99: np.ndarray

    @property
    def width(self) -> int:
        return len(self.q01)

    def normalize(self, values: np.ndarray, method: NormalizationMethod = "quantile") -> np.ndarray:
        values = np.asarray(values, dtype=np.float32)
        if method == "mean_std":
            std = (self.std + MEAN_STD_EPSILON).astype(np.float32)
            return ((values - self.mean.astype(np.float32)) / std).astype(np.float32)
        scale = (self.q99 - self.q01 + EPSILON).astype(np.float32)
        return ((values - self.q01.astype(np.float32)) / scale * 2 - 1).astype(np.float32)

    def unnormalize(self, values: np.ndarray, method: NormalizationMethod = "quantile") -> np.ndarray:
        values = np.asarray(values, dtype=np.float32)
        if method == "mean_std":
            std = (self.std + MEAN_STD_EPSILON).astype(np.float32)
            return (values * std + self.mean.astype(np.float32)).astype(np.float32)
        scale = (self.q99 - self.q01 + EPSILON).astype(np.float32)
        return ((values + 1) / 2 * scale + self.q01.astype(np.float32)).astype(np.float32)

    def to_dict(self) -> dict[str, list[float]]:
        return {name: getattr(self, name).tolist() for name in _FIELDS}


@dataclass(frozen=True)
class NormStats:
    state: Stats
    actions: Stats
    # Which of the statistics normalize (the model's choice; the file keeps all four either way).
    method: NormalizationMethod = "quantile"

    @property
    def state_dim(self) -> int:
        return self.state.width

    @property
    def action_dim(self) -> int:
        return self.actions.width

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """(..., state_dim) in dataset units -> normalized, float32, same shape."""
        _check_width(state, self.state_dim, "state")
        return self.state.normalize(state, self.method)

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """(..., action_dim) in dataset units -> normalized, float32, same shape."""
        _check_width(actions, self.action_dim, "actions")
        return self.actions.normalize(actions, self.method)

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Normalized (..., width >= action_dim) -> (..., action_dim) in dataset units.

        Columns past `action_dim` (the model's padding up to 32) are dropped.
        """
        actions = np.asarray(actions)
        if actions.shape[-1] < self.action_dim:
            raise ValueError(
                f"actions are {actions.shape[-1]} wide; the stats need at least {self.action_dim}"
            )
        return self.actions.unnormalize(actions[..., : self.action_dim], self.method)

    def to_json(self) -> str:
        """openpi's layout: {"norm_stats": {"state": {mean, std, q01, q99}, "actions": {...}}}, indent 2;
        a model normalized by mean and std says so beside it ("normalization": "mean_std")."""
        data: dict[str, Any] = {
            "norm_stats": {"state": self.state.to_dict(), "actions": self.actions.to_dict()}
        }
        if self.method != "quantile":
            data["normalization"] = self.method
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> NormStats:
        """Parse openpi's layout; ValueError naming the field for anything Relay cannot normalize with."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"not JSON: {error}") from None
        stats = data.get("norm_stats") if isinstance(data, dict) else None
        if not isinstance(stats, dict):
            raise ValueError('needs an object "norm_stats" with "state" and "actions"')
        method = data.get("normalization", "quantile")
        if method not in ("quantile", "mean_std"):
            raise ValueError(f'normalization must be "quantile" or "mean_std", got {json.dumps(method)}')
        return cls(state=_parse_stats(stats, "state"), actions=_parse_stats(stats, "actions"), method=method)


def compute_norm_stats(state: np.ndarray, actions: np.ndarray) -> NormStats:
    """Statistics of every frame's state (frames, state_dim) and action (frames, action_dim)."""
    return NormStats(state=_compute(state, "state"), actions=_compute(actions, "actions"))


def _compute(values: np.ndarray, name: str) -> Stats:
    values = np.asarray(values)
    if values.ndim != 2 or len(values) == 0:
        raise ValueError(f"{name} must be (frames, width) with at least one frame, got shape {values.shape}")
    width = values.shape[1]
    mean, std = np.empty(width), np.empty(width)
    low, high = np.empty(width), np.empty(width)
    # One dimension at a time: a contiguous float64 copy of one column keeps memory at a column's
    # size, and `np.quantile` partitions once for both quantiles.
    for d in range(width):
        column = values[:, d].astype(np.float64)
        mean[d] = column.mean()
        std[d] = column.std()
        low[d], high[d] = np.quantile(column, QUANTILES, method="linear")
    return Stats(mean=mean, std=std, q01=low, q99=high)


def _parse_stats(stats: dict[str, Any], name: str) -> Stats:
    entry = stats.get(name)
    if not isinstance(entry, dict):
        raise ValueError(f'norm_stats.{name} is missing; it needs "mean", "std", "q01" and "q99"')
    arrays: dict[str, np.ndarray] = {}
    for field in _FIELDS:
        value = entry.get(field)
        if value is None:
            raise ValueError(
                f"norm_stats.{name}.{field} is missing or null; Relay normalizes with "
                "the 1st and 99th percentiles (q01, q99) and keeps mean and std beside them"
            )
        try:
            array = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"norm_stats.{name}.{field} must be a list of numbers") from None
        if array.ndim != 1 or len(array) == 0 or not np.isfinite(array).all():
            raise ValueError(f"norm_stats.{name}.{field} must be a non-empty list of finite numbers")
        arrays[field] = array
    widths = {field: len(array) for field, array in arrays.items()}
    if len(set(widths.values())) != 1:
        raise ValueError(f"norm_stats.{name}: mean, std, q01 and q99 differ in length: {widths}")
    return Stats(**arrays)


def _check_width(values: np.ndarray, width: int, name: str) -> None:
    if np.shape(values)[-1] != width:
        raise ValueError(f"{name} are {np.shape(values)[-1]} wide; the stats are for {width}")


# Where a LeRobot v3.0 dataset keeps lerobot's statistics, and its names for the two quantities.
LEROBOT_STATS = "meta/stats.json"
_LEROBOT_KEYS = (("state", "observation.state"), ("actions", "action"))


def lerobot_quantile_gap(root: Path, stats: NormStats) -> float | None:
    """How far `meta/stats.json`'s q01/q99 (written by lerobot) are from the exact ones in `stats`:
    the largest difference over both quantities, dimensions and quantiles, as a fraction of the
    exact q01..q99 span (what normalization scales by). None if the dataset has no such file.

    Why Relay does not use them: lerobot estimates each episode's quantiles from a 5000-bin
    histogram and then averages them across episodes, which is exact for no dataset of more than
    one episode (an average of per-episode 1st percentiles is not the dataset's 1st percentile).
    """
    path = root / LEROBOT_STATS
    try:
        written = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    gap = 0.0
    found = False
    for field, key in _LEROBOT_KEYS:
        exact: Stats = getattr(stats, field)
        span = np.maximum(exact.q99 - exact.q01, EPSILON)
        for quantile in ("q01", "q99"):
            try:
                theirs = np.asarray(written[key][quantile], dtype=np.float64).reshape(-1)
            except (KeyError, TypeError, ValueError):
                continue
            if theirs.shape != (exact.width,):
                continue
            found = True
            gap = max(gap, float(np.max(np.abs(theirs - getattr(exact, quantile)) / span)))
    return gap if found else None
