"""The training client's pieces that need no service: the wire format, codecs, names and settings."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from relay import Codec
from relay.errors import ConfigError
from relay.training import types, wire
from relay.training.config import SessionConfig, check_name


def smooth_frame(height: int = 224, width: int = 224, seed: int = 0) -> np.ndarray:
    """A camera-like frame: gradients and a few flat shapes, not noise (which no codec compresses)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    frame = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (width + height)], -1)
    side = max(1, min(height, width) // 5)
    for _ in range(4):
        top, left = rng.integers(0, height - side + 1), rng.integers(0, width - side + 1)
        frame[top : top + side, left : left + side] = rng.integers(0, 255, 3)
    return frame.astype(np.uint8)


def test_arrays_and_values_come_back_exactly() -> None:
    message = {
        "op": "forward_backward",
        "datums": [
            {
                "observation": {
                    "image": {"base_0_rgb": smooth_frame(8, 8)},
                    "state": np.arange(5.0),
                    "prompt": "pick",
                },
                "actions": np.ones((10, 7), np.float32),
                "weight": 0.5,
            }
        ],
        "values": [None, True, 3, float("inf"), np.float32(2.5), np.zeros((0, 3), np.int64)],
        "strided": np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],
    }
    back = wire.decode(wire.encode(message))
    datum = back["datums"][0]
    np.testing.assert_array_equal(datum["observation"]["image"]["base_0_rgb"], smooth_frame(8, 8))
    assert datum["observation"]["state"].dtype == np.float64 and datum["observation"]["prompt"] == "pick"
    assert (
        datum["actions"].dtype == np.float32 and datum["actions"].shape == (10, 7) and datum["weight"] == 0.5
    )
    assert back["values"][:5] == [None, True, 3, float("inf"), 2.5] and back["values"][5].shape == (0, 3)
    np.testing.assert_array_equal(back["strided"], [[0, 2], [4, 6], [8, 10]])
    assert not back["strided"].flags.writeable  # shares the body
    assert wire.decode(wire.encode(message), writable=True)["strided"].flags.writeable


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{}", "must start with RLY1"),
        (b"RLY1\xff\x00\x00\x00{}", "shorter than its header says"),
        (b"RLY1\x02\x00\x00\x00{}", "the header is not valid"),
        (wire.encode({"a": np.zeros(3)})[:-1], "its header says"),
    ],
)
def test_a_broken_body_is_refused_saying_why(body: bytes, problem: str) -> None:
    with pytest.raises(wire.WireError, match=problem):
        wire.decode(body)


def test_jpeg_frames_are_smaller_and_close() -> None:
    frame = smooth_frame()
    lossless = wire.encode({"f": frame})
    jpeg = wire.encode({"f": wire.Jpeg(frame)})
    back = wire.decode(jpeg)["f"]
    assert back.shape == frame.shape and back.dtype == np.uint8
    assert len(jpeg) < len(lossless) / 3
    assert np.abs(back.astype(int) - frame).mean() < 2.0


def test_the_codec_chooses_how_frames_travel() -> None:
    datum = types.Datum(
        observation={
            "image": {"base_0_rgb": smooth_frame(), "left_wrist_0_rgb": np.zeros((4, 4))},
            "state": [0.1, 0.2],
            "prompt": "x",
        },
        actions=np.zeros((10, 2)),
    )
    jpeg = types.datum_message(0, datum, Codec.JPEG_Q95)["observation"]["image"]
    lossless = types.datum_message(0, datum, Codec.LOSSLESS)["observation"]["image"]
    assert isinstance(jpeg["base_0_rgb"], wire.Jpeg)
    assert isinstance(
        jpeg["left_wrist_0_rgb"], np.ndarray
    )  # not a (H, W, 3) uint8 frame: sent as is, checked there
    assert isinstance(lossless["base_0_rgb"], np.ndarray)


def test_a_datum_that_cannot_be_sent_is_named() -> None:
    with pytest.raises(types.DatumError, match="datum 1: observation must be a dict"):
        types.batch_message([types.Datum(observation={}), types.Datum(observation=None)], Codec.LOSSLESS)  # type: ignore[arg-type]
    with pytest.raises(types.DatumError, match="datum 0: image 'base_0_rgb' must be an array of numbers"):
        types.batch_message([types.Datum(observation={"image": {"base_0_rgb": "front.png"}})], Codec.LOSSLESS)
    with pytest.raises(types.DatumError, match=r"a batch must be a list of types\.Datum"):
        types.batch_message(types.Datum(observation={}), Codec.LOSSLESS)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["a/b", "../x", ".hidden", "", "x\\y", "tab\there", "x" * 129])
def test_names_with_a_slash_or_a_leading_dot_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="a name can't contain a slash or start with a dot"):
        check_name(name)


def test_good_names_pass() -> None:
    for name in ("step-1000", "best.v2", "run 3 (lr 1e-4)"):
        assert check_name(name) == name


def test_adam_params_defaults_and_rules() -> None:
    params = types.AdamParams(learning_rate=1e-4)
    assert params.to_dict() == {
        "learning_rate": 1e-4,
        "beta1": 0.9,
        "beta2": 0.95,
        "eps": 1e-8,
        "weight_decay": 0.0,
        "grad_clip_norm": 1.0,
    }
    for field, value, rule in [
        ("learning_rate", -1, ">= 0"),
        ("beta1", 1.0, "below 1"),
        ("eps", 0, "greater than 0"),
        ("grad_clip_norm", float("nan"), ">= 0"),
        ("weight_decay", "0.1", ">= 0"),
    ]:
        with pytest.raises(ConfigError, match=f"bad {field}: .*{rule}"):
            types.AdamParams(**{"learning_rate": 1e-4, field: value})


def test_session_settings_spell_out_their_defaults() -> None:
    lora = SessionConfig(base_model="pi05")
    assert (lora.lora_rank, lora.lora_alpha, lora.targets, lora.action_horizon, lora.codec) == (
        32,
        32.0,
        ["action_expert.attn", "action_expert.mlp", "heads"],
        10,
        Codec.LOSSLESS,
    )
    assert SessionConfig(base_model="pi05", finetune="full").targets == ["all"]
    with pytest.raises(ConfigError, match=r"bad action_horizon: 0 \(must be an integer from 1 to 100\)"):
        SessionConfig(base_model="pi05", action_horizon=0)


def test_session_settings_read_the_former_names_rank_and_alpha() -> None:
    # Bodies sent and rows stored before the rename say rank/alpha; they mean lora_rank/lora_alpha.
    former = SessionConfig.parse({"base_model": "pi05", "rank": 8, "alpha": 4})
    assert (former.lora_rank, former.lora_alpha) == (8, 4.0)
    assert "rank" not in former.model_dump() and former.model_dump()["lora_rank"] == 8
    with pytest.raises(ConfigError, match=r"bad lora_rank: 0 \(must be an integer from 1 to 256\)"):
        SessionConfig.parse({"base_model": "pi05", "rank": 0})
    # Both spellings of one setting: refused, rather than one silently chosen.
    with pytest.raises(ConfigError, match="unknown field rank") as both:
        SessionConfig.parse({"base_model": "pi05", "rank": 8, "lora_rank": 16})
    assert both.value.param == "rank"


def test_import_relay_stays_light() -> None:
    code = (
        "import sys, relay, relay.training; from relay.training import ServiceClient, types; "
        "print(relay.Codec.LOSSLESS.value, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["lossless", "False"]


def test_a_custom_loss_without_torch_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from relay.training.client import _require_torch\n"
        "try:\n    _require_torch()\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert 'pip install "relay-intelligence[train]"' in out
