"""Samples -> Pi05Batch: images, prompt with the discretized state, masks, clear errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from relay_engine.errors import EngineError
from relay_engine.models import (
    ByteTokenizer,
    Pi05Collator,
    discretize_state,
    format_prompt,
    image_fit,
    model_image,
    named_config,
)
from tests.engine.models.samples import make_samples


@pytest.fixture(scope="module")
def collate() -> Pi05Collator:
    return Pi05Collator(named_config("pi05-tiny"))


def test_state_bins_are_openpis() -> None:
    values = np.array([-1.5, -1.0, 0.0, 0.99, 0.9922, 1.0, 3.0])
    assert discretize_state(values).tolist() == [-1, 0, 128, 254, 255, 255, 255]
    prompt = format_prompt(" pick_up\nthe fork ", np.array([-1.0, 0.0, 0.5]))
    assert prompt == "Task: pick up the fork, State: 0 128 192;\nAction: "


def test_batch_layout(collate: Pi05Collator) -> None:
    samples = make_samples(
        3, action_dim=4, state_dim=3, padded_steps=2, cameras=("base_0_rgb", "right_wrist_0_rgb")
    )
    samples[1]["weight"] = 0.5
    batch = collate(samples)
    assert batch.images.shape == (3, 3, 3, 32, 32)
    assert batch.image_mask.tolist() == [[True, False, True]] * 3
    assert batch.cameras_in_use == (True, False, True)
    assert torch.all(batch.images[:, 1] == -1.0)
    assert batch.images.min() >= -1.0 and batch.images.max() <= 1.0
    assert batch.actions.shape == batch.action_mask.shape == (3, 10, 32)
    expected_mask = torch.zeros(10, 32, dtype=torch.bool)
    expected_mask[:8, :] = True  # the real steps, every column (padding columns train towards zero)
    assert all(torch.equal(m, expected_mask) for m in batch.action_mask)
    assert torch.equal(batch.actions[0, :, :4], torch.from_numpy(samples[0]["actions"][:, :4]))
    assert batch.weights.tolist() == [1.0, 0.5, 1.0]
    # Byte tokens of the prompt, BOS first, right-padded to a multiple of 8.
    prompt = format_prompt(samples[0]["prompt"], samples[0]["state"][:3])
    ids = ByteTokenizer().encode(prompt)
    assert batch.tokens.shape[1] % 8 == 0
    assert batch.tokens[0, : len(ids)].tolist() == ids
    assert batch.token_mask[0].sum() == len(ids)
    assert batch.tokens[0, len(ids) :].eq(0).all()


def test_image_fit_keeps_aspect_ratio_centred_on_black() -> None:
    image = np.full((20, 40, 3), 200, dtype=np.uint8)
    out = image_fit(32)(image)
    assert out.shape == (32, 32, 3) and out.dtype == np.uint8
    # 40 wide -> 32, 20 high -> 16, centred: 8 rows of black above and below.
    assert np.all(out[:8] == 0) and np.all(out[24:] == 0)
    assert np.all(out[8:24] == 200)
    odd = image_fit(32)(np.full((32, 21, 3), 9, dtype=np.uint8))
    assert (
        np.all(odd[:, :5] == 0) and np.all(odd[:, 26:] == 0) and np.all(odd[:, 5:26] == 9)
    )  # extra column right
    # What the model reads: black is -1, and an image at the model's size is only scaled.
    assert torch.all(model_image(image, 32)[:, :8] == -1.0)
    at_size = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    assert image_fit(32)(at_size) is at_size
    expected = torch.from_numpy(at_size).permute(2, 0, 1).float() * (2.0 / 255.0) - 1.0
    torch.testing.assert_close(model_image(at_size, 32), expected, rtol=0, atol=1e-6)


def test_image_fit_is_the_float_resize_rounded() -> None:
    """The fitted image is torch's antialiased bilinear resize of the uint8 image, rounded: what the
    model read before the cache kept frames at its size, within half a level."""
    image = np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    fitted = image_fit(32)(image)  # 64x48 -> 32x24, 4 rows of padding above and below
    pixels = torch.from_numpy(image).permute(2, 0, 1)[None].float()
    resized = torch.nn.functional.interpolate(
        pixels, size=(24, 32), mode="bilinear", align_corners=False, antialias=True
    )[0].permute(1, 2, 0)
    assert np.all(fitted[:4] == 0) and np.all(fitted[28:] == 0)
    assert torch.equal(torch.from_numpy(fitted[4:28]), resized.round().clamp(0, 255).to(torch.uint8))


def test_uint8_scaling(collate: Pi05Collator) -> None:
    sample = make_samples(1)[0]
    sample["image"] = {"base_0_rgb": np.full((32, 32, 3), 255, dtype=np.uint8)}
    assert torch.all(collate([sample]).images[0, 0] == 1.0)
    sample["image"] = {"base_0_rgb": np.zeros((32, 32, 3), dtype=np.uint8)}
    assert torch.all(collate([sample]).images[0, 0] == -1.0)


def test_sampling_input_needs_no_actions(collate: Pi05Collator) -> None:
    sample = make_samples(1)[0]
    del sample["actions"], sample["action_is_pad"]
    batch = collate([sample])
    assert batch.actions.shape == (1, 10, 32) and not batch.action_mask.any()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"image": {"top": np.zeros((8, 8, 3), np.uint8)}}, "unknown model camera 'top'"),
        ({"image": {"base_0_rgb": np.zeros((8, 8, 3), np.float32)}}, "must be a uint8 array"),
        ({"image": {"base_0_rgb": np.zeros((8, 8), np.uint8)}}, "must be a uint8 array"),
        ({"actions": np.zeros((5, 32), np.float32)}, r"actions must have shape \(10, up to 32\)"),
        ({"actions": np.full((10, 32), np.nan, np.float32)}, "actions must be finite"),
        ({"action_dim": 0}, "action_dim must be between 1 and 32"),
        ({"state_dim": 40}, "state_dim must be between 0 and 32"),
        ({"weight": -1.0}, "weight must be a finite number >= 0"),
        ({"action_is_pad": np.zeros(3, bool)}, "action_is_pad must have shape"),
    ],
)
def test_bad_samples_are_named(collate: Pi05Collator, change: dict, message: str) -> None:
    samples = make_samples(2)
    samples[1].update(change)
    with pytest.raises(EngineError, match=f"sample 1: .*{message}"):
        collate(samples)


def test_collator_pickles_without_weights(collate: Pi05Collator) -> None:
    payload = pickle.dumps(collate)
    assert len(payload) < 10_000
    again = pickle.loads(payload)
    samples = make_samples(2)
    first, second = collate(samples), again(samples)
    assert torch.equal(first.tokens, second.tokens) and torch.equal(first.images, second.images)
