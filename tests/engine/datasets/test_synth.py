"""The synthetic maker writes a real v2.1 dataset whose actions can only be predicted by looking."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from relay_engine.datasets import open_dataset
from relay_engine.envs.dot_world import COLOURS, GAIN
from tests.engine.datasets.conftest import SYNTH_CAMERAS


def test_it_writes_lerobots_v21_layout(synthetic: Path) -> None:
    info = json.loads((synthetic / "meta/info.json").read_text())
    assert info["codebase_version"] == "v2.1"
    assert list(info["features"])[:2] == list(SYNTH_CAMERAS)
    assert info["features"]["observation.images.top"] == {
        "dtype": "image",
        "shape": [32, 32, 3],
        "names": ["height", "width", "channel"],
    }
    assert info["total_frames"] == sum(
        json.loads(line)["length"] for line in (synthetic / "meta/episodes.jsonl").read_text().splitlines()
    )
    tasks = [json.loads(line) for line in (synthetic / "meta/tasks.jsonl").read_text().splitlines()]
    assert tasks == [
        {"task_index": 0, "task": "move to the red dot"},
        {"task_index": 1, "task": "move to the blue dot"},
    ]

    stats = [json.loads(line) for line in (synthetic / "meta/episodes_stats.jsonl").read_text().splitlines()]
    assert [s["episode_index"] for s in stats] == list(range(6))
    top = np.array(stats[0]["stats"]["observation.images.top"]["mean"])
    assert top.shape == (3, 1, 1) and ((top >= 0) & (top <= 1)).all()
    assert set(stats[0]["stats"]["action"]) == {"min", "max", "mean", "std", "count"}

    parquet = pq.ParquetFile(synthetic / "data/chunk-000/episode_000000.parquet")
    hf = json.loads(parquet.schema_arrow.metadata[b"huggingface"])["info"]["features"]
    assert hf["observation.images.top"] == {"_type": "Image"}
    assert hf["observation.state"] == {
        "feature": {"dtype": "float32", "_type": "Value"},
        "length": 2,
        "_type": "Sequence",
    }
    row = parquet.read().slice(0, 1).to_pylist()[0]
    assert row["observation.images.top"]["bytes"].startswith(b"\x89PNG")
    assert row["observation.images.top"]["path"] == "frame_000000.png"


def _target_seen(image: np.ndarray, colour: str) -> np.ndarray:
    """Plane coordinates of the centre of the dot of `colour` in a full view."""
    height, width, _ = image.shape
    rows, cols = np.nonzero((np.abs(image.astype(int) - COLOURS[colour]) <= 8).all(axis=-1))
    scale = 2.0 / min(height, width)
    return np.array([(cols.mean() + 0.5 - width / 2) * scale, (rows.mean() + 0.5 - height / 2) * scale])


def test_the_action_is_given_by_the_image_not_by_the_state(synthetic: Path, cache_dir: Path) -> None:
    dataset = open_dataset(str(synthetic), cache_dir=cache_dir)
    states, actions, seen = [], [], []
    for table in (pq.read_table(p) for p in sorted(synthetic.rglob("*.parquet"))):
        for row in table.to_pylist():
            image = np.asarray(Image.open(io.BytesIO(row["observation.images.top"]["bytes"])))
            colour = dataset.summary.tasks[row["task_index"]].split()[3]
            states.append(row["observation.state"])
            actions.append(row["action"])
            seen.append(_target_seen(image, colour))
    state, action, target = np.array(states), np.array(actions), np.array(seen)
    # Knowing where the dot of the task's colour is in the image gives the action...
    predicted = GAIN * (target - state)
    assert np.abs(predicted - action).max() < GAIN * 0.2
    # ...while the state alone explains little of it: a least-squares fit on the state leaves most of
    # each action dimension's variance unexplained.
    design = np.column_stack([state, np.ones(len(state))])
    residual = action - design @ np.linalg.lstsq(design, action, rcond=None)[0]
    assert (residual.var(axis=0) / action.var(axis=0)).min() > 0.5


def test_task_variants_change_what_the_cameras_see(tmp_path: Path) -> None:
    from relay_engine.datasets import write_synthetic_dataset
    from relay_engine.envs.dot_world import render

    path = write_synthetic_dataset(
        tmp_path / "variant", episodes=2, episode_length=4, colours=["orange"], distractors=2, seed=1
    )
    row = pq.read_table(sorted(path.rglob("*.parquet"))[0]).to_pylist()[0]
    image = np.asarray(Image.open(io.BytesIO(row["observation.images.top"]["bytes"]))).astype(int)
    shown = [c for c, rgb in COLOURS.items() if (np.abs(image - rgb) <= 8).all(axis=-1).sum() > 10]
    assert "orange" in shown and len(shown) == 3  # the target and two distractors
    assert json.loads((path / "meta/tasks.jsonl").read_text())["task"] == "move to the orange dot"

    # The top camera's placement: a shifted, zoomed view shows the dot elsewhere, and larger.
    rng = np.random.default_rng(0)
    dot, background = np.array([[0.3, 0.0]]), np.array([120, 120, 120])
    gripper = np.array([-0.8, 0.8])  # its ring out of the way of the dot
    plain = render((64, 64), gripper, dot, ["red"], background, wrist=False, noise=0, rng=rng)
    moved = render(
        (64, 64),
        gripper,
        dot,
        ["red"],
        background,
        wrist=False,
        noise=0,
        rng=rng,
        top_view=(0.3, 0.0, 2.0),
    )
    assert np.allclose(_target_seen(plain, "red"), [0.3, 0.0], atol=0.05)
    assert np.allclose(_target_seen(moved, "red"), [0.0, 0.0], atol=0.05)
    red = lambda image: (np.abs(image.astype(int) - COLOURS["red"]) <= 8).all(axis=-1).sum()  # noqa: E731
    assert red(moved) > 3 * red(plain)
