"""Norm stats: exact quantiles (checked against numpy), openpi's JSON layout, the formula and its inverse."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from relay_engine.datasets import NormStats, compute_norm_stats, dataset_norm_stats, open_dataset
from relay_engine.errors import DatasetError
from tests.engine.datasets.conftest import episode_file


def test_quantiles_mean_and_std_match_numpy_over_all_frames() -> None:
    rng = np.random.default_rng(0)
    state = rng.standard_t(3, size=(5001, 5)).astype(np.float32)
    actions = rng.uniform(-3, 7, size=(5001, 3)).astype(np.float32)
    stats = compute_norm_stats(state, actions)
    for values, computed in ((state, stats.state), (actions, stats.actions)):
        as64 = values.astype(np.float64)
        np.testing.assert_array_equal(computed.q01, np.quantile(as64, 0.01, axis=0, method="linear"))
        np.testing.assert_array_equal(computed.q99, np.quantile(as64, 0.99, axis=0, method="linear"))
        np.testing.assert_allclose(computed.mean, as64.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(computed.std, as64.std(axis=0), rtol=1e-12)


def test_normalization_maps_q01_to_minus_one_and_q99_to_one_and_inverts() -> None:
    rng = np.random.default_rng(1)
    actions = rng.normal(3.0, 2.0, size=(1000, 4)).astype(np.float32)
    stats = compute_norm_stats(actions, actions)
    q01, q99 = stats.actions.q01, stats.actions.q99
    expected = (actions - q01) / (q99 - q01 + 1e-6) * 2 - 1
    np.testing.assert_allclose(stats.normalize_actions(actions), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats.normalize_actions(q01[None]), -1.0, atol=1e-5)
    np.testing.assert_allclose(stats.normalize_actions(q99[None]), 1.0, atol=1e-5)
    # The model's output is 32 wide; the padding columns are dropped on the way back.
    padded = np.zeros((1000, 32), dtype=np.float32)
    padded[:, :4] = stats.normalize_actions(actions)
    padded[:, 4:] = 9.0
    np.testing.assert_allclose(stats.unnormalize_actions(padded), actions, rtol=1e-5, atol=1e-4)


def test_widths_are_checked() -> None:
    stats = compute_norm_stats(np.zeros((3, 2)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="state are 3 wide; the stats are for 2"):
        stats.normalize_state(np.zeros(3))
    with pytest.raises(ValueError, match="at least 5"):
        stats.unnormalize_actions(np.zeros((2, 4)))


def test_json_is_openpis_layout_and_round_trips() -> None:
    stats = compute_norm_stats(np.arange(20.0).reshape(10, 2), np.arange(30.0).reshape(10, 3))
    data = json.loads(stats.to_json())
    assert set(data) == {"norm_stats"}
    assert set(data["norm_stats"]) == {"state", "actions"}
    assert set(data["norm_stats"]["state"]) == {"mean", "std", "q01", "q99"}
    assert len(data["norm_stats"]["actions"]["q99"]) == 3
    again = NormStats.from_json(stats.to_json())
    for name in ("mean", "std", "q01", "q99"):
        np.testing.assert_array_equal(getattr(again.actions, name), getattr(stats.actions, name))


def test_mean_std_normalization_is_lerobot_s_and_its_json_says_so() -> None:
    rng = np.random.default_rng(2)
    actions = rng.normal(3.0, 2.0, size=(500, 3)).astype(np.float32)
    stats = replace(compute_norm_stats(actions, actions), method="mean_std")
    mean, std = stats.actions.mean, stats.actions.std
    np.testing.assert_allclose(stats.normalize_actions(actions), (actions - mean) / (std + 1e-8), atol=1e-6)
    np.testing.assert_allclose(
        stats.unnormalize_actions(stats.normalize_actions(actions)), actions, atol=1e-4
    )
    # The file says which statistics normalize: a model read back acts in the units it trained in.
    assert json.loads(stats.to_json())["normalization"] == "mean_std"
    assert NormStats.from_json(stats.to_json()).method == "mean_std"
    assert "normalization" not in json.loads(replace(stats, method="quantile").to_json())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", '"norm_stats" with "state" and "actions"'),
        (
            '{"normalization": "zscore", "norm_stats": {}}',
            'normalization must be "quantile" or "mean_std", got "zscore"',
        ),
        ('{"norm_stats": {"state": {}}}', "norm_stats.state.mean is missing or null"),
        (
            '{"norm_stats": {"state": {"mean": [0], "std": [1], "q01": null, "q99": [1]}, "actions": {}}}',
            "norm_stats.state.q01 is missing or null",
        ),
        (
            '{"norm_stats": {"state": {"mean": [0], "std": [1], "q01": [0, 1], "q99": [1]}, "actions": {}}}',
            "norm_stats.state: mean, std, q01 and q99 differ in length",
        ),
    ],
)
def test_bad_norm_stats_json_names_the_field(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NormStats.from_json(text)


def test_computed_stats_cover_every_frame_of_the_dataset(handmade: Path, cache_dir: Path) -> None:
    tables = [
        pq.read_table(p, columns=["observation.state", "action"]) for p in sorted(handmade.rglob("*.parquet"))
    ]
    state = np.concatenate([np.stack(t.column("observation.state").to_pylist()) for t in tables])
    actions = np.concatenate([np.stack(t.column("action").to_pylist()) for t in tables])
    stats, source = dataset_norm_stats(str(handmade), cache_dir=cache_dir)
    assert source == "computed"
    expected = compute_norm_stats(state, actions)
    np.testing.assert_array_equal(stats.state.q99, expected.state.q99)
    np.testing.assert_array_equal(stats.actions.q01, expected.actions.q01)
    dataset = open_dataset(str(handmade), cache_dir=cache_dir)
    np.testing.assert_array_equal(dataset.norm_stats.actions.q01, expected.actions.q01)


def test_a_shipped_norm_stats_json_is_used(broken: Path, cache_dir: Path) -> None:
    shipped = compute_norm_stats(np.array([[-5.0, 5.0], [5.0, 15.0]]), np.array([[0.0, 0.0], [1.0, 2.0]]))
    (broken / "meta/norm_stats.json").write_text(shipped.to_json())
    stats, source = dataset_norm_stats(str(broken), cache_dir=cache_dir)
    assert source == "meta/norm_stats.json"
    np.testing.assert_array_equal(stats.state.q01, shipped.state.q01)
    dataset = open_dataset(str(broken), cache_dir=cache_dir)
    np.testing.assert_array_equal(dataset.norm_stats.state.q99, shipped.state.q99)
    raw_state = np.array(pq.read_table(episode_file(broken, 0)).column("observation.state")[0].as_py())
    np.testing.assert_allclose(dataset[0]["state"][:2], shipped.normalize_state(raw_state))


def test_a_shipped_norm_stats_json_of_the_wrong_width_is_refused(broken: Path, cache_dir: Path) -> None:
    wrong = compute_norm_stats(np.zeros((2, 3)), np.zeros((2, 2)))
    (broken / "norm_stats.json").write_text(wrong.to_json())
    with pytest.raises(
        DatasetError, match=r"norm_stats.json: norm_stats.state is 3 wide but the dataset's is 2"
    ):
        open_dataset(str(broken), cache_dir=cache_dir)
