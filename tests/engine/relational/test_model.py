"""RT-J: the published sizes, checkpoints that move both ways with the RelativeDB package, and the
same target_scores as that package on the same batch."""

from __future__ import annotations

from pathlib import Path

import pytest

# RelativeDB's package (the dev extra installs it): the peer these tests hold us to.
import relational_transformers as peer
import torch
from relational_transformers.checkpoints import save_checkpoint as peer_save
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from relay.cli import app
from relay_engine.relational import (
    NAMED_CONFIGS,
    RelationalBatch,
    RelationalTransformer,
    RTJConfig,
    parameter_count,
)
from tests.engine.relational.batches import mixed_batch, our_batch

TINY = NAMED_CONFIGS["rt-j-tiny"]
SIZES = {
    "num_blocks": TINY.num_blocks,
    "d_model": TINY.d_model,
    "d_text": TINY.d_text,
    "num_heads": TINY.num_heads,
    "d_ff": TINY.d_ff,
}


def scramble(module: torch.nn.Module, seed: int) -> None:
    """Seeded random values in every weight, the zero-initialised ones included, so that every
    path of the network shows in the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=g) * 0.3)


def test_published_sizes() -> None:
    assert parameter_count(RTJConfig(boolean_channel=False)) == 85_562_530  # Stanford's layout
    assert parameter_count(NAMED_CONFIGS["rt-j"]) == 85_562_530 + 2_561  # RelativeDB's boolean channel


def test_models_info_prints_the_stanford_count() -> None:
    result = CliRunner().invoke(app, ["models", "info", "rt-j"])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "Stanford layout (stanford-star/rt-j): 85,562,530 weights" in flat
    assert "85,565,091" in flat and "2,561 more for its boolean value channel" in flat


def test_peer_checkpoint_loads_into_ours_with_the_same_scores(tmp_path: Path) -> None:
    theirs = peer.RTJModel(**SIZES)
    scramble(theirs, seed=1)
    peer_save(theirs, tmp_path, SIZES)
    ours = RelationalTransformer(tmp_path, device="cpu")
    fields = mixed_batch(d_text=TINY.d_text, seed=2)
    expected = theirs.eval()(peer.RelationalBatch(**fields), output="target_scores").scores.detach()
    got = ours.target_scores(RelationalBatch(**fields))
    assert got.shape == (3,)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    features = theirs(peer.RelationalBatch(**fields), output="target_features").features.detach()
    torch.testing.assert_close(
        ours.encode(RelationalBatch(**fields), output_value="target_features", convert_to_numpy=False),
        features,
        atol=1e-5,
        rtol=0,
    )


def test_our_checkpoint_loads_into_the_peer_with_the_same_scores(tmp_path: Path) -> None:
    ours = RelationalTransformer("rt-j-tiny", device="cpu")
    scramble(ours.model, seed=3)
    ours.save_pretrained(tmp_path)
    theirs = peer.RelationalTransformer(str(tmp_path), device="cpu")
    fields = mixed_batch(d_text=TINY.d_text, seed=4)
    expected = ours.target_scores(RelationalBatch(**fields))
    got = theirs.forward(peer.RelationalBatch(**fields)).scores
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_norm_scales_load_from_weight_names_and_fp16(tmp_path: Path) -> None:
    model = RelationalTransformer("rt-j-tiny", device="cpu")
    scramble(model.model, seed=5)
    model.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    renamed = {
        (k.removesuffix(".scale") + ".weight" if k.endswith(".scale") and "norm" in k else k): v.half()
        for k, v in state.items()
    }
    save_file(renamed, str(tmp_path / "model.safetensors"))
    reloaded = RelationalTransformer(tmp_path, device="cpu")
    batch = our_batch(seed=6)
    half_rounded = RelationalTransformer("rt-j-tiny", device="cpu")
    half_rounded.model.load_state_dict({k: v.half().float() for k, v in state.items()})
    torch.testing.assert_close(
        reloaded.target_scores(batch), half_rounded.target_scores(batch), atol=1e-6, rtol=0
    )


def test_fresh_models_are_seeded_and_start_at_zero() -> None:
    a = RelationalTransformer("rt-j-tiny", device="cpu", seed=7)
    b = RelationalTransformer("rt-j-tiny", device="cpu", seed=7)
    c = RelationalTransformer("rt-j-tiny", device="cpu", seed=8)
    assert torch.equal(a.model.mask_embs["number"], b.model.mask_embs["number"])
    assert not torch.equal(a.model.mask_embs["number"], c.model.mask_embs["number"])
    # RT-J's decoders start at zero: a fresh model scores every context 0.
    assert torch.equal(a.target_scores(our_batch()), torch.zeros(3))


def test_bad_batches_name_the_field() -> None:
    fields = mixed_batch(d_text=16)
    fields["sem_types"] = fields["sem_types"] + 4
    with pytest.raises(ValueError, match="sem_types"):
        RelationalBatch(**fields)
    fields = mixed_batch(d_text=16)
    fields["is_targets"] = fields["is_padding"].clone()
    with pytest.raises(ValueError, match="is_targets"):
        RelationalBatch(**fields)


def test_a_directory_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no config\.json"):
        RelationalTransformer(tmp_path, device="cpu")
