"""Benchmarks of the dataset layer (issue 2), measured in one run; prints figures and ratios.

1. Memory: peak RSS of a process that opens a large image dataset (validation, norm stats and the
   frame index build: a full pass over the parquet files) and then reads random samples through a
   DataLoader with 2 workers. Goal: under 2 GB for 5 GB of parquet.
2. Throughput: decoded samples/s (2 cameras at 224x224) through a torch DataLoader with 2 worker
   processes and torch's default collation, against decoding the same PNGs with 2 processes and
   nothing else (the bytes already in memory). Goal: ratio at least 0.7.
3. Statistics over 1,000,000 frames: what `relay datasets stats` runs (read and validate the
   numeric columns of every episode file, exact quantiles), against reading the state and action
   columns with pyarrow alone (`pyarrow.parquet.read_table` over the files). Goal: ratio at most 2.

4. Video (--video, instead of 1-3): steady samples/s on a LeRobot v3.0 dataset with two AV1 video
   cameras (libsvtav1, a keyframe every 2 frames: lerobot's encoder defaults), shuffled, batches
   of 8, DataLoader workers 0 and 2, in interleaved rounds, each measurement a fresh process
   (video_loaders.py): Relay's loader (frames decoded once into the frame index at the first
   open, whose time is reported too), Relay decoding per sample (RELAY_VIDEO_CACHE_MAX_BYTES=0,
   the path of a dataset too large for that), lerobot 0.6.1's LeRobotDataset + DataLoader as
   lerobot-train makes them (in lerobot's own environment: --lerobot-python), and the raw decode
   rate of the same mp4s (PyAV, every frame in order, one process per worker). Goals: Relay at
   least 2x lerobot, and at least 0.7 of the raw decode rate. Relay's loaders fit frames to
   pi05's 224x224 (--image-size), as a pi05 job does: its cache holds them at that size. Each
   loader's samples/s, peak memory (its process and its largest worker), and the disk taken.
   --video-case record640: lerobot-record's default cameras instead, three at 640x480 and 30 fps,
   the first dataset of a typical team: as recorded, its frames would outgrow the cache's default
   32 GiB from about 12,400 frames (7 minutes); at pi05's size they fit up to about 76,000 (42).

    python bench/bench_datasets.py                  # the full run: writes 5 GB of parquet
    python bench/bench_datasets.py --rss-gb 0.5     # quicker
    python bench/bench_datasets.py --video          # the video comparison (needs lerobot's venv)
    python bench/bench_datasets.py --video --video-case record640 --video-episodes 4 --video-length 60

Timings are medians of --repeats alternating runs; the machine is shared, so expect noise.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from datasets_make import CAMERAS, write_image_dataset, write_numeric_dataset
from PIL import Image

from relay_engine.datasets import dataset_norm_stats, open_dataset

GB = 1024**3
MB = 1024**2


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rss-gb", type=float, default=5.0, help="parquet size for the memory benchmark (0: skip)"
    )
    parser.add_argument("--rss-samples", type=int, default=4000, help="random samples read after opening it")
    parser.add_argument("--throughput-frames", type=int, default=1600)
    parser.add_argument("--stats-frames", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/relay-bench-datasets"))
    parser.add_argument("--keep", action="store_true", help="keep the generated datasets")
    parser.add_argument("--video", action="store_true", help="run the video comparison (4) instead")
    parser.add_argument("--video-episodes", type=int, default=20)
    parser.add_argument("--video-length", type=int, default=100, help="frames per episode")
    parser.add_argument("--video-size", default="224x224", help="each of the two cameras, HxW")
    parser.add_argument(
        "--video-case",
        choices=list(VIDEO_CASES),
        default="two224",
        help="two224: two cameras at --video-size, 10 fps; record640: lerobot-record's defaults, "
        "three cameras at 640x480, 30 fps",
    )
    parser.add_argument(
        "--image-size", type=int, default=224, help="the model's size Relay caches frames at (0: as recorded)"
    )
    parser.add_argument(
        "--lerobot-python",
        default=str(Path(__file__).resolve().parents[1] / ".venv-lerobot" / "bin" / "python"),
        help="a Python with lerobot[dataset]==0.6.1 (tests/fixtures/make_lerobot_datasets.py says how)",
    )
    args = parser.parse_args()
    if args.video:
        args.workdir.mkdir(parents=True, exist_ok=True)
        try:
            line = bench_video(args)
        finally:
            if not args.keep:
                shutil.rmtree(args.workdir, ignore_errors=True)
        print("\n== summary ==")
        print(line)
        return

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    results: list[str] = []
    try:
        if args.rss_gb > 0:
            results.append(bench_memory(args.workdir, args.rss_gb, args.rss_samples))
        results.append(bench_throughput(args.workdir, args.throughput_frames, args.repeats))
        results.append(bench_stats(args.workdir, args.stats_frames, args.repeats))
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    print("\n== summary ==")
    print("\n".join(results))


# -- 1. memory ---------------------------------------------------------------------------------------


def bench_memory(workdir: Path, gigabytes: float, samples: int) -> str:
    print(f"[memory] writing {gigabytes:g} GB of parquet (224x224 PNGs, 2 cameras) ...", flush=True)
    start = time.perf_counter()
    path = write_image_dataset(workdir / "large", target_bytes=int(gigabytes * GB), png_level=0)
    parquet_bytes = sum(p.stat().st_size for p in path.rglob("*.parquet"))
    print(f"[memory] wrote {parquet_bytes / GB:.2f} GB in {time.perf_counter() - start:.0f} s", flush=True)

    child = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("datasets_rss_child.py")),
            str(path),
            str(workdir / "cache-large"),
            str(samples),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    peak_sum = _sample_tree_rss(child)
    report = json.loads(child.communicate()[0])
    index_bytes = sum(p.stat().st_size for p in (workdir / "cache-large").rglob("*") if p.is_file())
    print(
        f"[memory] opened {report['frames']:,} frames in {report['open_s']:.0f} s (validation, stats, "
        f"frame index of {index_bytes / GB:.2f} GB), then read {report['samples']:,} random samples "
        f"in {report['iterate_s']:.0f} s"
    )
    main_peak = report["peak_rss_main"]
    worker_peak = report["peak_rss_largest_worker"]
    after_open = report["peak_rss_main_after_open"]
    line = (
        f"memory: {parquet_bytes / GB:.2f} GB of parquet: peak RSS main process {main_peak / MB:.0f} MB "
        f"(after opening: {after_open / MB:.0f} MB; getrusage, which keeps this bench's own peak "
        f"across the exec, says {report['peak_rss_main_getrusage'] / MB:.0f} MB), "
        f"largest worker {worker_peak / MB:.0f} MB, "
        f"all processes together {peak_sum / MB:.0f} MB (sampled every 0.2 s, shared pages counted "
        f"in each); goal < 2048 MB: {'met' if max(main_peak, worker_peak) < 2 * GB else 'MISSED'}"
    )
    print(line, flush=True)
    shutil.rmtree(path)
    shutil.rmtree(workdir / "cache-large")
    return line


def _sample_tree_rss(process: subprocess.Popen[str]) -> int:
    """The largest sum of RSS over a process and its descendants, sampled until it exits."""
    peak = 0

    def tree(pid: int) -> list[int]:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return [pid]
        return [pid, *(p for child in children for p in tree(int(child)))]

    def rss(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    while process.poll() is None:
        peak = max(peak, sum(rss(pid) for pid in tree(process.pid)))
        time.sleep(0.2)
    return peak


# -- 2. throughput ------------------------------------------------------------------------------------

_ENCODED: list[bytes] = []  # inherited by the forked decode processes


def _decode(bounds: tuple[int, int]) -> int:
    for encoded in _ENCODED[bounds[0] : bounds[1]]:
        np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"))
    return bounds[1] - bounds[0]


def bench_throughput(workdir: Path, frames: int, repeats: int) -> str:
    print(f"[throughput] writing {frames:,} frames of 2 cameras at 224x224 ...", flush=True)
    path = write_image_dataset(workdir / "throughput", frames=frames, episode_length=100)
    dataset = open_dataset(str(path), cache_dir=workdir / "cache")
    _ENCODED.clear()
    for parquet in sorted(path.rglob("*.parquet")):
        table = pq.read_table(parquet, columns=list(CAMERAS))
        for camera in CAMERAS:
            _ENCODED.extend(cell["bytes"] for cell in table.column(camera).to_pylist())
    order = np.random.default_rng(0).permutation(len(dataset)).tolist()
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=32, sampler=order, num_workers=2, persistent_workers=True
    )
    for _, _ in zip(range(4), loader, strict=False):  # start the workers, warm the page cache
        pass
    half = len(_ENCODED) // 2
    loader_rates, raw_rates = [], []
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_decode, [(0, 64), (64, 128)])
        for _ in range(repeats):
            start = time.perf_counter()
            samples = sum(len(batch["prompt"]) for batch in loader)
            loader_rates.append(samples / (time.perf_counter() - start))
            start = time.perf_counter()
            images = sum(pool.map(_decode, [(0, half), (half, len(_ENCODED))]))
            raw_rates.append(images / len(CAMERAS) / (time.perf_counter() - start))
    loader_rate, raw_rate = statistics.median(loader_rates), statistics.median(raw_rates)
    ratio = loader_rate / raw_rate
    line = (
        f"throughput: {loader_rate:.0f} samples/s through the DataLoader (2 workers) vs "
        f"{raw_rate:.0f} samples/s decoding the same PNGs (2 processes), 2 cameras at 224x224; "
        f"ratio {ratio:.2f}; goal >= 0.7: "
        f"{'met' if ratio >= 0.7 else 'MISSED'} (runs: loader {_fmt(loader_rates)}, raw {_fmt(raw_rates)})"
    )
    print(line, flush=True)
    return line


# -- 3. statistics -------------------------------------------------------------------------------------


def bench_stats(workdir: Path, frames: int, repeats: int) -> str:
    print(f"[stats] writing {frames:,} frames of 14-wide state and action ...", flush=True)
    path = write_numeric_dataset(workdir / "numeric", frames=frames)
    files = [str(p) for p in sorted(path.rglob("*.parquet"))]
    columns = ["observation.state", "action"]
    pq.read_table(files, columns=columns)  # warm the page cache for both
    relay_times, pyarrow_times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        table = pq.read_table(files, columns=columns)
        pyarrow_times.append(time.perf_counter() - start)
        assert table.num_rows == frames
        del table
        start = time.perf_counter()
        stats, source = dataset_norm_stats(str(path), cache_dir=workdir / "cache")
        relay_times.append(time.perf_counter() - start)
        assert source == "computed" and stats.state_dim == 14
    relay_s, pyarrow_s = statistics.median(relay_times), statistics.median(pyarrow_times)
    ratio = relay_s / pyarrow_s
    line = (
        f"stats: {frames:,} frames in {len(files):,} files: {relay_s:.2f} s (validate + exact quantiles) vs "
        f"{pyarrow_s:.2f} s reading the two columns with pyarrow; ratio {ratio:.2f}; goal <= 2: "
        f"{'met' if ratio <= 2 else 'MISSED'} "
        f"(runs: relay {_fmt(relay_times)}, pyarrow {_fmt(pyarrow_times)})"
    )
    print(line, flush=True)
    return line


# -- 4. video -----------------------------------------------------------------------------------------

VIDEO_LOADERS = ("relay", "relay-per-sample", "lerobot", "raw")


VIDEO_CASES = {
    # name: (cameras as {feature: (height, width)} or None for --video-size's two, fps)
    "two224": (None, 10),
    "record640": ({f"observation.images.{name}": (480, 640) for name in ("front", "wrist", "side")}, 30),
}


def bench_video(args: argparse.Namespace) -> str:
    from relay_engine.datasets import decoded_frames
    from relay_engine.datasets.synth import write_synthetic_dataset
    from relay_engine.models import image_fit

    root = args.workdir / f"video-v3-{args.video_case}"
    case_cameras, fps = VIDEO_CASES[args.video_case]
    if case_cameras is None:
        height, width = (int(side) for side in args.video_size.split("x"))
        case_cameras = {
            "observation.images.top": (height, width),
            "observation.images.wrist": (height, width),
        }
    cameras: dict[str, tuple[int, int]] = dict(case_cameras)
    described = f"{len(cameras)} AV1 cameras at " + ", ".join(
        sorted({f"{h}x{w}" for h, w in cameras.values()})
    )
    frames = args.video_episodes * args.video_length
    print(f"[video] writing {frames:,} frames at {fps} fps, {described} ...", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    write_synthetic_dataset(
        root,
        episodes=args.video_episodes,
        episode_length=args.video_length,
        cameras=cameras,
        fps=fps,
        format="v3.0",
        video=True,
        video_codec="av1",
    )
    mp4_bytes = sum(p.stat().st_size for p in root.rglob("*.mp4"))
    loaders = list(VIDEO_LOADERS)
    if not Path(args.lerobot_python).is_file():
        print(f"[video] no lerobot environment at {args.lerobot_python}: lerobot is left out", flush=True)
        loaders.remove("lerobot")
    fit = image_fit(args.image_size) if args.image_size else None
    # The first open: validation, the frame index and every video frame decoded into it (fitted to
    # the model's size, as a pi05 job's first open does).
    cache = args.workdir / "cache"
    start = time.perf_counter()
    dataset = open_dataset(str(root), cache_dir=cache, image_fit=fit)
    first_open_s = time.perf_counter() - start
    if not dataset._index.decoded:
        raise SystemExit(f"[video] the decoded frames do not fit {decoded_frames.LIMIT_VARIABLE} or the disk")
    decoded_dir = dataset._index.directory / decoded_frames.directory_name(fit)
    decoded_bytes = sum(p.stat().st_size for p in decoded_dir.glob("*.rgb"))
    recorded_bytes = decoded_frames.decoded_size(frames, cameras)
    index_bytes = sum(p.stat().st_size for p in dataset._index.directory.rglob("*") if p.is_file())
    os.environ["RELAY_VIDEO_CACHE_MAX_BYTES"] = "0"  # the per-sample loader's index: no decoded frames
    open_dataset(str(root), cache_dir=args.workdir / "cache-per-sample", image_fit=fit)
    del os.environ["RELAY_VIDEO_CACHE_MAX_BYTES"]
    size = f"at {fit.height}x{fit.width}" if fit else "as recorded"
    print(
        f"[video] first open: {first_open_s:.1f} s for {frames:,} frames x {len(cameras)} cameras; mp4s "
        f"{mp4_bytes / MB:.1f} MB, decoded frames {size} {decoded_bytes / MB:.0f} MB (as recorded they "
        f"would be {recorded_bytes / MB:.0f} MB; the whole index {index_bytes / MB:.0f} MB)",
        flush=True,
    )
    configs = [(loader, workers) for workers in (0, 2) for loader in loaders]
    results: dict[tuple[str, int], list[dict[str, Any]]] = {config: [] for config in configs}
    backend = ""
    rng = np.random.default_rng(0)
    for round_number in range(args.repeats):
        for position in rng.permutation(len(configs)).tolist():
            loader, workers = configs[position]
            result = _measure_video(args, root, loader, workers)
            backend = str(result.get("video_backend", backend))
            results[loader, workers].append(result)
            print(f"[video] round {round_number + 1} {loader:16} workers {workers}: "
                  f"{result['samples_per_s']:.1f} samples/s, peak RSS {result['peak_rss_mb']:.0f} MB "
                  f"(largest child {result['peak_child_rss_mb']:.0f} MB)", flush=True)  # fmt: skip
    rates = {config: [float(r["samples_per_s"]) for r in runs] for config, runs in results.items()}
    lines = [
        f"video ({args.video_case}): {frames:,} frames at {fps} fps, {described} (g=2, crf 30), v3.0, "
        f"shuffled, batches of 8, medians of {args.repeats} interleaved rounds; relay's samples hold "
        f"frames {size} (fitted once at open), the others' as recorded; first open (decoding every "
        f"frame into the index) {first_open_s:.1f} s; disk: mp4s {mp4_bytes / MB:.1f} MB, Relay's "
        f"decoded frames {decoded_bytes / MB:.0f} MB (as recorded: {recorded_bytes / MB:.0f} MB), "
        f"its whole index {index_bytes / MB:.0f} MB"
        + (f"; lerobot's video backend: {backend}" if backend else "")
    ]
    for workers in (0, 2):
        median = {loader: statistics.median(rates[loader, workers]) for loader in loaders}
        row = ", ".join(f"{loader} {median[loader]:.1f}" for loader in loaders)
        lines.append(f"  workers {workers}: samples/s {row}")
        memory = ", ".join(
            f"{loader} {statistics.median(r['peak_rss_mb'] for r in results[loader, workers]):.0f}"
            f" + {statistics.median(r['peak_child_rss_mb'] for r in results[loader, workers]):.0f}"
            for loader in loaders
        )
        lines.append(f"    peak RSS MB (process + largest worker): {memory}")
        for loader in ("relay", "relay-per-sample"):
            ratios = []
            if "lerobot" in median:
                vs_lerobot = _round_ratios(rates[loader, workers], rates["lerobot", workers])
                ratios.append(
                    f"÷ lerobot {vs_lerobot:.2f}x (goal >= 2: {'met' if vs_lerobot >= 2 else 'MISSED'})"
                )
            vs_raw = _round_ratios(rates[loader, workers], rates["raw", workers])
            ratios.append(f"÷ raw decode {vs_raw:.2f} (goal >= 0.7: {'met' if vs_raw >= 0.7 else 'MISSED'})")
            lines.append(f"    {loader}: " + ", ".join(ratios))
        if "lerobot" in median:
            vs_raw = _round_ratios(rates["lerobot", workers], rates["raw", workers])
            lines.append(f"    lerobot: ÷ raw decode {vs_raw:.2f}")
    line = "\n".join(lines)
    print(line, flush=True)
    return line


def _measure_video(args: argparse.Namespace, root: Path, loader: str, workers: int) -> dict[str, Any]:
    python = args.lerobot_python if loader == "lerobot" else sys.executable
    cache = args.workdir / ("cache-per-sample" if loader == "relay-per-sample" else "cache")
    command = [python, str(Path(__file__).with_name("video_loaders.py")), "--loader", loader]
    command += ["--root", str(root), "--cache", str(cache), "--workers", str(workers)]
    command += ["--image-size", str(args.image_size)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{loader} (workers {workers}) failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _round_ratios(numerator: list[float], denominator: list[float]) -> float:
    """The median over rounds of the ratio within each round."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in values)


if __name__ == "__main__":
    main()
