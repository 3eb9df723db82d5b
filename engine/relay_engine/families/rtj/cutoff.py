"""The time before which a task's encoding statistics may be computed.

A context's values are z-scored with column statistics. If those statistics read rows from after
the validation cutoff, a huge value or a far-future date planted there would move every earlier
row's encoding: the future would leak into the past through the scale. So every statistic a
context uses comes from the rows that were known before the task's split cutoff:

- the cutoff is the earliest timestamp of the task's val split; with no val split, the latest train
  timestamp, and then rows at that instant count too (a train seed at that time sees them);
- a row of a table with a time column counts only if its time is before the cutoff (a row with no
  time is not known to be before it, so it does not count);
- every row of a table without a time column counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from relay_engine.families.rtj.database import TaskSpec, seconds


@dataclass(frozen=True)
class StatisticsCutoff:
    """Rows count towards statistics if their time is before `seconds` (or at it, if `inclusive`)."""

    seconds: float
    inclusive: bool
    source: str  # "val" (the earliest val timestamp) or "train" (the latest train timestamp)

    def counts(self, times: np.ndarray | None, num_rows: int) -> np.ndarray:
        """Per row, whether it counts: all `num_rows` rows of a table without times (`None`)."""
        if times is None:
            return np.ones(num_rows, dtype=bool)
        with np.errstate(invalid="ignore"):  # NaN times compare False: they do not count
            return times <= self.seconds if self.inclusive else times < self.seconds

    @property
    def isoformat(self) -> str:
        return datetime.fromtimestamp(self.seconds, UTC).isoformat()


def statistics_cutoff(splits: dict[str, pa.Table], spec: TaskSpec) -> StatisticsCutoff:
    """The cutoff of a task whose splits are `splits` (train required; val optional)."""
    if "val" in splits and splits["val"].num_rows:
        times = seconds(splits["val"].column(spec.time_column))
        if np.isfinite(times).any():
            return StatisticsCutoff(float(np.nanmin(times)), inclusive=False, source="val")
    times = seconds(splits["train"].column(spec.time_column))
    if not np.isfinite(times).any():
        # No known time at all: nothing can be placed before a cutoff, so none is drawn.
        return StatisticsCutoff(float("inf"), inclusive=True, source="train")
    return StatisticsCutoff(float(np.nanmax(times)), inclusive=True, source="train")
