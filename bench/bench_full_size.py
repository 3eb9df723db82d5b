"""The full-size pi05 (3.35 B weights, fp32) end to end on this machine's CPU, from a checkpoint lerobot
0.6.1 wrote, through `relay local train` and through a job on `relay server`:

    python bench/bench_full_size.py [--steps 3] [--work /tmp/relay-full-size] [--skip-server]

Not a test: it needs about 20 GB of memory and most of an hour, and lerobot, which needs Python 3.12
and its own torch (its environment is made on first use, as bench_lerobot_opens_output.py makes it).
Run it alone: it measures time and memory.

1. A v3.0 video dataset (`relay datasets synth`: two 224x224 cameras, 2-wide state and action) and a
   stand-in for PaliGemma's tokenizer in the same files (tokenizer.json, read by AutoTokenizer): a
   byte-level one, as PaliGemma's is gated on the Hub. RELAY_TOKENIZER_DIR names it.
2. lerobot writes a full-size pi05 with random weights for that robot, as a team's own checkpoint
   (bench/lerobot_full_size_side.py write): `PI05Policy.save_pretrained` and its processors.
3. `relay local train --model pi05 --from-checkpoint THAT --batch-size 1` (the default LoRA), with
   RELAY_ALLOW_CPU_FULL_SIZE=true; then the same recipe as a job on `relay server`. For each: seconds
   per step (from its metrics events: the mean of steps 1 to 10, the first of which reads the
   weights in from disk, and of the steps after the 10th), the training process's peak
   resident memory (sampled every 0.2 s) against the memory plan for the same recipe
   (relay.memory_plan.plan_of_recipe, as `relay models info pi05 --memory --device cpu` prints it),
   and the merged output's size.
4. lerobot loads the local run's output strictly (`PI05Policy.from_pretrained`) with its processors
   and samples a chunk with `predict_action_chunk` for one observation of the dataset and one noise;
   Relay samples the same observation from the same noise; the largest difference is printed, in
   the action's units and as a fraction of its q01-q99 range. Both in fp32.

Each side runs in its own process, one after the other, so that only one full-size model is in
memory at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_lerobot_opens_output import lerobot_python  # noqa: E402

CAMERAS = ("observation.images.top", "observation.images.wrist")
IMAGE_SIZE = 224
EPISODES = 8
PROMPT_SEED = 0
GIB = 1024**3


def write_stand_in_tokenizer(directory: Path) -> Path:
    """A byte-level tokenizer saved as PaliGemma's is (tokenizer.json + tokenizer_config.json):
    pad 0, eos 1, bos 2 (PaliGemma's ids), byte b -> b + 3, a bos before each text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if (directory / "tokenizer.json").is_file():
        return directory
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_of)
    vocab = {
        "<pad>": 0,
        "<eos>": 1,
        "<bos>": 2,
        **{symbol: index + 3 for index, symbol in enumerate(alphabet)},
    }
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )
    fast.save_pretrained(str(directory))
    return directory


def _byte_of(symbol: str) -> int:
    """The byte a ByteLevel symbol stands for (GPT-2's byte-to-unicode table, inverted)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {chr(b): b for b in printable}
    shifted = [b for b in range(256) if b not in printable]
    table.update({chr(256 + n): b for n, b in enumerate(shifted)})
    return table[symbol]


class PeakMemory:
    """The largest resident set of any one process in a tree (its root included), sampled every
    0.2 s, per phase: `phase` names the one going on (a run's training, then its output's writing).

    `peaks` counts every resident page; `private_peaks` only the process's own (anonymous) memory,
    without the pages of files it maps: weights read from a safetensors file in the dtype they are
    stored in stay pages of that file, which the kernel can drop and read again, and which count in
    the resident set only once touched (the whole embedding table, say, when the output is written)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.phase = "all"
        self.peaks: dict[str, int] = {}
        self.private_peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    @property
    def peak(self) -> int:
        return max(self.peaks.values(), default=0)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.root)
            except psutil.NoSuchProcess:
                return
            try:
                processes = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:  # one of them ended while they were listed: look again
                continue
            for process in processes:
                with contextlib.suppress(psutil.NoSuchProcess):
                    memory = process.memory_info()
                    private = memory.rss - memory.shared  # Linux: shared is file-backed and shmem pages
                    self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), memory.rss)
                    self.private_peaks[self.phase] = max(self.private_peaks.get(self.phase, 0), private)
            self._stop.wait(0.2)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def make_dataset(work: Path) -> Path:
    dataset = work / "dataset"
    if not (dataset / "meta" / "info.json").is_file():
        command = [
            sys.executable,
            "-m",
            "relay.cli",
            "datasets",
            "synth",
            str(dataset),
            "--episodes",
            str(EPISODES),
        ]
        command += ["--format", "v3.0", "--video"]
        for camera in CAMERAS:
            command += ["--camera", f"{camera}={IMAGE_SIZE}x{IMAGE_SIZE}"]
        subprocess.run(command, check=True)
    return dataset


def write_checkpoint(work: Path, dataset: Path, python: Path) -> dict[str, Any]:
    """lerobot's full-size pi05 for the dataset's robot, with the dataset's statistics."""
    checkpoint = work / "lerobot-checkpoint"
    report = work / "lerobot-checkpoint.json"
    if report.is_file() and (checkpoint / "model.safetensors").is_file():
        return {**json.loads(report.read_text()), "path": str(checkpoint)}
    stats = json.loads((dataset / "meta" / "stats.json").read_text())
    robot = {
        "cameras": {camera: [3, IMAGE_SIZE, IMAGE_SIZE] for camera in CAMERAS},
        "state_dim": len(stats["observation.state"]["mean"]),
        "action_dim": len(stats["action"]["mean"]),
        "stats": {
            key: {name: stats[key][name] for name in ("mean", "std", "min", "max", "q01", "q99")}
            for key in ("observation.state", "action")
        },
    }
    (work / "robot.json").write_text(json.dumps(robot))
    print("lerobot writes a full-size pi05 with random weights (minutes)", flush=True)
    command = [
        str(python),
        str(HERE / "lerobot_full_size_side.py"),
        "write",
        str(checkpoint),
        str(work / "robot.json"),
    ]
    done = run_watched(command, lerobot_environment())
    written = json.loads(done["stdout"].strip().splitlines()[-1])
    written |= {"peak_rss": done["peak_rss"], "size": (checkpoint / "model.safetensors").stat().st_size}
    report.write_text(json.dumps(written))
    return {**written, "path": str(checkpoint)}


def lerobot_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run_watched(
    command: list[str], environment: dict[str, str], phase_of: Callable[[str], str | None] | None = None
) -> dict[str, Any]:
    """Run a command, its stderr shown as it comes, and report its stdout, wall time and peak memory;
    `phase_of` reads each line of its stdout as it comes and names the phase that line starts."""
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=environment)
    watch = PeakMemory(process.pid)
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        phase = phase_of(line) if phase_of else None
        if phase:
            watch.phase = phase
    process.wait()
    peak = watch.stop()
    stdout = "".join(lines)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])}... exited {process.returncode}:\n{stdout[-3000:]}")
    return {
        "stdout": stdout,
        "seconds": time.monotonic() - started,
        "peak_rss": peak,
        "peaks": watch.peaks,
        "private_peaks": watch.private_peaks,
    }


def local_run_phase(line: str) -> str | None:
    """`relay local train --json`'s stage event before it writes the merged output."""
    if not line.startswith("{"):
        return None
    event = json.loads(line)
    return "writing" if event.get("event") == "stage" and event.get("stage") == "writing" else None


def planned_bytes(dataset: Path, checkpoint: str, steps: int) -> tuple[int, dict[str, Any]]:
    from relay.memory_plan import plan_of_recipe
    from relay.sft.config import SFTConfig

    config = SFTConfig(
        model="pi05", dataset_name=str(dataset), from_checkpoint=checkpoint, batch_size=1, steps=steps
    )
    plan = plan_of_recipe(config, device="cpu")
    assert plan is not None, "pi05 has a memory plan"
    return plan.total, plan.to_dict()


def step_seconds(metrics: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds a step over the first metrics window (steps 1 to 10: the first step reads the weights
    in from disk, as a cold run does) and over the last (the steps after 10: a warm step)."""
    seconds = {"first_window_seconds_per_step": 1.0 / metrics[0]["steps_per_second"]}
    if len(metrics) > 1:
        seconds["seconds_per_step"] = 1.0 / metrics[-1]["steps_per_second"]
    return seconds


def train_locally(
    work: Path, dataset: Path, checkpoint: str, steps: int, environment: dict[str, str]
) -> dict[str, Any]:
    output = work / "local-run"
    shutil.rmtree(output, ignore_errors=True)  # a run left there would be resumed, not measured
    command = [
        sys.executable,
        "-m",
        "relay.cli",
        "local",
        "train",
        "--model",
        "pi05",
        "--from-checkpoint",
        checkpoint,
    ]
    command += [
        "--dataset",
        str(dataset),
        "--steps",
        str(steps),
        "--batch-size",
        "1",
        "--output-dir",
        str(output),
    ]
    command += ["--checkpoint-every", str(steps), "--json"]
    print(f"relay local train: {steps} steps of the full size at batch 1 (minutes)", flush=True)
    done = run_watched(command, environment, local_run_phase)
    events = [json.loads(line) for line in done["stdout"].splitlines() if line.startswith("{")]
    metrics = [event for event in events if "steps_per_second" in event]
    return {
        **step_seconds(metrics),
        "wall_seconds": done["seconds"],
        "peak_rss": done["peak_rss"],
        # "all": from the start to the output's writing (loading, training); "writing": after.
        "peak_rss_training": done["peaks"].get("all", 0),
        "peak_rss_writing": done["peaks"].get("writing", 0),
        "peak_private_training": done["private_peaks"].get("all", 0),
        "peak_private_writing": done["private_peaks"].get("writing", 0),
        "output": str(output),
        "output_size": (output / "model.safetensors").stat().st_size,
    }


def wait_until_up(url: str, server: subprocess.Popen[bytes], seconds: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"relay server exited {server.returncode} before it answered")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"relay server did not answer {url} within {seconds:.0f} s")


def train_on_server(
    work: Path, dataset: Path, checkpoint: str, steps: int, environment: dict[str, str]
) -> dict[str, Any]:
    """The same recipe as a job on `relay server` (its API, SQLite, one training worker process)."""
    import relay.sft
    from relay import http_client
    from relay.sft.config import SFTConfig

    home = work / "relay-home"
    # A fresh data directory: the last run's jobs kept their outputs (14 GB each), and its client
    # file names its server until this one writes its own.
    shutil.rmtree(home, ignore_errors=True)
    port = 8765
    server_environment = {**environment, "RELAY_HOME": str(home)}
    print(f"relay server on port {port}, then a job of {steps} steps (minutes)", flush=True)
    server = subprocess.Popen(
        [sys.executable, "-m", "relay.cli", "server", "--port", str(port)],
        env=server_environment,
        stdout=subprocess.DEVNULL,
    )
    watch = PeakMemory(server.pid)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/healthz", server)
        os.environ["RELAY_HOME"] = str(home)
        client = http_client.default_client()
        config = SFTConfig(
            model="pi05", dataset_name=str(dataset), from_checkpoint=checkpoint, batch_size=1, steps=steps
        )
        job = relay.sft.train(config, client=client)
        started = time.monotonic()
        job.wait(timeout=3600)
        wall = time.monotonic() - started
        metrics = [event for event in job.events() if "steps_per_second" in event]
        output = Path(job.output_dir or "")
        return {
            "job": job.id,
            "status": job.status,
            **step_seconds(metrics),
            "wall_seconds": wall,
            "peak_rss": watch.stop(),
            "output_size": (output / "model.safetensors").stat().st_size,
        }
    finally:
        watch.stop()
        server.terminate()
        server.wait(timeout=60)


def relay_chunk(output: Path, dataset: Path, inputs: Path) -> None:
    """Relay's side of the comparison (run in its own process): one observation of the dataset and
    one seeded noise, sampled by the output; writes both, and Relay's un-normalized chunk, to
    `inputs` for lerobot's side."""
    import torch

    from relay_engine.acting import load_acting_policy, observation_sample, read_norm_stats, sample_chunks
    from relay_engine.datasets import open_dataset

    torch.manual_seed(0)
    policy, _, _ = load_acting_policy(str(output), "cpu")
    policy.eval()
    stats = read_norm_stats(output)
    opened = open_dataset(str(dataset))
    frame = opened[0]
    # The first frame's raw state (samples hold it normalized), read as lerobot's loaders would.
    table = pq.read_table(sorted((dataset / "data").rglob("*.parquet"))[0], columns=["observation.state"])
    state = np.asarray(table.column("observation.state")[0].as_py(), dtype=np.float32)
    features = {camera: feature for camera, feature in opened.camera_map.items()}
    images = {camera: np.asarray(image, dtype=np.uint8) for camera, image in frame["image"].items()}
    prompt = frame["prompt"]
    noise = torch.randn(
        (policy.config.action_horizon, policy.config.action_dim), generator=torch.Generator().manual_seed(0)
    )
    sample = observation_sample(images, state, prompt, stats)
    # Twice: the first call also reads in the weights the model maps from its file (lerobot's
    # side copies them all in while loading, so its one call is a warm one).
    seconds = []
    for _ in range(2):
        started = time.monotonic()
        chunk = sample_chunks(policy, [sample], [noise], num_steps=10)
        seconds.append(time.monotonic() - started)
    action_dim = len(stats.actions.mean)
    actions = stats.unnormalize_actions(chunk)[0][:, :action_dim]
    np.savez(
        inputs,
        cameras=json.dumps([features[camera] for camera in images]),
        **{f"image_{index}": image for index, image in enumerate(images.values())},
        state=state,
        prompt=prompt,
        noise=noise[None].numpy(),
        relay_actions=actions,
        action_range=(stats.actions.q99 - stats.actions.q01)[:action_dim],
        relay_sample_seconds=np.asarray(seconds),
    )


def compare_with_lerobot(
    work: Path, output: Path, dataset: Path, tokenizer: Path, python: Path
) -> dict[str, Any]:
    inputs = work / "chunk_inputs.npz"
    subprocess.run(
        [sys.executable, __file__, "--relay-chunk", str(output), str(dataset), str(inputs)], check=True
    )
    command = [
        str(python),
        str(HERE / "lerobot_full_size_side.py"),
        "chunk",
        str(output),
        str(inputs),
        str(tokenizer),
    ]
    print(
        "lerobot loads the output strictly and samples the same observation from the same noise", flush=True
    )
    done = run_watched(command, lerobot_environment())
    answer = json.loads(done["stdout"].strip().splitlines()[-1])
    saved = np.load(inputs)
    difference = np.abs(np.asarray(answer["actions"]) - saved["relay_actions"])
    return {
        "largest_difference": float(difference.max()),
        "largest_fraction_of_range": float((difference / saved["action_range"]).max()),
        "relay_first_sample_seconds": float(saved["relay_sample_seconds"][0]),
        "relay_sample_seconds": float(saved["relay_sample_seconds"][-1]),
        "lerobot_load_seconds": answer["load_seconds"],
        "lerobot_sample_seconds": answer["sample_seconds"],
    }


def measured_once(record: Path, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A stage's figures, measured and kept in `record`; a later run reuses them (delete the file to
    measure again), so that a failure in a later stage does not cost the hour again."""
    if record.is_file():
        print(f"reusing {record}", flush=True)
        return dict(json.loads(record.read_text()))
    figures = measure()
    record.write_text(json.dumps(figures))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=12, help="more than 10: the steps after the 10th are timed apart"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/relay-full-size"))
    parser.add_argument("--lerobot-python", default=None)
    parser.add_argument("--skip-server", action="store_true", help="only `relay local train`")
    parser.add_argument(
        "--relay-chunk", nargs=3, metavar=("OUTPUT", "DATASET", "INPUTS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.relay_chunk:
        relay_chunk(*(Path(part) for part in args.relay_chunk))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    python = lerobot_python(args.lerobot_python)
    dataset = make_dataset(args.work)
    tokenizer = write_stand_in_tokenizer(args.work / "tokenizer")
    checkpoint = write_checkpoint(args.work, dataset, python)
    environment = {**os.environ, "RELAY_ALLOW_CPU_FULL_SIZE": "true", "RELAY_TOKENIZER_DIR": str(tokenizer)}
    plan, plan_parts = planned_bytes(dataset, checkpoint["path"], args.steps)
    local = measured_once(
        args.work / "local.json",
        lambda: train_locally(args.work, dataset, checkpoint["path"], args.steps, environment),
    )
    server = (
        None
        if args.skip_server
        else measured_once(
            args.work / "server.json",
            lambda: train_on_server(args.work, dataset, checkpoint["path"], args.steps, environment),
        )
    )
    compared = compare_with_lerobot(args.work, Path(local["output"]), dataset, tokenizer, python)
    report = {
        "checkpoint": checkpoint,
        "plan": plan_parts,
        "local": local,
        "server": server,
        "lerobot": compared,
    }
    (args.work / "report.json").write_text(json.dumps(report, indent=2))
    print(
        f"lerobot's checkpoint: {checkpoint['weights'] / 1e9:.2f} B weights, "
        f"{checkpoint['size'] / 1e9:.1f} GB, written in "
        f"{checkpoint['build_seconds'] + checkpoint['save_seconds']:.0f} s, "
        f"peak {checkpoint['peak_rss'] / GIB:.1f} GiB"
    )
    print(f"memory plan (pi05, LoRA, batch 1, cpu): {plan / GIB:.2f} GiB")
    for name, run in (("relay local train", local), ("relay server job", server)):
        if run is None:
            continue
        print(
            f"{name}: {run.get('seconds_per_step', float('nan')):.1f} s a step after the 10th "
            f"({run['first_window_seconds_per_step']:.1f} s over the first 10), "
            f"{run['wall_seconds']:.0f} s in all, "
            f"peak {run['peak_rss'] / GIB:.2f} GiB ({run['peak_rss'] / plan:.2f}x the plan), "
            f"output {run['output_size'] / 1e9:.1f} GB"
        )
        if run.get("peak_rss_writing"):
            print(
                f"  resident while loading and training {run['peak_rss_training'] / GIB:.2f} GiB "
                f"({run['peak_private_training'] / GIB:.2f} GiB its own, the rest mapped files), "
                f"while writing the output {run['peak_rss_writing'] / GIB:.2f} GiB "
                f"({run['peak_private_writing'] / GIB:.2f} GiB its own)"
            )
    print(
        f"one chunk (10 denoising steps, batch 1): Relay {compared['relay_sample_seconds']:.1f} s "
        f"(its first {compared['relay_first_sample_seconds']:.1f} s), "
        f"lerobot {compared['lerobot_sample_seconds']:.1f} s (its strict load "
        f"{compared['lerobot_load_seconds']:.0f} s)"
    )
    print(
        "lerobot vs Relay, same observation and noise: largest difference "
        f"{compared['largest_difference']:.2e} "
        f"({compared['largest_fraction_of_range']:.2e} of the action's q01-q99 range)"
    )


if __name__ == "__main__":
    main()
