"""One measurement of bench_datasets.py --video, in a fresh process: steady samples/s of one loader
on a LeRobot video dataset. It runs in Relay's environment (--loader relay, raw) or in lerobot
0.6.1's own Python 3.12 environment (--loader lerobot), so it imports only what its loader needs.

    python video_loaders.py --loader relay|relay-per-sample|lerobot|raw --root DIR --workers N ...

Prints one JSON line: samples/s after the warm-up batches, the peak resident memory of the
process and of its largest worker (or decoding process), and what was measured.
- relay: `open_dataset` + torch DataLoader (shuffled): video frames decoded once into the frame
  index at the first open (the bench opens it once before timing), at the model's size
  (`--image-size`, pi05's fit; 0: as recorded), read with pread.
- relay-per-sample: the same with RELAY_VIDEO_CACHE_MAX_BYTES=0: each sample decodes its frames
  (the path of a dataset too large for the cache).
- lerobot: lerobot 0.6.1's `LeRobotDataset` as `lerobot-train` makes it (default video backend,
  `return_uint8=True`, a 10-step action chunk through `delta_timestamps`) + torch DataLoader.
- raw: PyAV decoding every frame of the dataset's mp4 files in order to RGB, one decoder per
  file, single-threaded, files split over `--workers` processes (at least 1), converting through
  one kept reformatter per file (as Relay does; `frame.to_ndarray(format="rgb24")` builds a new
  scaling context per frame, which costs more than the decoding): the decode rate of the same
  frames with nothing else, as samples/s (frames/s over the number of cameras).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

HORIZON = 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loader", choices=["relay", "relay-per-sample", "lerobot", "raw"], required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--cache", type=Path, help="Relay's cache directory")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=60, help="timed batches")
    parser.add_argument("--min-seconds", type=float, default=3.0, help="and at least this long")
    parser.add_argument("--warmup", type=int, default=5, help="batches before the clock starts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--image-size", type=int, default=0, help="Relay: cache frames fitted to pi05's NxN (0: as recorded)"
    )
    args = parser.parse_args()
    result = raw_decode(args.root, max(1, args.workers)) if args.loader == "raw" else loader_rate(args)
    # Peak resident set sizes: this process's (VmHWM: getrusage's would count the bench's process,
    # which it keeps across exec), and its largest child's once that has exited (the loader's
    # workers are shut down, the decoding pool joined, before this; Linux gives KiB).
    result["peak_rss_mb"] = peak_rss_kib() / 1024
    result["peak_child_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps(result), flush=True)


def peak_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def loader_rate(args: argparse.Namespace) -> dict[str, object]:
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    dataset: Any
    if args.loader == "lerobot":
        dataset, extra = lerobot_dataset(args.root)
    else:
        if args.loader == "relay-per-sample":
            os.environ["RELAY_VIDEO_CACHE_MAX_BYTES"] = "0"
        from relay_engine.datasets import open_dataset
        from relay_engine.models import image_fit

        fit = image_fit(args.image_size) if args.image_size else None
        dataset = open_dataset(str(args.root), cache_dir=args.cache, image_fit=fit)
        if bool(dataset._index.decoded) != (args.loader == "relay"):
            raise SystemExit(f"{args.loader}: the index at {args.cache} has the wrong kind of video frames")
        extra = {"decoded_in_index": sorted(dataset._index.decoded), "fit": fit.key if fit else None}
    loader: DataLoader[Any] = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        generator=torch.Generator().manual_seed(args.seed),
        persistent_workers=args.workers > 0,
        multiprocessing_context="fork" if args.workers > 0 else None,
    )
    batches = timed = 0
    started = 0.0

    def done() -> bool:
        return timed >= args.batches and time.perf_counter() - started >= args.min_seconds

    while not (batches > args.warmup and done()):
        for _ in loader:
            batches += 1
            if batches == args.warmup:
                started = time.perf_counter()
            elif batches > args.warmup:
                timed += 1
                if done():
                    break
    seconds = time.perf_counter() - started
    del loader  # its workers exit (and are waited for), so that their peak memory is counted
    return {
        "loader": args.loader,
        "workers": args.workers,
        "samples_per_s": timed * args.batch_size / seconds,
        "samples": timed * args.batch_size,
        "dataset_frames": len(dataset),
        **extra,
    }


def lerobot_dataset(root: Path) -> tuple[Any, dict[str, object]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata("relay/bench-video", root=root)
    dataset = LeRobotDataset(
        "relay/bench-video",
        root=root,
        delta_timestamps={"action": [step / meta.fps for step in range(HORIZON)]},
        return_uint8=True,
    )
    import lerobot

    return dataset, {"video_backend": dataset._video_backend, "lerobot": lerobot.__version__}


def _decode_files(paths: list[str]) -> int:
    import av
    from av.video.reformatter import VideoReformatter

    frames = 0
    for path in paths:
        with av.open(path) as container:
            stream = container.streams.video[0]
            stream.thread_type = "NONE"
            stream.codec_context.thread_count = 1
            reformatter = VideoReformatter()
            for frame in container.decode(stream):
                reformatter.reformat(frame, format="rgb24").to_ndarray()
                frames += 1
    return frames


def raw_decode(root: Path, processes: int) -> dict[str, object]:
    import multiprocessing

    info = json.loads((root / "meta" / "info.json").read_text())
    cameras = [name for name, feature in info["features"].items() if feature["dtype"] == "video"]
    files = sorted(str(path) for path in (root / "videos").rglob("*.mp4"))
    shares = [files[i::processes] for i in range(processes)]
    started = time.perf_counter()
    if processes == 1:
        frames = _decode_files(files)
    else:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            frames = sum(pool.map(_decode_files, shares))
    seconds = time.perf_counter() - started
    return {
        "loader": "raw",
        "workers": processes,
        "frames": frames,
        "frames_per_s": frames / seconds,
        "samples_per_s": frames / seconds / len(cameras),
    }


if __name__ == "__main__":
    main()
