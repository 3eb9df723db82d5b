"""`relay datasets check | stats | synth` on real files."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from relay.checkpoints import checkpoint_model
from relay.cli import app
from relay.cli.datasets import OwnDataChecker
from relay.families import FamilySpec, forget_family_spec, register_family_spec
from relay_engine.datasets import NormStats, open_dataset
from tests.engine.datasets.conftest import edit_info, rewrite_episode

runner = CliRunner()


def relay(*args: str | Path) -> tuple[int, str]:
    result = runner.invoke(app, ["datasets", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_check_passes_a_dataset_made_by_hand(handmade: Path, cache_dir: Path) -> None:
    code, output = relay("check", handmade, "--cache-dir", cache_dir)
    assert code == 0, output
    assert "can be trained on" in output
    for expected in ("observation.images.cam_high", "48 x 64", "40 x 40", "32 x 48", "right_wrist_0_rgb"):
        assert expected in output
    assert "hand over the cup" in output
    assert "│ state width  │ 14" in output and "│ episodes     │ 5" in output


def test_stats_prints_and_writes_openpis_layout(handmade: Path, cache_dir: Path, tmp_path: Path) -> None:
    code, output = relay("stats", handmade, "--cache-dir", cache_dir)
    assert code == 0, output
    assert "computed over every frame; exact quantiles" in output
    code, output = relay("stats", handmade, "--json", "--cache-dir", cache_dir)
    assert code == 0
    printed = NormStats.from_json(output)
    assert (printed.state_dim, printed.action_dim) == (14, 14)
    target = tmp_path / "norm_stats.json"
    code, output = relay("stats", handmade, "--output", target, "--cache-dir", cache_dir)
    assert code == 0 and f"wrote {target}" in output.replace("\n", "")
    written = json.loads(target.read_text())
    assert written == json.loads(printed.to_json())
    assert set(written["norm_stats"]["actions"]) == {"mean", "std", "q01", "q99"}


def test_check_lists_every_problem_and_fails(broken: Path, cache_dir: Path) -> None:
    def change(info: dict) -> None:
        info["features"]["observation.images.wrist"]["dtype"] = "video"
        info["features"]["observation.state"]["shape"] = [40]

    edit_info(broken, change)
    code, output = relay("check", broken, "--cache-dir", cache_dir)
    assert code == 1
    assert "meta/info.json: video_path must be a template with {video_key} and {episode_index}" in output
    assert "meta/info.json: features.observation.state is 40 wide; at most 32 is supported" in output
    assert "Traceback" not in output


def test_check_names_an_unknown_camera(synthetic: Path, cache_dir: Path) -> None:
    code, output = relay(
        "check", synthetic, "--camera", "base_0_rgb=observation.images.side", "--cache-dir", cache_dir
    )
    assert code == 1
    assert "observation.images.side" in output and "its image features: observation.images.top" in output


def test_stats_of_a_broken_dataset_fails_cleanly(broken: Path, cache_dir: Path) -> None:
    (broken / "meta/tasks.jsonl").unlink()
    code, output = relay("stats", broken, "--cache-dir", cache_dir)
    assert code == 1
    assert f"error: dataset {broken}: meta/tasks.jsonl is missing" in output.replace("\n", "")


def test_synth_writes_what_it_is_asked_for(tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "made"
    code, output = relay(
        "synth", out, "--episodes", "3", "--length", "5-9", "--camera", "observation.images.a=16x24",
        "--camera", "observation.images.b=20x20", "--state-dim", "4", "--action-dim", "3", "--tasks", "2",
        "--fps", "15",
    )  # fmt: skip
    assert code == 0, output
    summary = open_dataset(str(out), cache_dir=cache_dir).summary
    assert summary.cameras == {"observation.images.a": (16, 24), "observation.images.b": (20, 20)}
    assert (summary.episodes, summary.state_dim, summary.action_dim, summary.fps) == (3, 4, 3, 15)
    assert 15 <= summary.frames <= 27 and len(summary.tasks) == 2
    code, output = relay("synth", out)
    assert code == 1 and "already exists and is not empty; add --overwrite to replace it" in output
    code, output = relay("synth", out, "--episodes", "2", "--colour", "orange", "--overwrite")
    assert code == 0, output
    assert open_dataset(str(out), cache_dir=cache_dir).summary.tasks == {0: "move to the orange dot"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--state-dim", "40"], "state_dim must be 2 to 32"),
        (["--length", "9-5"], "episode_length must be"),
        (["--colour", "teal"], "colours must be distinct names from: red, blue"),
    ],
)
def test_synth_refuses_bad_options(tmp_path: Path, args: list[str], message: str) -> None:
    code, output = relay("synth", tmp_path / "x", *args)
    assert code == 1 and message in output


def test_the_installed_command_runs(synthetic: Path, cache_dir: Path) -> None:
    command = Path(sys.executable).parent / "relay"
    result = subprocess.run(
        [str(command), "datasets", "check", str(synthetic), "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "can be trained on" in result.stdout


def test_check_decodes_every_image_and_names_a_truncated_one(broken: Path, cache_dir: Path) -> None:
    camera = next(
        name
        for name, feature in json.loads((broken / "meta/info.json").read_text())["features"].items()
        if feature.get("dtype") == "image"
    )

    def truncate_frame_3(table: pa.Table) -> pa.Table:
        images = table.column(camera).to_pylist()
        images[3] = {**images[3], "bytes": images[3]["bytes"][: len(images[3]["bytes"]) // 2]}
        column = pa.array(images, type=table.schema.field(camera).type)
        return table.set_column(table.schema.get_field_index(camera), camera, column)

    rewrite_episode(broken, 1, truncate_frame_3)
    code, output = relay("check", broken, "--quick", "--cache-dir", cache_dir)
    assert code == 0, output  # headers only: the broken frame goes unseen, as it did before
    code, output = relay("check", broken, "--cache-dir", cache_dir)
    assert code == 1, output
    assert f"episode 1, frame 3, camera {camera}: not a readable image" in output
    assert "can be trained on" not in output


def test_synth_makes_a_directory_with_the_umasks_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        code, output = relay("synth", tmp_path / "shared", "--episodes", "1", "--length", "3-3")
    finally:
        os.umask(old)
    assert code == 0, output
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o755  # not mkdtemp's 0700


# A family whose own kind of data is a `.points` file, checked by the checker its spec names.
POINTS_CHECKER = OwnDataChecker(
    check=lambda dataset, tasks_dir: print(f"{dataset}: points, checked"),
    stats=lambda dataset, tasks_dir, as_json: print(f"{dataset}: points, {'json' if as_json else 'table'}"),
)


def test_a_familys_own_data_is_checked_by_the_checker_its_spec_names(tmp_path: Path) -> None:
    spec = FamilySpec(
        name="points",
        models=("points-model",),
        recognizes_data=lambda name: name.endswith(".points"),
        data_checker=f"{__name__}:POINTS_CHECKER",
    )
    register_family_spec(spec)
    try:
        data = tmp_path / "shop.points"
        code, output = relay("check", data)
        assert (code, output.strip()) == (0, f"{data}: points, checked")
        code, output = relay("stats", data, "--json")
        assert (code, output.strip()) == (0, f"{data}: points, json")
        # A family that names no checker: a clear refusal, not a LeRobot reader's error.
        register_family_spec(dataclasses.replace(spec, data_checker=None))
        code, output = relay("check", data)
        assert code == 1 and "relay datasets cannot check points's data" in output
    finally:
        forget_family_spec(spec.name)


def test_a_bare_weights_file_is_read_as_the_model_its_family_claims(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert checkpoint_model(tmp_path) == "pi05"
    # One family at most claims bare weights: a second is refused where it registers.
    with pytest.raises(ValueError, match="bare weights files are already read as pi05's"):
        register_family_spec(FamilySpec(name="bare", models=("bare-model",), bare_weights_model="bare-model"))
    assert checkpoint_model(tmp_path) == "pi05"
