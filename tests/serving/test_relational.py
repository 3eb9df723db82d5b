"""A tuned RT-J served by the same policy server: predictions for entity rows of the database it
was trained on, equal to the engine's own for the same rows; bad rows refused naming the field;
the pi05 endpoints refused (and the converse); `relay serve RTJ_OUTPUT_DIR`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import websockets.sync.client
from websockets.exceptions import InvalidStatus

from relay.sft.config import SFTConfig
from relay_engine.errors import ConfigError
from relay_engine.families.rtj.database import seconds
from relay_engine.families.rtj.evaluate import predict_scores
from relay_engine.families.rtj.family import build_sampler, context_settings
from relay_engine.families.rtj.synth import write_fake_shop
from relay_engine.recipe import Recipe, run_recipe
from relay_engine.relational import RelationalTransformer
from relay_engine.serving import load_served_model
from relay_engine.serving.relational import format_time
from relay_worker.serving.server import RunningPolicyServer, ServingOptions, start_policy_server

from .conftest import KEY

AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def rtj_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A completed rt-j-tiny job's output on a small shop database (a few steps: enough to move the
    decoders off zero, where every context scores the same)."""
    root = tmp_path_factory.mktemp("rtj")
    shop = write_fake_shop(root / "shop", customers=40, reviews=240)
    config = SFTConfig(
        model="rt-j-tiny",
        dataset_name=str(shop),
        task="user-churn",
        batch_size=8,
        steps=6,
        learning_rate=1e-2,
    )
    recipe = Recipe.from_config(config, checkpoint_every=6, log_every=6, device="cpu")
    result = run_recipe(recipe, root / "work", on_event=lambda e: None, should_stop=lambda: False)
    assert result.status == "completed" and result.output_dir is not None
    return result.output_dir


@pytest.fixture(scope="module")
def rtj_server(rtj_output: Path) -> Iterator[RunningPolicyServer]:
    options = ServingOptions(max_batch=8, max_wait_ms=20.0, device="cpu")
    running = start_policy_server(rtj_output, token=KEY, options=options)
    yield running
    running.stop()


def _predict(server: RunningPolicyServer, body: Any, headers: dict[str, str] = AUTH) -> httpx.Response:
    return httpx.post(f"{server.url}/predictions", json=body, headers=headers, timeout=60)


def _engine_predictions(output: Path, split: str) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The split's rows as a client addresses them, and the engine's scores for them as `relay
    local eval` makes them (its sampler, its contexts, one forward pass)."""
    model = RelationalTransformer(str(output), device="cpu")
    sampler = build_sampler(
        model.config["relay"]["dataset"], "user-churn", context_settings(model.config), 384, seed=0
    )
    rows = sampler.splits[split]
    times = seconds(rows.column("timestamp"))
    addressed = [
        {"table": "customer", "primary_key": key, "time": format_time(float(at))}
        for key, at in zip(rows.column("customer_id").to_pylist(), times, strict=True)
    ]
    return addressed, predict_scores(model, sampler.examples(split))


def test_predictions_equal_the_engines_own_for_the_same_rows(
    rtj_server: RunningPolicyServer, rtj_output: Path
) -> None:
    rows, scores = _engine_predictions(rtj_output, "val")
    assert len(rows) > 3 and np.ptp(scores) > 1e-4, "a tuned model scores contexts differently"
    answer = _predict(rtj_server, {"rows": rows})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    served = body["predictions"]
    assert [(p["primary_key"], p["time"]) for p in served] == [(r["primary_key"], r["time"]) for r in rows]
    np.testing.assert_allclose([p["score"] for p in served], scores, rtol=0, atol=1e-5)
    np.testing.assert_allclose(
        [p["prediction"] for p in served], 1 / (1 + np.exp(-scores)), rtol=0, atol=1e-5
    )
    assert set(body["timing"]) == {"decode_ms", "preprocess_ms", "model_ms", "postprocess_ms", "total_ms"}

    # One row alone, the table left out: the same prediction as in the batch.
    alone = _predict(rtj_server, {"rows": [{"primary_key": rows[2]["primary_key"], "time": rows[2]["time"]}]})
    assert alone.status_code == 200, alone.text
    assert alone.json()["predictions"][0]["score"] == pytest.approx(scores[2], abs=1e-5)

    # No time: the database's latest, which the metadata states.
    latest = _predict(rtj_server, {"rows": [{"primary_key": "customer_1"}]}).json()["predictions"][0]
    assert latest["time"] == rtj_server.metadata["latest_time"]
    assert 0 < latest["prediction"] < 1
    assert rtj_server.stats()["requests"] >= len(rows) + 2


def test_metadata_names_the_task_its_target_and_the_tables(rtj_server: RunningPolicyServer) -> None:
    metadata = httpx.get(f"{rtj_server.url}/metadata", headers=AUTH).json()
    assert metadata["kind"] == "rt-j" and metadata["answers"] == "predictions"
    assert metadata["task"] == "user-churn"
    assert metadata["problem_type"] == "binary"
    assert metadata["target"] == {"table": "user-churn", "column": "churn"}
    assert metadata["entity"] == {"table": "customer", "primary_key": "customer_id"}
    assert set(metadata["tables"]) == {"product", "customer", "review", "relations"}
    assert metadata["tables"]["customer"]["rows"] == 40
    assert metadata["tables"]["review"]["foreign_keys"] == {
        "customer_id": "customer",
        "product_id": "product",
    }


@pytest.mark.parametrize(
    ("rows", "status", "param", "words"),
    [
        ([{"primary_key": "customer_999"}], 404, "rows[0].primary_key", "customer has no row with"),
        ([{"primary_key": "customer_1"}, {"primary_key": 7}], 400, "rows[1].primary_key", "must be a string"),
        ([{"table": "shelf", "primary_key": "x"}], 404, "rows[0].table", "no table 'shelf'"),
        ([{"table": "review", "primary_key": "x"}], 400, "rows[0].table", "predicts rows of customer"),
        ([{"primary_key": "customer_1", "time": "soon"}], 400, "rows[0].time", "not an ISO 8601"),
        ([{"time": "2021-01-01"}], 400, "rows[0].primary_key", "missing"),
        ([{"primary_key": "customer_1", "label": 1}], 400, "rows[0].label", "unknown field"),
        (["customer_1"], 400, "rows[0]", "must be an object"),
        ([], 400, "rows", "a list of 1 to"),
    ],
)
def test_a_bad_row_is_refused_naming_the_field(
    rtj_server: RunningPolicyServer, rows: list[Any], status: int, param: str, words: str
) -> None:
    answer = _predict(rtj_server, {"rows": rows})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_the_body_and_the_key_are_checked(rtj_server: RunningPolicyServer) -> None:
    assert _predict(rtj_server, {"rows": [{"primary_key": "customer_1"}]}, headers={}).status_code == 401
    answer = _predict(rtj_server, {"rows": [{"primary_key": "customer_1"}], "seed": 3})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "seed"
    answer = httpx.post(f"{rtj_server.url}/predictions", content=b"{", headers=AUTH)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_body"


def test_each_kind_refuses_the_others_endpoints(
    rtj_server: RunningPolicyServer, server: RunningPolicyServer
) -> None:
    actions = httpx.post(f"{rtj_server.url}/actions", json={"observation": {}}, headers=AUTH)
    assert actions.status_code == 400
    assert actions.json()["error"]["message"] == "this deployment serves an RT-J model: POST /predictions"
    websocket = "ws" + rtj_server.url.removeprefix("http") + "/"
    with pytest.raises(InvalidStatus) as refused:
        websockets.sync.client.connect(websocket, additional_headers=AUTH)
    assert refused.value.response.status_code == 400
    assert b"POST /predictions" in refused.value.response.body

    predictions = _predict(server, {"rows": [{"primary_key": "customer_1"}]})
    assert predictions.status_code == 400
    assert "serves a robot policy: POST /actions" in predictions.json()["error"]["message"]


def test_the_database_is_the_recorded_one_unless_named(rtj_output: Path, tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    shutil.copytree(rtj_output, moved)
    config = json.loads((moved / "config.json").read_text())
    database = config["relay"]["dataset"]
    config["relay"]["dataset"] = str(tmp_path / "gone")
    (moved / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as missing:
        load_served_model(moved, device="cpu")
    assert missing.value.param == "database" and "relay serve --database DIR" in missing.value.message
    served = load_served_model(moved, device="cpu", database=database)
    assert served.metadata()["database"] == str(Path(database))
    with pytest.raises(ConfigError) as refused:
        load_served_model("pi05-tiny", device="cpu", database=database)
    assert refused.value.param == "database"


@pytest.mark.slow
def test_relay_serve_answers_predictions_like_the_server(
    rtj_output: Path, rtj_server: RunningPolicyServer, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RELAY_SERVE_API_KEY": KEY}
    command = [sys.executable, "-m", "relay.cli", "serve", str(rtj_output), "--port", "0", "--device", "cpu"]
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while not lines or not lines[-1].strip().startswith("-d "):
            lines.append(process.stdout.readline())
            assert lines[-1], f"relay serve ended before it served: {lines}"
        url = next(line.split()[1] for line in lines if line.strip().startswith("HTTP:"))
        assert url.endswith("/predictions") and any("user-churn (binary)" in line for line in lines)
        body = {"rows": [{"primary_key": "customer_3"}, {"primary_key": "customer_5", "time": "1971-01-01"}]}
        served = httpx.post(url, json=body, headers=AUTH, timeout=60)
        assert served.status_code == 200, served.text
        expected = _predict(rtj_server, body).json()["predictions"]
        assert [p["time"] for p in served.json()["predictions"]] == [p["time"] for p in expected]
        np.testing.assert_allclose(
            [p["score"] for p in served.json()["predictions"]], [p["score"] for p in expected], atol=1e-5
        )
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0


def test_a_regression_task_is_predicted_in_the_labels_units(rtj_output: Path, tmp_path: Path) -> None:
    """user-ltv: the served value is the engine's z-scored score turned back with the train
    split's mean and std, as `relay local eval` scores it."""
    shop = json.loads((rtj_output / "config.json").read_text())["relay"]["dataset"]
    config = SFTConfig(
        model="rt-j-tiny", dataset_name=shop, task="user-ltv", batch_size=8, steps=3, learning_rate=1e-2
    )
    recipe = Recipe.from_config(config, checkpoint_every=3, log_every=3, device="cpu")
    result = run_recipe(recipe, tmp_path / "work", on_event=lambda e: None, should_stop=lambda: False)
    assert result.output_dir is not None
    served = load_served_model(result.output_dir, device="cpu")
    model = RelationalTransformer(str(result.output_dir), device="cpu")
    sampler = build_sampler(shop, "user-ltv", context_settings(model.config), 384, seed=0)
    rows = sampler.splits["test"]
    times = seconds(rows.column("timestamp"))
    decoded = [
        served.decode({"primary_key": key, "time": format_time(float(at))}, f"rows[{i}]")
        for i, (key, at) in enumerate(zip(rows.column("customer_id").to_pylist(), times, strict=True))
    ]
    predictions = served.act(decoded, [None] * len(decoded))
    expected = predict_scores(model, sampler.examples("test"))
    scale = sampler.label_scale
    assert served.metadata()["problem_type"] == "regression" and scale.std > 0
    np.testing.assert_allclose([p.score for p in predictions], expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(
        [p.prediction for p in predictions], expected * scale.std + scale.mean, rtol=1e-6, atol=1e-5
    )
