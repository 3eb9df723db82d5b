"""A v2.1 dataset written by hand with pyarrow, independently of Relay's writer and its defaults.

It follows conventions Relay's writer does not use, all seen in real v2.1 datasets: features listed
state-first, camera shapes as (C, H, W) with names saying so, `{"motors": [...]}` names,
variable-length `list<float>` vectors (the `datasets>=4` "List" spelling), one row group per file,
several chunks, an episode whose task changes midway. Three cameras of different sizes, 14-wide
state and action (an ALOHA-like robot), three tasks, episodes of uneven length.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

CAMERAS = {
    "observation.images.cam_high": (48, 64),
    "observation.images.cam_left_wrist": (40, 40),
    "observation.images.cam_right_wrist": (32, 48),
}
WIDTH = 14
FPS = 50
LENGTHS = (7, 23, 15, 40, 11)
TASKS = ("fold the towel", "open the drawer", "hand over the cup")
CHUNKS_SIZE = 2
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"


def frame_task(episode: int, frame: int) -> int:
    """Episode 3 switches task halfway; the others keep one."""
    if episode == 3 and frame >= LENGTHS[3] // 2:
        return 2
    return episode % len(TASKS)


def frame_state(episode: int, frame: int) -> np.ndarray:
    return (np.arange(WIDTH) * 0.1 + episode + frame * 0.01).astype(np.float32)


def frame_action(episode: int, frame: int) -> np.ndarray:
    return (-np.arange(WIDTH) * 0.2 + episode * 2 + frame * 0.05).astype(np.float32)


def _png(height: int, width: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    image = np.zeros((height, width, 3), dtype=np.uint8)
    image[:] = rng.integers(0, 255, size=3)
    image[: height // 2, : width // 3] = rng.integers(0, 255, size=3)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def write_handmade_dataset(root: Path) -> Path:
    features: dict[str, dict[str, object]] = {
        "observation.state": {
            "dtype": "float32",
            "shape": [WIDTH],
            "names": {"motors": [f"joint_{i}" for i in range(WIDTH)]},
        },
        "action": {
            "dtype": "float32",
            "shape": [WIDTH],
            "names": {"motors": [f"joint_{i}" for i in range(WIDTH)]},
        },
    }
    for camera, (height, width) in CAMERAS.items():
        features[camera] = {
            "dtype": "image",
            "shape": [3, height, width],
            "names": ["channels", "height", "width"],
        }
    for name, dtype in (
        ("timestamp", "float32"),
        ("frame_index", "int64"),
        ("episode_index", "int64"),
        ("index", "int64"),
        ("task_index", "int64"),
    ):
        features[name] = {"dtype": dtype, "shape": [1], "names": None}
    hf_features: dict[str, object] = {
        name: {"_type": "List", "feature": {"dtype": "float32", "_type": "Value"}}
        for name in ("observation.state", "action")
    }
    hf_features.update({camera: {"_type": "Image"} for camera in CAMERAS})
    hf_features.update(
        {
            name: {"dtype": features[name]["dtype"], "_type": "Value"}
            for name in ("timestamp", "frame_index", "episode_index", "index", "task_index")
        }
    )

    index = 0
    episodes = []
    for episode, length in enumerate(LENGTHS):
        frames = range(length)
        columns: dict[str, pa.Array] = {
            "observation.state": pa.array(
                [frame_state(episode, f).tolist() for f in frames], pa.list_(pa.float32())
            ),
            "action": pa.array([frame_action(episode, f).tolist() for f in frames], pa.list_(pa.float32())),
        }
        for c, (camera, (height, width)) in enumerate(CAMERAS.items()):
            columns[camera] = pa.array(
                [
                    {"bytes": _png(height, width, episode * 1000 + f * 10 + c), "path": f"frame_{f:06d}.png"}
                    for f in frames
                ],
                pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
            )
        columns["timestamp"] = pa.array(np.arange(length, dtype=np.float32) / FPS)
        columns["frame_index"] = pa.array(np.arange(length, dtype=np.int64))
        columns["episode_index"] = pa.array(np.full(length, episode, dtype=np.int64))
        columns["index"] = pa.array(np.arange(index, index + length, dtype=np.int64))
        columns["task_index"] = pa.array(np.array([frame_task(episode, f) for f in frames], dtype=np.int64))
        table = pa.table(columns).replace_schema_metadata(
            {"huggingface": json.dumps({"info": {"features": hf_features}})}
        )
        path = root / DATA_PATH.format(episode_chunk=episode // CHUNKS_SIZE, episode_index=episode)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        tasks = sorted({TASKS[frame_task(episode, f)] for f in frames})
        episodes.append({"episode_index": episode, "tasks": tasks, "length": length})
        index += length

    info = {
        "codebase_version": "v2.1",
        "robot_type": "aloha",
        "total_episodes": len(LENGTHS),
        "total_frames": index,
        "total_tasks": len(TASKS),
        "total_videos": 0,
        "total_chunks": (len(LENGTHS) - 1) // CHUNKS_SIZE + 1,
        "chunks_size": CHUNKS_SIZE,
        "fps": FPS,
        "splits": {"train": f"0:{len(LENGTHS)}"},
        "data_path": DATA_PATH,
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
        "features": features,
    }
    meta = root / "meta"
    meta.mkdir(parents=True)
    (meta / "info.json").write_text(json.dumps(info, indent=4))
    (meta / "tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(TASKS))
    )
    (meta / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return root
