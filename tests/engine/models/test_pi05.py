"""pi05-tiny: attention semantics, the loss, sampling with the prefix cache, save and load."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from relay_engine.errors import ConfigError
from relay_engine.models import (
    FlowOutputs,
    Pi05Policy,
    build_policy,
    flow_matching_loss,
    load_policy,
    sample_flow_time,
)
from tests.engine.models.joint_reference import joint_forward
from tests.engine.models.samples import make_samples
from tests.hub import FakeHub, Repo


@pytest.fixture(scope="module")
def policy() -> Pi05Policy:
    return build_policy("pi05-tiny", seed=0)


def _flow_inputs(batch, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch.actions.shape, generator=generator), torch.rand(
        batch.batch_size, generator=generator
    )


def test_split_passes_equal_one_joint_pass(policy: Pi05Policy) -> None:
    batch = policy.collate(make_samples(3))
    x_t, time = _flow_inputs(batch)
    with torch.no_grad():
        expected, _ = joint_forward(policy.model, batch, x_t, time)
        velocity = policy.model.velocity(policy.model.prefix_cache(batch), x_t, time)
    torch.testing.assert_close(velocity, expected, atol=1e-5, rtol=1e-5)


def test_prefix_never_sees_the_actions(policy: Pi05Policy) -> None:
    batch = policy.collate(make_samples(2))
    x_t, time = _flow_inputs(batch)
    with torch.no_grad():
        _, states = joint_forward(policy.model, batch, x_t, time)
        velocity_a = policy.model.velocity(policy.model.prefix_cache(batch), x_t, time)
        _, states_changed = joint_forward(policy.model, batch, x_t + 3.0, time * 0.5)
        _, prefix_mask = policy.model.embed_prefix(batch)
    for before, after in zip(states, states_changed, strict=True):
        torch.testing.assert_close(before[prefix_mask], after[prefix_mask], atol=0, rtol=0)
    # ... while the actions do see each other: a change at the last step moves the first.
    moved = x_t.clone()
    moved[:, -1] += 1.0
    with torch.no_grad():
        velocity_b = policy.model.velocity(policy.model.prefix_cache(batch), moved, time)
    assert (velocity_a[:, 0] - velocity_b[:, 0]).abs().max() > 1e-4


def test_actions_see_the_valid_prefix_only(policy: Pi05Policy) -> None:
    samples = make_samples(2, cameras=("base_0_rgb",))
    batch = policy.collate(samples)
    x_t, time = _flow_inputs(batch)

    def velocity(b) -> torch.Tensor:
        with torch.no_grad():
            return policy.model.velocity(policy.model.prefix_cache(b), x_t, time)

    reference = velocity(batch)
    # Another image: the actions see it.
    brighter = replace(batch, images=batch.images.clone().clamp(-1, 0.5) + 0.5)
    assert (velocity(brighter) - reference).abs().max() > 1e-4
    # Padding is invisible: garbage in a masked camera slot and in padded token ids change
    # nothing, and neither does a masked slot kept in the sequence.
    noisy = batch.images.clone()
    noisy[:, 1:] = torch.rand_like(noisy[:, 1:])
    tokens = batch.tokens.clone()
    tokens[~batch.token_mask] = 77
    wider = torch.cat([tokens, torch.full((2, 8), 5)], dim=1)
    wider_mask = torch.cat([batch.token_mask, torch.zeros(2, 8, dtype=torch.bool)], dim=1)
    padded = replace(batch, images=noisy, tokens=wider, token_mask=wider_mask, cameras_in_use=None)
    torch.testing.assert_close(velocity(padded), reference, atol=1e-5, rtol=1e-5)
    all_slots = replace(padded, cameras_in_use=(True, True, True))
    torch.testing.assert_close(velocity(all_slots), reference, atol=1e-5, rtol=1e-5)


def test_flow_outputs_follow_the_recipe(policy: Pi05Policy) -> None:
    batch = policy.collate(make_samples(4))
    out = policy.flow_outputs(batch, generator=torch.Generator().manual_seed(1))
    assert out.velocity.shape == (4, 10, 32) and out.velocity.dtype == torch.float32
    expanded = out.time[:, None, None]
    torch.testing.assert_close(out.x_t, expanded * out.noise + (1 - expanded) * batch.actions)
    torch.testing.assert_close(out.target, out.noise - batch.actions)
    again = policy.flow_outputs(batch, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out.velocity, again.velocity)
    times = sample_flow_time(20_000, torch.Generator().manual_seed(0))
    assert times.min() >= 0.001 and times.max() <= 1.0
    # Beta(1.5, 1) * 0.999 + 0.001 has mean 0.6 * 0.999 + 0.001.
    assert abs(times.mean().item() - 0.6004) < 0.01


def test_loss_masks_padded_steps_trains_padding_columns_and_weights_samples(policy: Pi05Policy) -> None:
    samples = make_samples(3, action_dim=4, padded_steps=3)
    samples[1]["weight"] = 3.0
    samples[2]["weight"] = 0.0
    batch = policy.collate(samples)
    velocity = torch.zeros(3, 10, 32)
    target = torch.ones(3, 10, 32)
    # Errors in steps padded past the episode's end must not count; every column of a real step
    # counts, the padding columns beyond action_dim too (openpi trains them towards zero).
    target[:, 7:, :] = 100.0
    target[0, :7, :4] = 2.0  # sample 0: 4 of its 32 columns err by 2, the rest by 1
    outputs = FlowOutputs(velocity=velocity, target=target, x_t=velocity, noise=velocity, time=torch.zeros(3))
    loss, per_sample = flow_matching_loss(outputs, batch, balance_padding=False)
    first = (4 * 4.0 + 28 * 1.0) / 32
    torch.testing.assert_close(per_sample, torch.tensor([first, 1.0, 1.0]))
    torch.testing.assert_close(loss, torch.tensor((1 * first + 3 * 1.0 + 0 * 1.0) / 4.0))
    assert batch.action_mask.sum() == 3 * 7 * 32
    # Balanced (the default): the robot's 4 columns' mean plus the 28 padding columns' mean.
    loss, per_sample = flow_matching_loss(outputs, batch)
    torch.testing.assert_close(per_sample, torch.tensor([4.0 + 1.0, 2.0, 2.0]))
    torch.testing.assert_close(loss, torch.tensor((1 * 5.0 + 3 * 2.0 + 0 * 2.0) / 4.0))
    assert batch.action_width is not None and batch.action_width.tolist() == [4, 4, 4]


def test_sampling_reuses_the_prefix(policy: Pi05Policy) -> None:
    batch = policy.collate(make_samples(2))
    noise = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(3))
    prefix_calls = []
    first_k = policy.model.language_model.layers[0].self_attn.k_proj
    handle = first_k.register_forward_hook(lambda *_: prefix_calls.append(1))
    try:
        actions = policy.sample_actions(batch, num_steps=10, noise=noise)
    finally:
        handle.remove()
    assert len(prefix_calls) == 1
    # The same Euler steps, recomputing the prefix at every step.
    x = noise.clone()
    with torch.no_grad():
        for step in range(10):
            time = torch.full((2,), 1.0 - step / 10)
            x = x - 0.1 * policy.model.velocity(policy.model.prefix_cache(batch), x, time)
    torch.testing.assert_close(actions, x, atol=1e-5, rtol=1e-5)


def test_several_chunks_per_frame_share_one_prefix_pass_and_sample_as_one_chunk_each(
    policy: Pi05Policy,
) -> None:
    # Validation samples several chunks per frame: the prefix runs once for them all, and each
    # chunk is what sampling its frame alone from the same noise gives.
    batch = policy.collate(make_samples(2))
    noise = torch.randn(2 * 3, 10, 32, generator=torch.Generator().manual_seed(5))
    prefix_calls = []
    first_k = policy.model.language_model.layers[0].self_attn.k_proj
    handle = first_k.register_forward_hook(lambda *_: prefix_calls.append(1))
    try:
        chunks = policy.sample_actions(batch, noise=noise, chunks=3)
    finally:
        handle.remove()
    assert len(prefix_calls) == 1 and chunks.shape == (6, 10, 32)
    for k in range(3):  # rows 3b + k are frame b's chunk k
        alone = policy.sample_actions(batch, noise=noise[k::3])
        torch.testing.assert_close(chunks[k::3], alone, atol=1e-5, rtol=1e-5)
    # The noise it draws itself: chunks=1 draws what sampling always drew.
    one = policy.sample_actions(batch, generator=torch.Generator().manual_seed(7), chunks=1)
    plain = policy.sample_actions(batch, generator=torch.Generator().manual_seed(7))
    assert torch.equal(one, plain)
    with pytest.raises(ValueError, match="chunks must be at least 1"):
        policy.sample_actions(batch, chunks=0)


def test_save_and_load_round_trip(policy: Pi05Policy, tmp_path: Path) -> None:
    policy.save_pretrained(tmp_path / "out")
    saved = load_file(str(tmp_path / "out" / "model.safetensors"))
    # What lerobot's pi05 file holds: the embedding as the tied lm_head.
    assert "model.paligemma_with_expert.paligemma.lm_head.weight" in saved
    assert not any(k.endswith("embed_tokens.weight") for k in saved)
    config = json.loads((tmp_path / "out" / "relay_config.json").read_text())
    assert config["model"] == "pi05-tiny" and config["action_horizon"] == 10
    # Beside it, lerobot's config: its pi05 type, the horizon as its chunk; no robot features are known
    # without a dataset.
    lerobot = json.loads((tmp_path / "out" / "config.json").read_text())
    assert lerobot["type"] == "pi05" and lerobot["chunk_size"] == 10 and lerobot["input_features"] == {}
    loaded = load_policy(tmp_path / "out")
    for (name, a), b in zip(policy.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    batch = policy.collate(make_samples(2))
    noise = torch.randn(2, 10, 32)
    assert torch.equal(policy.sample_actions(batch, noise=noise), loaded.sample_actions(batch, noise=noise))
    assert load_policy(tmp_path / "out", action_horizon=4).config.action_horizon == 4


def test_loads_lerobot_key_forms(policy: Pi05Policy, tmp_path: Path) -> None:
    # openpi-PyTorch / older lerobot files: no "model." prefix, embed_tokens present, plain
    # expert norm scales that adaRMS does not use.
    state = {k.removeprefix("model."): v.clone() for k, v in policy.state_dict().items()}
    state["paligemma_with_expert.gemma_expert.model.norm.weight"] = torch.zeros(64)
    (tmp_path / "m").mkdir()
    save_file(state, str(tmp_path / "m" / "model.safetensors"))
    (tmp_path / "m" / "config.json").write_text(
        json.dumps({"format": "relay-pi05", **policy.config.to_dict()})
    )
    loaded = load_policy(tmp_path / "m")
    assert all(
        torch.equal(a, b)
        for a, b in zip(policy.state_dict().values(), loaded.state_dict().values(), strict=True)
    )


def test_load_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither a known model"):
        load_policy("no-such-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no model\.safetensors"):
        load_policy(tmp_path / "empty")
    other = build_policy("pi05-tiny")
    other.save_pretrained(tmp_path / "out")
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    weights.pop("model.action_in_proj.bias")
    save_file(weights, str(tmp_path / "out" / "model.safetensors"))
    with pytest.raises(ConfigError, match="1 missing"):
        load_policy(tmp_path / "out")
    # Weights with only lerobot's config.json, or none, are taken for lerobot's pi05, which these are not.
    (tmp_path / "out" / "relay_config.json").unlink()
    with pytest.raises(ConfigError, match="does not fit pi05"):
        load_policy(tmp_path / "out")
    (tmp_path / "out" / "config.json").unlink()
    with pytest.raises(ConfigError, match="does not fit pi05"):
        load_policy(tmp_path / "out")


def test_loads_from_the_hub(policy: Pi05Policy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policy.save_pretrained(tmp_path / "repo")
    with FakeHub() as hub:
        hub.models["someone/tiny-pick"] = Repo.at(tmp_path / "repo")
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        loaded = load_policy("someone/tiny-pick")
        assert sorted(hub.downloads) == [
            "someone/tiny-pick/config.json",
            "someone/tiny-pick/model.safetensors",
            "someone/tiny-pick/relay_config.json",
        ]
        with pytest.raises(ConfigError, match=r"cannot get model\.safetensors of someone/missing"):
            load_policy("someone/missing")
    assert all(
        torch.equal(a, b)
        for a, b in zip(policy.state_dict().values(), loaded.state_dict().values(), strict=True)
    )
    # The Hub gone (its port closed): the cache is read at once, without huggingface_hub's minute
    # of retries, and what is not cached is one sentence saying the Hub cannot be reached.
    assert load_policy("someone/tiny-pick").config.model == "pi05-tiny"
    with pytest.raises(
        ConfigError, match=r"someone/missing from http://127\.0\.0\.1:\d+ \(ConnectionError: cannot reach "
    ):
        load_policy("someone/missing")
    # Cached: no Hub needed the second time.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert load_policy("someone/tiny-pick").config.model == "pi05-tiny"
