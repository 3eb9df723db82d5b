"""The session examples of docs/sessions.md (and the README's session block), as written, against
the served API and a real worker.

Only what this machine needs is changed: base_model="pi05-tiny", small frames, a few steps. The SDK
finds the API and the key in RELAY_BASE_URL / RELAY_API_KEY.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests.service.sessions_data import batch as make_batch
from tests.service.stack import Stack, WorkerProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sdk_env(
    monkeypatch: pytest.MonkeyPatch,
    stack: Stack,
    user: tuple[str, str],
    tmp_path: Path,
    worker: WorkerProcess,
) -> str:
    monkeypatch.setenv("RELAY_BASE_URL", stack.api_url)
    monkeypatch.setenv("RELAY_API_KEY", user[1])
    monkeypatch.setenv("RELAY_HOME", str(tmp_path / "no-client-file-here"))
    return user[1]


def test_the_training_loop(sdk_env: str, capsys: pytest.CaptureFixture[str]) -> None:
    batches = [make_batch(2 * step, 2) for step in range(3)]
    observation = batches[0][0].observation

    from relay.training import ServiceClient, types

    service_client = ServiceClient()
    training_client = service_client.create_lora_training_client(base_model="pi05-tiny", rank=32)

    for step, batch in enumerate(batches):  # lists of types.Datum
        fwd_bwd = training_client.forward_backward(batch, "flow_matching")
        optim = training_client.optim_step(types.AdamParams(learning_rate=1e-4))
        if step % 100 == 0:
            print(step, fwd_bwd.result().metrics["loss"])

    sampling_client = training_client.save_weights_and_get_sampling_client("step-1000")
    actions = sampling_client.sample(observation).result()
    training_client.close()

    assert re.fullmatch(r"0 \d+\.\d+(e-?\d+)?\n", capsys.readouterr().out)
    assert optim.result().metrics["skipped"] is False
    assert actions.shape == (10, 32)


def test_sessions_data_and_steps(sdk_env: str) -> None:
    import relay
    from relay.training import ServiceClient, types

    rng = np.random.default_rng(0)
    front = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
    wrist = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
    state = rng.uniform(-1, 1, 8).astype(np.float32)
    chunk = rng.uniform(-1, 1, (10, 7)).astype(np.float32)

    service_client = ServiceClient()
    with service_client.create_lora_training_client(
        "pi05-tiny", codec=relay.Codec.JPEG_Q95
    ) as training_client:
        info = training_client.info
        datum = types.Datum(
            observation={
                "image": {"base_0_rgb": front, "left_wrist_0_rgb": wrist},  # (H, W, 3) uint8
                "state": state,  # up to 32 values
                "prompt": "pick up the fork",
            },
            actions=chunk,  # (action_horizon, up to 32)
            weight=1.0,  # in the loss's mean
        )
        batch = [
            datum,
            types.Datum(
                observation={"image": {"base_0_rgb": front}, "state": state, "prompt": "pick up the fork"},
                actions=chunk,
                weight=0.5,
            ),
        ]

        fwd_bwd = training_client.forward_backward(batch, "flow_matching")
        metrics = fwd_bwd.result().metrics  # {"loss": 0.21}
        outputs = fwd_bwd.result().loss_fn_outputs  # [{"loss": 0.19}, {"loss": 0.24}, ...], per datum

        optim = training_client.optim_step(types.AdamParams(learning_rate=1e-4))
        step = optim.result().metrics  # {"grad_norm": 0.46, "skipped": False}

    assert info["model"] == "pi05-tiny" and info["action_horizon"] == 10 and info["action_dim"] == 32
    assert info["trainable_params"] > 0
    assert set(metrics) == {"loss"} and len(outputs) == 2 and set(outputs[0]) == {"loss"}
    assert metrics["loss"] == pytest.approx((outputs[0]["loss"] + 0.5 * outputs[1]["loss"]) / 1.5, rel=1e-5)
    assert set(step) == {"grad_norm", "skipped"} and step["skipped"] is False and step["grad_norm"] > 0


def test_custom_losses_forward_and_sampling(sdk_env: str) -> None:
    import torch

    from relay.training import ServiceClient

    batch = make_batch(0, 3)
    obs_a, obs_b = batch[0].observation, batch[1].observation
    service_client = ServiceClient()
    with service_client.create_full_training_client("pi05-tiny", targets=["heads"]) as training_client:

        def loss_fn(data, outputs):  # type: ignore[no-untyped-def]
            error = (outputs["velocity"] - outputs["target"]).square()  # (B, action_horizon, 32)
            weights = torch.linspace(2, 1, error.shape[1])  # near-term actions count more
            loss = (error.mean(-1) * weights).mean()
            return loss, {"weighted": loss.item()}

        fwd_bwd = training_client.forward_backward_custom(batch, loss_fn)
        result = fwd_bwd.result()

        outputs = training_client.forward(batch).result()

        actions = training_client.sample(obs_a).result()  # (action_horizon, 32), with the weights now
        both = training_client.sample([obs_a, obs_b], num_steps=10).result()  # (2, action_horizon, 32)

    assert result.metrics["weighted"] == pytest.approx(result.metrics["loss"])
    assert set(outputs) == {"velocity", "target", "x_t", "noise", "time"}
    assert outputs["velocity"].shape == (3, 10, 32) and outputs["time"].shape == (3,)
    assert actions.shape == (10, 32) and both.shape == (2, 10, 32)


def test_saving_and_resuming(sdk_env: str) -> None:
    from relay.training import ServiceClient

    batch = make_batch(0, 2)
    service_client = ServiceClient()
    training_client = service_client.create_lora_training_client("pi05-tiny", rank=32)
    training_client.forward_backward(batch, "flow_matching")
    training_client.save_state("step-5000").result()  # the trainable weights and the optimizer
    training_client.close()

    # later, in a new session with the same model and targets
    training_client = service_client.create_lora_training_client("pi05-tiny", rank=32)
    loaded = training_client.load_state("step-5000").result()
    training_client.close()
    assert loaded.name == "step-5000"


# The README's session block runs as written in tests/test_doc_blocks.py (with every other block).
