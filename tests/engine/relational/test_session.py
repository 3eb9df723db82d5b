"""The RT-J session model on plain data, in this process (the service runs it in
tests/service/test_relational_sessions.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from relay.optimizer import AdamParams
from relay_engine.errors import EngineError
from relay_engine.families.rtj.database import open_database
from relay_engine.families.rtj.encoding import HashEmbedder
from relay_engine.families.rtj.sampling import ContextSampler
from relay_engine.families.rtj.session import RelationalSession, RelationalSessionSpec
from relay_engine.families.rtj.synth import write_fake_shop

ADAM = AdamParams(learning_rate=3e-3)


@pytest.fixture(scope="module")
def datums(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    shop: Path = write_fake_shop(tmp_path_factory.mktemp("shop"))
    sampler = ContextSampler(
        open_database(shop), "user-churn", HashEmbedder(384), context_length=32, max_children=4
    )
    return [{"context": e.input.numpy(), "label": float(e.label)} for e in sampler.examples("train", limit=7)]


def test_two_half_batches_then_a_step_equal_one_full_batch_then_a_step(datums: list[dict[str, Any]]) -> None:
    results = []
    for halves in ([datums], [datums[:3], datums[3:]]):
        session = RelationalSession(RelationalSessionSpec("rt-j-tiny"))
        for _ in range(2):  # the second step has gradients everywhere, not only in the decoder
            for half in halves:
                session.forward_backward(half)
            step = session.optim_step(ADAM)
        results.append((step["metrics"]["grad_norm"], session.forward(datums)["target_scores"]))
    (whole_norm, whole_scores), (split_norm, split_scores) = results
    assert whole_norm > 0 and split_norm == pytest.approx(whole_norm, rel=1e-5)
    np.testing.assert_allclose(split_scores, whole_scores, rtol=1e-5, atol=1e-6)


def test_a_context_may_come_without_its_batch_dimension(datums: list[dict[str, Any]]) -> None:
    session = RelationalSession(RelationalSessionSpec("rt-j-tiny"))
    squeezed = [{"context": {k: v[0] for k, v in d["context"].items()}, "label": d["label"]} for d in datums]
    assert session.forward(squeezed)["loss"].tolist() == session.forward(datums)["loss"].tolist()


def test_bad_datums_are_refused_naming_the_datum(datums: list[dict[str, Any]]) -> None:
    session = RelationalSession(RelationalSessionSpec("rt-j-tiny"))
    no_target = {
        **datums[0],
        "context": {**datums[0]["context"], "is_targets": np.zeros_like(datums[0]["context"]["is_targets"])},
    }
    cases = [
        (
            {"observation": {}, "actions": np.zeros((10, 4))},
            "datum 1: an rt-j session takes RelationalDatums",
        ),
        ({**datums[0], "label": "yes"}, "datum 1: label must be a finite number"),
        ({**datums[0], "context": {**datums[0]["context"], "wings": np.zeros(3)}}, "unknown fields wings"),
        (no_target, "datum 1: context marks no target cell"),
    ]
    for bad, message in cases:
        with pytest.raises(EngineError, match=message):
            session.forward_backward([datums[0], bad])
    with pytest.raises(EngineError, match="optim_step: no gradients accumulated"):
        session.optim_step(ADAM)  # nothing of the refused batches was kept
