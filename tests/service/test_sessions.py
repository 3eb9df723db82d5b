"""Training-loop sessions through the real service: the API, Redis, PostgreSQL and a Celery worker
running pi05-tiny (docs/sessions.md). The documented examples themselves are in tests/sdk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from relay.errors import RequestFailedError
from relay.optimizer import AdamParams
from relay.training import ServiceClient, TrainingClient, types, wire
from relay_engine.families.pi05.session import SessionSpec, TrainingSession
from tests.service.sessions_data import HORIZON, batch, datum, flow_matching_loss
from tests.service.stack import Stack, WorkerProcess, wait_for

pytestmark = pytest.mark.slow

LR = 1e-4


@pytest.fixture
def service(stack: Stack, user: tuple[str, str], worker: WorkerProcess) -> Iterator[ServiceClient]:
    client = ServiceClient(stack.api_url, user[1], progress=False)
    yield client
    client.close()


def probe_loss(training_client: TrainingClient) -> float:
    """The flow-matching loss of a fixed batch with the weights now, without gradients."""
    outputs = training_client.forward(batch(100, 2)).result()
    error = (outputs["velocity"] - outputs["target"])[:, :, :6] ** 2
    return float(error.mean())


def test_calls_run_in_the_order_they_were_made_while_the_loop_runs_ahead(service: ServiceClient) -> None:
    """Every call is sent without waiting; the results equal those of the engine run in this process
    one call after another (so no call overtook another, and the wire carried the data exactly).
    The frames are big enough that each batch travels in its own Redis key (relay_api.channel_redis)."""
    batches = [[datum(10 * step + i, size=128) for i in range(2)] for step in range(4)]
    probe = batch(100, 2)
    with service.create_lora_training_client("pi05-tiny", rank=8) as training_client:
        futures = []
        for step_batch in batches:
            futures.append(training_client.forward_backward(step_batch, "flow_matching"))
            futures.append(training_client.optim_step(types.AdamParams(learning_rate=1e-2)))
            futures.append(training_client.forward(probe))
        sequence = [f.seq for f in futures]
        assert sequence == sorted(sequence) and len(set(sequence)) == len(sequence)
        results = [f.result(timeout=120) for f in futures]

    local = TrainingSession(SessionSpec(base_model="pi05-tiny", lora_rank=8))
    plain = [_plain(d) for d in probe]
    for step, step_batch in enumerate(batches):
        fb, optim, forward = results[3 * step : 3 * step + 3]
        expected = local.forward_backward([_plain(d) for d in step_batch])
        assert fb.metrics["loss"] == pytest.approx(expected["metrics"]["loss"], rel=1e-5)
        assert [o["loss"] for o in fb.loss_fn_outputs] == pytest.approx(
            [o["loss"] for o in expected["loss_fn_outputs"]], rel=1e-5
        )
        expected_step = local.optim_step(AdamParams(learning_rate=1e-2))
        assert optim.metrics["grad_norm"] == pytest.approx(expected_step["metrics"]["grad_norm"], rel=1e-4)
        np.testing.assert_allclose(
            forward["velocity"], local.forward(plain)["velocity"], rtol=1e-4, atol=1e-5
        )


def _plain(item: types.Datum) -> dict[str, Any]:
    return {"observation": item.observation, "actions": item.actions, "weight": item.weight}


def test_two_half_batches_then_one_step_equal_one_full_batch_then_one_step(service: ServiceClient) -> None:
    full = batch(0, 4)
    with service.create_lora_training_client("pi05-tiny", rank=8) as whole:
        whole.forward_backward(full, "flow_matching")
        step_whole = whole.optim_step(types.AdamParams(learning_rate=LR)).result()
        after_whole = probe_loss(whole)
    with service.create_lora_training_client("pi05-tiny", rank=8) as halves:
        first = halves.forward_backward(full[:2], "flow_matching")
        second = halves.forward_backward(full[2:], "flow_matching")
        step_halves = halves.optim_step(types.AdamParams(learning_rate=LR)).result()
        after_halves = probe_loss(halves)
    assert first.result().metrics["loss"] != second.result().metrics["loss"]
    assert step_halves.metrics["grad_norm"] == pytest.approx(step_whole.metrics["grad_norm"], abs=1e-6)
    assert after_halves == pytest.approx(after_whole, abs=1e-6)


def test_a_custom_loss_equal_to_the_builtin_one_trains_the_same(service: ServiceClient) -> None:
    data = batch(0, 3)
    with service.create_lora_training_client("pi05-tiny", rank=8) as builtin:
        expected = builtin.forward_backward(data, "flow_matching").result()
        expected_step = builtin.optim_step(types.AdamParams(learning_rate=LR)).result()
        expected_next = probe_loss(builtin)
    with service.create_lora_training_client("pi05-tiny", rank=8) as custom:
        result = custom.forward_backward_custom(data, flow_matching_loss).result()
        step = custom.optim_step(types.AdamParams(learning_rate=LR)).result()
        next_loss = probe_loss(custom)
    assert result.metrics["loss"] == pytest.approx(expected.metrics["loss"], abs=1e-6)
    assert result.metrics["same_as_builtin"] == pytest.approx(expected.metrics["loss"], abs=1e-6)
    assert step.metrics["grad_norm"] == pytest.approx(expected_step.metrics["grad_norm"], rel=1e-5)
    assert next_loss == pytest.approx(expected_next, abs=1e-6)


def test_a_step_with_a_gradient_that_is_not_finite_is_skipped(service: ServiceClient) -> None:
    """And a custom loss that raises leaves no forward pass waiting on the GPU for its gradient."""

    def poisoned(data: Any, outputs: dict[str, Any]) -> tuple[Any, dict[str, float]]:
        return (outputs["velocity"] * float("nan")).sum(), {}

    def broken(data: Any, outputs: dict[str, Any]) -> tuple[Any, dict[str, float]]:
        raise ValueError("a bug in my loss")

    with service.create_lora_training_client("pi05-tiny", rank=8) as training_client:
        with pytest.raises(ValueError, match="a bug in my loss"):  # raised here, on the client
            training_client.forward_backward_custom(batch(0, 2), broken)
        training_client.forward_backward_custom(batch(0, 2), poisoned)
        skipped = training_client.optim_step(types.AdamParams(learning_rate=LR)).result()
        training_client.forward_backward(batch(0, 2), "flow_matching")
        next_step = training_client.optim_step(types.AdamParams(learning_rate=LR)).result()
    assert skipped.metrics["skipped"] is True and not np.isfinite(skipped.metrics["grad_norm"])
    assert next_step.metrics["skipped"] is False and np.isfinite(next_step.metrics["grad_norm"])


def test_a_malformed_datum_fails_only_its_own_step(service: ServiceClient) -> None:
    with service.create_lora_training_client("pi05-tiny", rank=8) as training_client:
        good = training_client.forward_backward(batch(0, 2), "flow_matching")
        bad = training_client.forward_backward([datum(1), datum(2, actions=np.zeros((4, 6), np.float32))])
        unsendable = training_client.forward_backward(
            [
                datum(3, weight=1.0),
                types.Datum(
                    observation={"state": ["up", "down"], "prompt": "x"}, actions=np.zeros((HORIZON, 2))
                ),
            ]
        )
        wrong_size = training_client.forward_backward([datum(4), datum(5, size=48)])
        step = training_client.optim_step(types.AdamParams(learning_rate=LR))
        assert step.result().metrics["skipped"] is False  # the session went on, with the good step's gradient
        assert good.result().metrics["loss"] > 0

        with pytest.raises(RequestFailedError) as error:
            bad.result()
        assert error.value.category == "user" and error.value.request_id.startswith("req_")
        assert "datum 1: actions must have shape (10, up to 32)" in str(error.value)
        with pytest.raises(RequestFailedError, match="datum 1: state must be an array of numbers") as error:
            unsendable.result()
        assert error.value.category == "user"
        with pytest.raises(RequestFailedError, match=r"datum 1: image 'base_0_rgb' is \(48, 48, 3\)"):
            wrong_size.result()


def test_sampling_now_and_with_saved_weights_while_training_goes_on(service: ServiceClient) -> None:
    observation = datum(7).observation
    with service.create_lora_training_client("pi05-tiny", rank=8) as training_client:
        one = training_client.sample(observation).result()
        two = training_client.sample([observation, datum(8).observation], num_steps=4).result()
        sampler = training_client.save_weights_and_get_sampling_client("step-0")
        weights = Path(sampler.path, "model.safetensors")
        saved_bytes = weights.read_bytes()
        for step in range(3):
            training_client.forward_backward(batch(step, 2), "flow_matching")
            training_client.optim_step(types.AdamParams(learning_rate=5e-2))
        from_saved = sampler.sample([observation] * 3).result()
        from_now = training_client.sample(observation).result()
    assert one.shape == (HORIZON, 32) and two.shape == (2, HORIZON, 32) and np.isfinite(two).all()
    assert from_saved.shape == (3, HORIZON, 32) and from_now.shape == (HORIZON, 32)
    assert Path(sampler.path).parts[-2:] == ("weights", "step-0")
    assert weights.read_bytes() == saved_bytes  # training went on; the saved weights did not move


def test_state_saved_in_one_session_resumes_in_another_and_stays_with_its_user(
    stack: Stack, service: ServiceClient
) -> None:
    data = batch(0, 2)
    with service.create_lora_training_client("pi05-tiny", rank=8) as first:
        first.forward_backward(data, "flow_matching")
        first.optim_step(types.AdamParams(learning_rate=1e-3))
        saved = first.save_state("step-1").result()
        first.forward_backward(data, "flow_matching")
        first.optim_step(types.AdamParams(learning_rate=1e-3))
        expected = first.forward_backward(data, "flow_matching").result().metrics["loss"]
    # Its address in the user's account, not where it lies on the server's disk.
    assert saved.name == "step-1" and saved.path == "relay://states/step-1"
    # Its worker counted what it did (the close is a call too) and wrote it when the session ended.
    ended = wait_for(
        lambda: (row := service.retrieve_session(first.id))["status"] == "closed" and row, 30, "the close"
    )
    assert (ended["calls"], ended["steps"], ended["saved_states"]) == (7, 2, 1)

    with service.create_lora_training_client("pi05-tiny", rank=8) as second:
        loaded = second.load_state("step-1").result()
        assert (loaded.name, loaded.path) == ("step-1", "relay://states/step-1")
        second.forward_backward(data, "flow_matching")
        second.optim_step(types.AdamParams(learning_rate=1e-3))
        assert second.forward_backward(data, "flow_matching").result().metrics["loss"] == pytest.approx(
            expected, abs=1e-6
        )
        with pytest.raises(ValueError, match="can't contain a slash or start with a dot"):
            second.save_state("../elsewhere")
        with pytest.raises(ValueError, match="can't contain a slash or start with a dot"):
            second.load_state(".hidden")

    with (
        service.create_lora_training_client("pi05-tiny", rank=4) as other_rank,
        pytest.raises(RequestFailedError, match="same model and targets"),
    ):
        other_rank.load_state("step-1").result()

    stranger = ServiceClient(stack.api_url, stack.new_user()[1], progress=False)
    with stranger.create_lora_training_client("pi05-tiny", rank=8) as theirs:
        with pytest.raises(RequestFailedError, match="no saved state named 'step-1'") as error:
            theirs.load_state("step-1").result()
        assert error.value.category == "user"
    stranger.close()


def test_another_users_session_is_not_found(stack: Stack, service: ServiceClient) -> None:
    with service.create_lora_training_client("pi05-tiny", rank=8) as training_client:
        training_client.forward(batch(0, 1)).result()
        _, other_key = stack.new_user()
        headers = {"authorization": f"Bearer {other_key}"}
        base = f"{stack.api_url}/v1/sessions/{training_client.id}"
        body = wire.encode({"op": "forward", "datums": []})
        answers = [
            httpx.get(base, headers=headers),
            httpx.post(f"{base}/heartbeat", headers=headers),
            httpx.post(f"{base}/calls", headers={**headers, "x-relay-seq": "99"}, content=body),
            httpx.get(f"{base}/calls/1", headers=headers, params={"wait": 0}),
            httpx.post(f"{base}/close", headers=headers),
        ]
        assert [a.status_code for a in answers] == [404] * 5
        assert answers[0].json()["error"]["message"] == f"no training session {training_client.id}"
        listed = httpx.get(f"{stack.api_url}/v1/sessions", headers=headers).json()
        assert listed["data"] == []
        training_client.forward(batch(0, 1)).result()  # still open for its owner


def test_a_retried_call_number_runs_once(stack: Stack, user: tuple[str, str], service: ServiceClient) -> None:
    """The client's call numbers make a resent call (its answer was lost) harmless."""
    data = [_wire_datum(d) for d in batch(0, 2)]
    with service.create_lora_training_client("pi05-tiny", rank=8) as reference:
        reference.forward_backward(batch(0, 2), "flow_matching")
        expected = reference.optim_step(types.AdamParams(learning_rate=LR)).result().metrics["grad_norm"]
    with service.create_lora_training_client("pi05-tiny", rank=8) as training_client:
        base = f"{stack.api_url}/v1/sessions/{training_client.id}/calls"
        headers = {"authorization": f"Bearer {user[1]}", "content-type": wire.MEDIA_TYPE}
        # This client's own numbering starts at 1 too; send as another client of the same session would.
        body = wire.encode({"op": "forward_backward", "datums": data})
        first = httpx.post(base, headers={**headers, "x-relay-seq": "1"}, content=body).json()
        again = httpx.post(base, headers={**headers, "x-relay-seq": "1"}, content=body).json()
        optim = wire.encode({"op": "optim_step", "adam": types.AdamParams(learning_rate=LR).to_dict()})
        httpx.post(base, headers={**headers, "x-relay-seq": "2"}, content=optim)
        assert (first["replayed"], again["replayed"]) == (False, True)
        answer = httpx.get(f"{base}/2", headers=headers, params={"wait": 30})
        result = wire.decode(answer.content)
        assert result["ok"] and result["value"]["metrics"]["grad_norm"] == pytest.approx(expected, rel=1e-6)
        garbage = httpx.post(base, headers={**headers, "x-relay-seq": "3"}, content=b"not a call")
        assert garbage.status_code == 400 and "RLY1" in garbage.json()["error"]["message"]
        training_client._calls._next_seq = 3  # the SDK client goes on after the numbers used above
        assert training_client.forward(batch(0, 1)).result()["velocity"].shape == (1, HORIZON, 32)


def _wire_datum(item: types.Datum) -> dict[str, Any]:
    return {"observation": item.observation, "actions": item.actions, "weight": item.weight}


def test_create_refuses_bad_settings_naming_the_field(stack: Stack, user: tuple[str, str]) -> None:
    headers = {"authorization": f"Bearer {user[1]}"}
    cases = [
        (
            {"base_model": "gpt-4"},
            'bad base_model: "gpt-4" (must be one of pi05, pi05-tiny, smolvla, smolvla-tiny, rt-j, '
            "rt-j-tiny)",
        ),
        ({"base_model": "pi05", "lora_rank": 0}, "bad lora_rank: 0 (must be an integer from 1 to 256)"),
        ({"base_model": "pi05", "rank": 0}, "bad lora_rank: 0 (must be an integer from 1 to 256)"),
        ({"base_model": "pi05", "targets": ["wings"]}, "unknown target 'wings'"),
        ({"base_model": "pi05", "codec": "png"}, 'bad codec: "png" (must be "lossless" or "jpeg_q95")'),
        ({"base_model": "pi05", "seed": 1}, "unknown field seed (a session's fields: base_model"),
        ([1, 2], "the body must be an object with a session's fields"),
    ]
    for body, message in cases:
        answer = httpx.post(f"{stack.api_url}/v1/sessions", headers=headers, json=body)
        assert answer.status_code == 400, body
        assert message in answer.json()["error"]["message"], answer.json()


def test_sessions_created_or_stored_with_the_former_names_read_as_lora_rank(
    stack: Stack, user: tuple[str, str]
) -> None:
    from sqlalchemy import update

    from relay_api.models import TrainingSessionRow

    headers = {"authorization": f"Bearer {user[1]}"}
    with httpx.Client(base_url=stack.parked_api_url, headers=headers) as http:
        created = http.post("/v1/sessions", json={"base_model": "pi05-tiny", "rank": 8, "alpha": 4})
        assert created.status_code in (200, 201), created.text
        session = created.json()
        assert (session["lora_rank"], session["lora_alpha"]) == (8, 4.0) and "rank" not in session
        try:
            # A row stored before the rename still says rank/alpha.
            with stack.sessions() as db:
                stored = {
                    "base_model": "pi05-tiny",
                    "finetune": "lora",
                    "rank": 8,
                    "alpha": 4.0,
                    "targets": session["targets"],
                    "action_horizon": session["action_horizon"],
                    "codec": "lossless",
                }
                db.execute(
                    update(TrainingSessionRow)
                    .where(TrainingSessionRow.id == session["id"])
                    .values(config=stored)
                )
                db.commit()
            shown = http.get(f"/v1/sessions/{session['id']}").json()
            assert (shown["lora_rank"], shown["lora_alpha"]) == (8, 4.0) and "rank" not in shown
        finally:
            http.post(f"/v1/sessions/{session['id']}/close")
