"""Training-loop sessions on rt-j-tiny through the real service: the API, Redis, PostgreSQL and a
Celery worker (docs/relational.md, "Training-loop sessions"). Contexts are sampled here from the
generated shop database and sent as RelationalDatums."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from relay.errors import RequestFailedError
from relay.training import ServiceClient, types
from relay_engine.families.rtj.batch import RelationalBatch
from relay_engine.families.rtj.database import open_database
from relay_engine.families.rtj.encoding import HashEmbedder
from relay_engine.families.rtj.sampling import ContextSampler
from relay_engine.families.rtj.synth import write_fake_shop
from relay_engine.families.rtj.transformer import RelationalTransformer
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow

ADAM = types.AdamParams(learning_rate=3e-3)


@pytest.fixture
def service(stack: Stack, user: tuple[str, str], worker: WorkerProcess) -> Iterator[ServiceClient]:
    client = ServiceClient(stack.api_url, user[1], progress=False)
    yield client
    client.close()


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_shop(tmp_path_factory.mktemp("shop"))


@pytest.fixture(scope="module")
def churn_batch(shop: Path) -> list[types.RelationalDatum]:
    """Seven train contexts of the shop's user-churn task (64 cells each)."""
    sampler = ContextSampler(
        open_database(shop), "user-churn", HashEmbedder(384), context_length=64, max_children=8
    )
    examples = sampler.examples("train", limit=7)
    labels = [float(e.label) for e in examples]
    # A fresh RT-J sees every context's target alike (its attention outputs start at zero), so a
    # batch with as many 0s as 1s has no gradient at all on its first step; this one has not.
    assert 0 < sum(labels) < len(labels) and 2 * sum(labels) != len(labels), labels
    return [types.RelationalDatum(context=e.input.numpy(), label=e.label) for e in examples]


def test_an_rt_j_session_learns_saves_and_loads_its_state(
    service: ServiceClient, churn_batch: list[types.RelationalDatum]
) -> None:
    with service.create_full_training_client("rt-j-tiny") as training_client:
        assert training_client.info["problem_type"] == "binary"
        assert training_client.info["loss_fn"] == "task"
        losses = []
        for _ in range(6):
            step = training_client.forward_backward(churn_batch)
            training_client.optim_step(ADAM)
            losses.append(step.result(timeout=120).metrics["loss"])
        assert losses[0] == pytest.approx(np.log(2), abs=1e-6)  # a fresh RT-J scores every context 0
        assert min(losses[1:]) < losses[0] - 0.005, losses
        saved = training_client.save_state("churn-6").result(timeout=120)
        assert saved.name == "churn-6"
        after = training_client.forward(churn_batch).result(timeout=120)
        assert after["target_scores"].shape == (len(churn_batch),)
        expected = float(after["loss"].mean())
        next_loss = training_client.forward_backward(churn_batch).result(timeout=120).metrics["loss"]
        assert next_loss == pytest.approx(expected, abs=1e-5)

    with service.create_full_training_client("rt-j-tiny") as resumed:
        fresh = resumed.forward(churn_batch).result(timeout=120)
        assert float(fresh["loss"].mean()) == pytest.approx(np.log(2), abs=1e-6)
        resumed.load_state("churn-6").result(timeout=120)
        loaded = resumed.forward(churn_batch).result(timeout=120)
        np.testing.assert_allclose(loaded["target_scores"], after["target_scores"], rtol=1e-5, atol=1e-6)
        assert resumed.forward_backward(churn_batch).result(timeout=120).metrics["loss"] == pytest.approx(
            expected, abs=1e-5
        )

    with (
        service.create_full_training_client("rt-j-tiny", problem_type="regression") as regression,
        pytest.raises(RequestFailedError, match="same model and problem_type"),
    ):
        regression.load_state("churn-6").result(timeout=120)


def test_calls_that_do_not_apply_to_rt_j_are_refused(
    stack: Stack, user: tuple[str, str], service: ServiceClient, churn_batch: list[types.RelationalDatum]
) -> None:
    with service.create_full_training_client("rt-j-tiny") as training_client:
        with pytest.raises(RequestFailedError, match="sample draws a robot policy's actions") as error:
            training_client.sample({"state": np.zeros(8), "prompt": "pick"}).result(timeout=120)
        assert error.value.category == "user"
        pi05_datum = types.Datum(observation={"state": np.zeros(8), "prompt": "x"}, actions=np.zeros((10, 8)))
        with pytest.raises(RequestFailedError, match="datum 0: an rt-j session takes RelationalDatums"):
            training_client.forward_backward([pi05_datum]).result(timeout=120)
        with pytest.raises(RequestFailedError, match="bad loss_fn: 'flow_matching'"):
            training_client.forward_backward(churn_batch, "flow_matching").result(timeout=120)
        # The session goes on after refused calls.
        assert training_client.forward_backward(churn_batch).result(timeout=120).metrics["loss"] > 0

    with pytest.raises(ValueError, match='bad finetune: "lora" \\(rt-j-tiny is tuned in full'):
        service.create_lora_training_client("rt-j-tiny")

    headers = {"authorization": f"Bearer {user[1]}"}
    cases = [
        ({"base_model": "rt-j-tiny", "finetune": "lora"}, "finetune", 'bad finetune: "lora"'),
        (
            {"base_model": "rt-j-tiny", "action_horizon": 20},
            "action_horizon",
            "rt-j-tiny takes no action_horizon",
        ),
        ({"base_model": "rt-j", "targets": ["vision"]}, "targets", "rt-j takes no targets"),
        ({"base_model": "rt-j-tiny", "problem_type": "multiclass"}, "problem_type", "bad problem_type"),
        (
            {"base_model": "pi05-tiny", "problem_type": "binary"},
            "problem_type",
            "pi05-tiny takes no problem_type",
        ),
    ]

    def session_ids() -> list[str]:
        return [s["id"] for s in httpx.get(f"{stack.api_url}/v1/sessions", headers=headers).json()["data"]]

    before = session_ids()
    for body, param, message in cases:
        answer = httpx.post(f"{stack.api_url}/v1/sessions", headers=headers, json=body)
        assert answer.status_code == 400, body
        error_body = answer.json()["error"]
        assert message in error_body["message"] and error_body["param"] == param, error_body
    assert session_ids() == before  # nothing half-created


def test_the_documented_loop_runs_as_written(
    monkeypatch: pytest.MonkeyPatch, stack: Stack, user: tuple[str, str], worker: WorkerProcess, shop: Path
) -> None:
    """docs/relational.md's session example, against the served API: only the database's path and
    the number of steps change."""
    document = (Path(__file__).resolve().parents[2] / "docs" / "relational.md").read_text()
    section = document.split("## Training-loop sessions", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'Path("shop")' in code and "range(20)" in code
    code = code.replace('Path("shop")', f"Path({str(shop)!r})").replace("range(20)", "range(2)")
    monkeypatch.setenv("RELAY_BASE_URL", stack.api_url)
    monkeypatch.setenv("RELAY_API_KEY", user[1])
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/relational.md", "exec"), namespace)
    scores = namespace["scores"]
    assert isinstance(scores, dict) and scores["target_scores"].shape == (16,)
    # The saved weights are a checkpoint directory that RelationalTransformer loads, scoring alike.
    tuned = RelationalTransformer(namespace["tuned"].path, device="cpu")  # type: ignore[attr-defined]
    batch = namespace["batch"]
    assert isinstance(batch, list)
    reloaded = tuned.target_scores([RelationalBatch.from_mapping(d.context) for d in batch])
    np.testing.assert_allclose(reloaded.numpy(), scores["target_scores"], rtol=1e-5, atol=1e-6)
