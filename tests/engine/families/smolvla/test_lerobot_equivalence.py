"""Relay's SmolVLA against lerobot 0.6.1's `SmolVLAPolicy`, number for number, at a tiny size: the
weights, batch and outputs lerobot wrote (tests/fixtures/make_lerobot_smolvla.py) are loaded here,
and Relay computes the same loss from the same noise and times, and samples the same chunk from the
same noise; its processing turns raw inputs into what lerobot's processors gave; and weights Relay
trained are loaded by lerobot and sampled alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from relay_engine.acting import observation_sample, read_norm_stats, sample_chunks
from relay_engine.errors import ConfigError
from relay_engine.families import family_owning
from relay_engine.families.smolvla.policy import (
    ACTION,
    ACTION_IS_PAD,
    STATE,
    TOKEN_MASK,
    TOKENS,
    SmolVLAPolicy,
)
from relay_engine.families.smolvla.processor import SmolVLAProcessor, load_tokenizer

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "lerobot-smolvla"
# Measured: 0.0 (loss), 2.4e-7 (chunk), 3.0e-7 (trained chunk), with torch 2.13 here and 2.11 on
# lerobot's side.
TOLERANCE = 2e-6


@pytest.fixture(scope="module")
def recorded() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURE / "batch_and_outputs.safetensors"))


@pytest.fixture(scope="module")
def policy() -> SmolVLAPolicy:
    return SmolVLAPolicy.from_lerobot(FIXTURE, backbone_dir=FIXTURE / "vlm").eval()


def test_the_loss_is_lerobots(policy: SmolVLAPolicy, recorded: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        loss = policy.loss(recorded, recorded["noise"], recorded["time"])
        per_sample = policy.loss(recorded, recorded["noise"], recorded["time"], reduction="none")
    torch.testing.assert_close(loss.reshape(1), recorded["loss"], rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(per_sample, recorded["per_sample_loss"], rtol=0, atol=TOLERANCE)


def test_the_sampled_chunk_is_lerobots(policy: SmolVLAPolicy, recorded: dict[str, torch.Tensor]) -> None:
    chunk = policy.predict_chunk(recorded, recorded["sampling_noise"])
    assert chunk.shape == recorded["chunk"].shape == (2, 10, 4)
    torch.testing.assert_close(chunk, recorded["chunk"], rtol=0, atol=TOLERANCE)


def test_a_missing_backbone_configuration_is_said_plainly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="backbone configuration is missing"):
        SmolVLAPolicy.from_lerobot(FIXTURE, backbone_dir=tmp_path)


def test_weights_relay_trained_are_loaded_by_lerobot_and_sampled_alike(
    policy: SmolVLAPolicy, recorded: dict[str, torch.Tensor]
) -> None:
    # Relay trained lerobot's policy for 5 steps and wrote lerobot's files; lerobot loaded them
    # strictly and sampled (tests/fixtures/make_relay_smolvla_trained.py, then
    # make_lerobot_smolvla.py --trained).
    trained_dir = FIXTURE.parent / "relay-smolvla-trained"
    trained = SmolVLAPolicy.from_lerobot(trained_dir, backbone_dir=FIXTURE / "vlm").eval()
    lerobot_chunk = load_file(str(trained_dir / "lerobot_chunk.safetensors"))["chunk"]
    chunk = trained.predict_chunk(recorded, recorded["sampling_noise"])
    torch.testing.assert_close(chunk, lerobot_chunk, rtol=0, atol=TOLERANCE)
    # Training moved the expert, not the backbone (lerobot's default: the expert only).
    before, after = policy.state_dict(), trained.state_dict()
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    assert moved and all(".vlm." not in name for name in moved), sorted(moved)[:5]
    assert any("lm_expert" in name for name in moved) and "model.state_proj.weight" in moved
    assert (chunk - recorded["chunk"]).abs().max() > 100 * TOLERANCE


def test_saving_writes_lerobots_files_back(policy: SmolVLAPolicy, tmp_path: Path) -> None:
    policy.save_lerobot(tmp_path)
    again = SmolVLAPolicy.from_lerobot(tmp_path, backbone_dir=FIXTURE / "vlm")
    for name, tensor in policy.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_processing_raw_inputs_is_lerobots(policy: SmolVLAPolicy, recorded: dict[str, torch.Tensor]) -> None:
    """lerobot's preprocessor turned the raw batch into what the policy read, and its
    postprocessor the sampled chunk into the robot's units: Relay's processor does the same."""
    stats = json.loads((FIXTURE / "stats.json").read_text())
    tasks = json.loads((FIXTURE / "tasks.json").read_text())
    processor = SmolVLAProcessor(policy.config, load_tokenizer(FIXTURE / "vlm"), stats)
    raw = {key.removeprefix("raw."): value for key, value in recorded.items() if key.startswith("raw.")}
    images = {camera: raw[camera] for camera in policy.cameras}
    batch = processor.batch(images, raw[STATE], tasks, raw[ACTION], raw[ACTION_IS_PAD])
    assert torch.equal(batch[TOKENS], recorded[TOKENS]) and torch.equal(
        batch[TOKEN_MASK], recorded[TOKEN_MASK]
    )
    for key in (STATE, ACTION):
        torch.testing.assert_close(batch[key], recorded[key], rtol=0, atol=1e-6)
    robot = processor.robot_actions(policy.predict_chunk(batch, recorded["sampling_noise"]))
    torch.testing.assert_close(robot, recorded["robot_chunk"], rtol=0, atol=1e-5)


def test_lerobot_takes_a_relay_job_s_output_and_answers_as_relay_serves_it() -> None:
    """A smolvla-tiny job's whole output (tests/fixtures/make_relay_smolvla_job.py): lerobot loaded
    the weights strictly and its processors from Relay's files, and answered a raw observation
    from given noise (make_lerobot_smolvla.py --job). Relay's acting path, the one the policy
    server and closed-loop evaluation run, answers the same in the robot's units."""
    job = FIXTURE.parent / "relay-smolvla-job"
    lerobot = load_file(str(job / "lerobot_answer.safetensors"))
    recorded = load_file(str(job / "observation.safetensors"))
    with safe_open(str(job / "observation.safetensors"), "pt") as file:
        task = file.metadata()["task"]
    policy = family_owning(str(job)).acting_policy(str(job), torch.device("cpu"))
    assert policy.reads_cameras == ("observation.images.top", "observation.images.wrist")
    stats = read_norm_stats(job)
    images = {
        # lerobot read (3, H, W) in [0, 1]; a camera gives Relay uint8 (H, W, 3).
        name: (recorded[name][0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        for name in policy.reads_cameras
    }
    sample = observation_sample(images, recorded[STATE][0].numpy(), task, stats)
    chunk = sample_chunks(policy, [sample], [recorded["noise"][0]], num_steps=10)[0]
    width = lerobot["robot_chunk"].shape[-1]
    torch.testing.assert_close(
        torch.from_numpy(chunk[:, :width]), lerobot["chunk"][0], rtol=0, atol=TOLERANCE
    )
    robot = stats.unnormalize_actions(chunk)
    torch.testing.assert_close(torch.from_numpy(robot), lerobot["robot_chunk"][0], rtol=0, atol=1e-5)
