"""LeRobot v2.1 datasets: fetch once, validate, normalize, serve samples with action chunks.

path = resolve_dataset("lerobot/pusht_image")           # Hub revision v2.1 (else a v3.0 main), or a directory
source = locate_dataset("lerobot/pusht_image", revision="v2.1")  # its root, revision, commit sha, format
ds = open_dataset("lerobot/pusht_image", action_horizon=10)
ds.summary, ds.norm_stats, ds.camera_map, ds.source, len(ds), ds[i]  # ds[i] is a relay_engine.samples.Sample
describe_dataset("lerobot/pusht_image")                  # cameras, widths, episodes, format: meta files only
"""

from relay_engine.datasets.dataset import (
    LeRobotDataset,
    dataset_norm_stats,
    map_cameras,
    open_dataset,
    shipped_norm_stats,
)
from relay_engine.datasets.describe import describe_dataset
from relay_engine.datasets.hub import DatasetSource, locate_dataset, resolve_dataset
from relay_engine.datasets.norm_stats import NormStats, Stats, compute_norm_stats, lerobot_quantile_gap
from relay_engine.datasets.summary import DatasetSummary
from relay_engine.datasets.synth import write_synthetic_dataset
from relay_engine.datasets.validation import Inspection, inspect_dataset

__all__ = [
    "DatasetSource",
    "DatasetSummary",
    "Inspection",
    "LeRobotDataset",
    "NormStats",
    "Stats",
    "compute_norm_stats",
    "dataset_norm_stats",
    "describe_dataset",
    "inspect_dataset",
    "lerobot_quantile_gap",
    "locate_dataset",
    "map_cameras",
    "open_dataset",
    "resolve_dataset",
    "shipped_norm_stats",
    "write_synthetic_dataset",
]
