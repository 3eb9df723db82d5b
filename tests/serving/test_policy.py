"""The engine's side of serving: observations refused with the field named, chunks in raw units
equal to the model's own sampler for the same seed, and batching that changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from relay_engine.errors import ConfigError, EngineError
from relay_engine.models import load_policy
from relay_engine.serving import Batcher, DecodedObservation, ServedPolicy, WireError, pack, unpack

from .conftest import STATS, image, observation, png_base64

# Chunks of the same observation and seed from different batch sizes differ only by float32
# rounding of batched matmuls, in raw units whose range here is up to 40.
BATCH_ATOL = 1e-4


@pytest.fixture(scope="module")
def served(model_dir: Path) -> ServedPolicy:
    return ServedPolicy.load(model_dir, device="cpu")


def _refusal(served: ServedPolicy, given: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        served.decode(given)
    assert caught.value.param is not None and str(caught.value).startswith(caught.value.param + ":")
    return caught.value


def test_bad_observations_are_refused_naming_the_field(served: ServedPolicy) -> None:
    good = observation(0)
    images = good["images"]
    cases: list[tuple[dict[str, Any], str, str]] = [
        (
            {**good, "images": {"top": images["top"]}},
            "observation.images.wrist",
            "missing camera",
        ),
        (
            {**good, "images": {**images, "cam_high": images["top"]}},
            "observation.images.cam_high",
            "unknown camera",
        ),
        ({**good, "state": [1.0, 2.0, 3.0]}, "observation.state", "has 3 numbers; this model's state has 2"),
        ({**good, "state": [1.0, float("nan")]}, "observation.state", "must be finite"),
        ({**good, "state": [float("inf"), 1.0]}, "observation.state", "must be finite"),
        ({**good, "state": ["a", 1.0]}, "observation.state", "flat list of numbers"),
        ({k: v for k, v in good.items() if k != "state"}, "observation.state", "missing"),
        (
            {**good, "images": {**images, "top": "bm90IGFuIGltYWdl"}},
            "observation.images.top",
            "not a readable PNG",
        ),
        ({**good, "images": {**images, "top": "%%%"}}, "observation.images.top", "not base64"),
        (
            {**good, "images": {**images, "top": images["top"].astype(np.float32)}},
            "observation.images.top",
            "dtype float32",
        ),
        (
            {**good, "images": {**images, "top": images["top"][..., :2]}},
            "observation.images.top",
            "shape (32, 32, 2)",
        ),
        ({**good, "prompt": 3}, "observation.prompt", "must be a string"),
        ({**good, "prompt": "x" * 5000}, "observation.prompt", "has 5,000 characters; at most 4,096"),
        (
            {**good, "images": {**images, "top": np.zeros((1, 5000 * 4000, 3), np.uint8)}},
            "observation.images.top",
            "at most 16,777,216 pixels",
        ),
        ({**good, "extra": 1}, "observation.extra", "unknown field"),
        (
            {**good, "images": {"top": images["top"], "base_0_rgb": images["top"], "wrist": images["wrist"]}},
            "observation.images.base_0_rgb",
            "the same camera as observation.images.top",
        ),
    ]
    for given, field, words in cases:
        error = _refusal(served, given)
        assert error.param == field and words in str(error), (field, str(error))


def test_cameras_go_by_feature_short_name_or_slot_and_png_equals_the_array(served: ServedPolicy) -> None:
    obs = observation(1)
    top, wrist = obs["images"]["top"], obs["images"]["wrist"]
    spellings = [
        {"observation.images.top": top, "observation.images.wrist": wrist},
        {"base_0_rgb": top, "left_wrist_0_rgb": wrist},
        {"top": png_base64(top), "wrist": png_base64(wrist)},
        {"top": top.transpose(2, 0, 1), "wrist": wrist},  # (3, H, W), as openpi's ALOHA clients send
    ]
    chunks = [served.act([served.decode({**obs, "images": images})], [5])[0].actions for images in spellings]
    for chunk in chunks[1:]:
        np.testing.assert_array_equal(chunk, chunks[0])


def test_a_seed_gives_the_models_own_chunk_in_raw_units(served: ServedPolicy, model_dir: Path) -> None:
    """The served chunk equals Pi05Policy.sample_actions on the same weights with noise from the
    same seed, un-normalized with the model's stats (within 1e-5 in raw units: the same float32
    operations, so in practice exactly equal)."""
    obs = observation(2)
    chunk = served.act([served.decode(obs)], [7])[0]
    again = served.act([served.decode(obs)], [7])[0]
    other = served.act([served.decode(obs)], [8])[0]
    np.testing.assert_array_equal(chunk.actions, again.actions)
    assert not np.allclose(chunk.actions, other.actions)
    assert chunk.actions.shape == (10, 2) and chunk.seed == 7

    policy = load_policy(str(model_dir))
    state = np.zeros(32, dtype=np.float32)
    state[:2] = STATS.normalize_state(np.asarray(obs["state"], dtype=np.float32))
    sample = {
        "image": {"base_0_rgb": obs["images"]["top"], "left_wrist_0_rgb": obs["images"]["wrist"]},
        "state": state,
        "state_dim": 2,
        "prompt": obs["prompt"],
    }
    with torch.inference_mode():
        normalized = policy.sample_actions(
            policy.collate([sample]),  # type: ignore[list-item]
            generator=torch.Generator().manual_seed(7),
        )
    expected = STATS.unnormalize_actions(normalized.numpy())[0]
    np.testing.assert_allclose(chunk.actions, expected, rtol=0, atol=1e-5)
    # Raw units: the second action column lives around 100 to 140, as the stats say.
    assert 60 < float(np.median(chunk.actions[:, 1])) < 180


def test_no_seed_draws_fresh_noise_and_says_which(served: ServedPolicy) -> None:
    decoded = served.decode(observation(3))
    first, second = served.act([decoded, decoded], [None, None])
    assert first.seed != second.seed
    assert not np.allclose(first.actions, second.actions)
    again = served.act([decoded], [first.seed])[0].actions
    np.testing.assert_allclose(again, first.actions, rtol=0, atol=BATCH_ATOL)  # batch of 1 vs 2


def test_a_batch_gives_each_request_its_chunk_alone(served: ServedPolicy) -> None:
    observations = [served.decode(observation(i)) for i in range(5)]
    seeds = [11, 12, None, 14, 15]
    alone = [served.act([o], [s])[0] for o, s in zip(observations, seeds, strict=True)]
    batcher = Batcher(served, max_batch=8, max_wait_ms=200.0)
    try:
        futures = [batcher.submit(o, a.seed) for o, a in zip(observations, alone, strict=True)]
        batched = [f.result(timeout=120) for f in futures]
    finally:
        batcher.stop()
    stats = batcher.stats.snapshot()
    assert stats["batches"] < len(observations)  # they shared forward passes
    for one, many in zip(alone, batched, strict=True):
        np.testing.assert_allclose(many.actions, one.actions, rtol=0, atol=BATCH_ATOL)


def test_the_wire_format_is_openpis(served: ServedPolicy) -> None:
    """Arrays travel as openpi's msgpack-numpy maps, and what openpi_client packs we unpack."""
    import msgpack
    from openpi_client import msgpack_numpy as openpi_codec

    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    ours = msgpack.unpackb(pack({"a": array}))
    assert (
        ours["a"][b"__ndarray__"] is True and ours["a"][b"dtype"] == "<f4" and ours["a"][b"shape"] == [2, 3]
    )
    np.testing.assert_array_equal(openpi_codec.unpackb(pack({"a": array}))["a"], array)
    theirs = unpack(openpi_codec.packb({"image": image(0), "n": np.int64(3)}))
    np.testing.assert_array_equal(theirs["image"], image(0))
    assert theirs["n"] == 3
    truncated = {b"__ndarray__": True, b"data": b"\x00" * 5, b"dtype": "<f4", b"shape": [2]}
    with pytest.raises(WireError, match=r"needs 8 bytes, got 5"):
        unpack(msgpack.packb(truncated))
    with pytest.raises(WireError, match="dtype"):
        unpack(msgpack.packb({**truncated, b"dtype": "|O"}))
    with pytest.raises(WireError, match="not a msgpack message"):
        unpack(b"\xc1")


def test_one_requests_fault_does_not_fail_its_batch(served: ServedPolicy) -> None:
    """A request that passed the checks and still breaks the forward pass (here: a sample naming no
    model camera, which only a bug could make) fails alone; its batch-mates get their chunks."""
    good = served.decode(observation(7))
    broken = DecodedObservation({**good.sample, "image": {"no_such_slot": image(0)}}, 0.0, 0.0)  # type: ignore[typeddict-item]
    batcher = Batcher(served, max_batch=8, max_wait_ms=200.0)
    try:
        futures = [batcher.submit(good, 3), batcher.submit(broken, 3)]
        chunk = futures[0].result(timeout=120)
        with pytest.raises(EngineError, match="unknown model camera 'no_such_slot'"):
            futures[1].result(timeout=120)
    finally:
        batcher.stop()
    np.testing.assert_allclose(chunk.actions, served.act([good], [3])[0].actions, rtol=0, atol=BATCH_ATOL)


@pytest.mark.parametrize("size", [(32, 32), (480, 640), (224, 224), (61, 300)])
def test_an_image_is_made_the_models_input_as_it_is_decoded_bit_for_bit_as_training_does(
    served: ServedPolicy, size: tuple[int, int]
) -> None:
    """Decoding keeps the model's input (224x224), not the image as sent; what the model reads is
    what the training collator makes of the same uint8 image, bit for bit."""
    rng = np.random.default_rng(sum(size))
    top, wrist = (rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(2))
    obs = {**observation(3), "images": {"top": png_base64(top), "wrist": wrist}}
    decoded = served.decode(obs)
    kept = decoded.sample["image"]
    image_size = served.policy.config.vision.image_size
    assert all(
        isinstance(t, torch.Tensor) and tuple(t.shape) == (3, image_size, image_size) for t in kept.values()
    )
    raw = {**decoded.sample, "image": {"base_0_rgb": top, "left_wrist_0_rgb": wrist}}
    assert torch.equal(served.policy.collate([decoded.sample]).images, served.policy.collate([raw]).images)


def test_a_requests_images_share_one_budget_of_decoded_pixels(served: ServedPolicy) -> None:
    """Counted from each image's header before it is decoded: the image past it is refused, naming
    it and the limit, and nothing of it is decoded."""
    from relay_engine.serving import MAX_REQUEST_PIXELS, PixelBudget

    big = png_base64(np.zeros((4096, 4096, 3), np.uint8))  # one colour: a small PNG
    obs = {**observation(4), "images": {"top": big, "wrist": big}}
    budget = PixelBudget()
    served.decode(obs, "observations[0]", budget)
    served.decode({**obs, "images": {"top": big, "wrist": image(1)}}, "observations[1]", budget)
    with pytest.raises(ConfigError) as caught:
        served.decode(obs, "observations[2]", budget)
    assert caught.value.param == "observations[2].images.top" and caught.value.code == "too_many_pixels"
    assert f"more than {MAX_REQUEST_PIXELS:,} decoded pixels" in str(caught.value)
    assert "MAX_REQUEST_PIXELS" in str(caught.value)
