"""Run by bench_datasets.py in its own process: open (index) a dataset, then read random samples
through a DataLoader with 2 workers. Prints JSON with timings and the processes' peak RSS.

    python bench/datasets_rss_child.py DATASET CACHE_DIR SAMPLES
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

from relay_engine.datasets import open_dataset


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM, which starts afresh at exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def main() -> None:
    dataset_path, cache_dir, samples = sys.argv[1], sys.argv[2], int(sys.argv[3])
    start = time.perf_counter()
    dataset = open_dataset(dataset_path, cache_dir=cache_dir)
    opened = time.perf_counter()
    peak_after_open = peak_rss_bytes()
    order = np.random.default_rng(0).permutation(len(dataset))[:samples].tolist()
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=order, num_workers=2)
    read = 0
    for batch in loader:
        read += len(batch["prompt"])
    del loader  # joins the workers, so that their peak RSS is counted below
    done = time.perf_counter()
    print(
        json.dumps(
            {
                "frames": len(dataset),
                "open_s": opened - start,
                "iterate_s": done - opened,
                "samples": read,
                "peak_rss_main_after_open": peak_after_open,
                "peak_rss_main": peak_rss_bytes(),
                # getrusage's figure for this process: it keeps the peak of the process that
                # started this one across exec (the bench's), so it can only be larger.
                "peak_rss_main_getrusage": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "peak_rss_largest_worker": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
