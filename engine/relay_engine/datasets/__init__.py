"""LeRobot v2.1 datasets: fetch once, validate, normalize, serve samples with action chunks.

path = resolve_dataset("lerobot/pusht_image")           # Hub revision v2.1, or a local directory
ds = open_dataset("lerobot/pusht_image", action_horizon=10)
ds.summary, ds.norm_stats, ds.camera_map, len(ds), ds[i]  # ds[i] is a relay_engine.samples.Sample
"""

from relay_engine.datasets.dataset import (
    LeRobotDataset,
    dataset_norm_stats,
    map_cameras,
    open_dataset,
    shipped_norm_stats,
)
from relay_engine.datasets.hub import resolve_dataset
from relay_engine.datasets.norm_stats import NormStats, Stats, compute_norm_stats
from relay_engine.datasets.summary import DatasetSummary
from relay_engine.datasets.synth import write_synthetic_dataset
from relay_engine.datasets.validation import Inspection, inspect_dataset

__all__ = [
    "DatasetSummary",
    "Inspection",
    "LeRobotDataset",
    "NormStats",
    "Stats",
    "compute_norm_stats",
    "dataset_norm_stats",
    "inspect_dataset",
    "map_cameras",
    "open_dataset",
    "resolve_dataset",
    "shipped_norm_stats",
    "write_synthetic_dataset",
]
