"""pi05's structure matches lerobot's PI05Policy; pi05-tiny is the same code, seeded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relay_engine.errors import ConfigError
from relay_engine.models import Pi05Config, build_policy, named_config

KEY_LIST = Path(__file__).parents[2] / "fixtures" / "pi05-lerobot-state-dict-keys.txt"
UNUSED_LM_HEADS = {
    "model.paligemma_with_expert.paligemma.lm_head.weight",
    "model.paligemma_with_expert.gemma_expert.lm_head.weight",
}


def lerobot_keys() -> dict[str, tuple[int, ...]]:
    keys = {}
    for line in KEY_LIST.read_text().splitlines():
        name, shape, _dtype = line.split("\t")
        keys["model." + name] = tuple(int(x) for x in shape.strip("()").split(",") if x.strip())
    return keys


def test_pi05_names_and_shapes_are_lerobots() -> None:
    policy = build_policy("pi05", device="meta")
    ours = {name: tuple(t.shape) for name, t in policy.state_dict().items()}
    expected = {k: v for k, v in lerobot_keys().items() if k not in UNUSED_LM_HEADS}
    assert len(expected) == 811
    assert sorted(set(expected) - set(ours)) == []
    assert sorted(set(ours) - set(expected)) == []
    assert {k: v for k, v in ours.items() if expected[k] != v} == {}


def test_saved_files_carry_every_key_lerobot_loads_strictly(tmp_path: Path) -> None:
    from safetensors import safe_open

    from relay_engine.models import load_policy

    tiny = build_policy("pi05-tiny")
    tiny.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as saved:
        keys = set(saved.keys())
    # lerobot's PI05Policy: every tensor of its state dict, the embedding given as lm_head (its
    # loader copies lm_head to embed_tokens).
    embed = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    assert keys == (set(tiny.state_dict()) - {embed}) | UNUSED_LM_HEADS
    reloaded = load_policy(tmp_path)
    assert all(
        torch.equal(a, b)
        for a, b in zip(tiny.state_dict().values(), reloaded.state_dict().values(), strict=True)
    )


def test_pi05_parameter_count() -> None:
    policy = build_policy("pi05", device="meta")
    assert sum(p.numel() for p in policy.parameters()) == 3_353_433_872
    assert all(p.is_meta for p in policy.parameters())


def test_tiny_init_is_seeded() -> None:
    first, again, other = (build_policy("pi05-tiny", seed=s).state_dict() for s in (0, 0, 1))
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert sum(not torch.equal(first[name], other[name]) for name in first) > 50


def test_tiny_is_the_same_architecture() -> None:
    tiny = {name.split(".layers.")[0] for name in build_policy("pi05-tiny").state_dict()}
    full = {name.split(".layers.")[0] for name in build_policy("pi05", device="meta").state_dict()}
    assert tiny == full


def test_config_round_trips_and_checks_shared_attention() -> None:
    config = named_config("pi05-tiny", action_horizon=7, seed=3)
    assert Pi05Config.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="same depth"):
        config.replace(expert=config.expert.__class__(**{**config.expert.__dict__, "depth": 2}))
    with pytest.raises(ConfigError, match="unknown model"):
        named_config("pi07")


def test_adaptive_norms_start_closed_for_pi05_and_open_for_tiny() -> None:
    # openpi's init (pi05, whose real weights come from a checkpoint): zero dense, closed gates.
    openpi_init = build_policy(named_config("pi05-tiny").replace(model="pi05"))
    dense = [m.dense for m in openpi_init.model.expert.modules() if hasattr(m, "dense")]
    assert len(dense) == 2 * 4 + 1
    assert all(not d.weight.any() and not d.bias.any() for d in dense)
    # pi05-tiny's random weights stand in for pretrained ones: gates open, time-modulated.
    tiny = build_policy("pi05-tiny")
    for d in (m.dense for m in tiny.model.expert.modules() if hasattr(m, "dense")):
        scale_shift, gate = d.bias[:128], d.bias[128:]
        assert d.weight.std() > 0 and not scale_shift.any() and torch.all(gate == 1.0)
