"""A recipe's MLflow integration (relay_engine.trackers) against a real ``mlflow server`` (mlflow
3.17.2, from the test-only venv ``.venv-mlflow``; scripts/test.sh makes it), read back through the
server's own REST API: one run over a stop and a resume, each step's loss once and equal to the
job's metrics events, the recipe as params, the run FINISHED; and a tracking server that cannot be
reached, which costs the run one warning event and nothing else."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from relay.events import TrackerEvent, parse_event
from relay_engine.recipe import run_recipe
from tests.engine.training.test_recipe import losses, recipe_for, run
from tests.engine.training.test_trackers import closed_port

ROOT = Path(__file__).resolve().parents[3]
MLFLOW = ROOT / ".venv-mlflow" / "bin" / "mlflow"
MLFLOW_VERSION = "3.17.2"
# Not a real token: what the test looks for in every file and event the run leaves.
FAKE_TOKEN = "m1fl0w" * 8
JOB_ID = "ftjob-mlflow-1"


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A tracking server on a free port with a SQLite store in the test's directory; its URL."""
    if not MLFLOW.exists():
        # A failure, never a skip: a skipped test would hide that the MLflow sink went untested.
        pytest.fail(
            f"{MLFLOW} is missing: make the test-only venv with `python3 -m venv .venv-mlflow && "
            f".venv-mlflow/bin/pip install mlflow=={MLFLOW_VERSION}` (scripts/test.sh does)"
        )
    port = closed_port()
    store = tmp_path / "mlflow-server"
    store.mkdir()
    log_path = store / "server.log"
    command = [str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}"]
    command += ["--default-artifact-root", str(store / "artifacts")]
    with log_path.open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=store)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                pytest.fail(f"mlflow server exited {server.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not answer /health:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def rest(url: str, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    endpoint = f"{url}/api/2.0/mlflow/{path}"
    response = httpx.get(endpoint, params=body) if method == "GET" else httpx.post(endpoint, json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def history(url: str, run_id: str, key: str) -> list[tuple[int, float]]:
    found = rest(url, "GET", "metrics/get-history", {"run_id": run_id, "metric_key": key})
    return sorted((int(m.get("step", 0)), float(m["value"])) for m in found.get("metrics", []))


def test_a_stopped_and_resumed_job_logs_each_step_once_to_one_mlflow_run(
    synthetic_dataset_path: Path,
    dataset_cache: Path,
    tmp_path: Path,
    mlflow_server: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # MLflow's client reads a token from the environment; the server here takes any, and the test
    # checks it is never written anywhere.
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", FAKE_TOKEN)
    integrations = [
        {"type": "mlflow", "mlflow": {"tracking_uri": mlflow_server, "experiment": "relay-tests"}}
    ]
    work = tmp_path / "job"
    first_recipe = recipe_for(synthetic_dataset_path, integrations=integrations, job_id=JOB_ID, attempt=1)
    # Stop after step 6: the last checkpoint is step 4, so steps 5 and 6 are trained again.
    first, first_events = run(first_recipe, work, dataset_cache, stop_after=6)
    assert first.status == "stopped" and first.step == 6
    kept = json.loads((work / "trackers" / "mlflow.json").read_text())
    assert kept["step"] == 6
    stopped = rest(mlflow_server, "GET", "runs/get", {"run_id": kept["run_id"]})
    assert stopped["run"]["info"]["status"] == "KILLED"  # a stopped run, until its resume reopens it
    recipe = recipe_for(synthetic_dataset_path, integrations=integrations, job_id=JOB_ID, attempt=2)
    second, second_events = run(recipe, work, dataset_cache)
    assert second.status == "completed" and second.resumed_from == 4
    events = first_events + second_events
    assert not [e for e in events if e.kind == TrackerEvent.kind]
    job_losses = {**losses(first_events), **losses(second_events)}
    assert sorted(job_losses) == list(range(1, 13))

    # One run in the experiment, found by the job's tag, the one the work directory keeps.
    experiment = rest(mlflow_server, "GET", "experiments/get-by-name", {"experiment_name": "relay-tests"})
    experiment_id = experiment["experiment"]["experiment_id"]
    everything = rest(mlflow_server, "POST", "runs/search", {"experiment_ids": [experiment_id]})
    assert len(everything["runs"]) == 1
    tagged = rest(
        mlflow_server,
        "POST",
        "runs/search",
        {"experiment_ids": [experiment_id], "filter": f"tags.`relay.job_id` = '{JOB_ID}'"},
    )
    (found,) = tagged["runs"]
    run_id = found["info"]["run_id"]
    assert run_id == kept["run_id"]
    assert found["info"]["status"] == "FINISHED" and found["info"].get("end_time")

    # train/loss: every step once, equal to the job's metrics events (5 and 6 from the stopped run,
    # which the exact resume trains to the same figures).
    logged = history(mlflow_server, run_id, "train/loss")
    assert [step for step, _ in logged] == list(range(1, 13)), logged
    first_losses = losses(first_events)
    for step, value in logged:
        expected = first_losses[step] if step <= 6 else job_losses[step]
        assert value == pytest.approx(expected, rel=1e-9), step
        assert value == pytest.approx(job_losses[step], abs=1e-6), step
    assert [step for step, _ in history(mlflow_server, run_id, "checkpoint/seconds")] == [4, 8, 12]

    # The recipe as params (set once), the rest of the run's config and its summary as tags.
    params = {p["key"]: p["value"] for p in found["data"].get("params", [])}
    assert params["model"] == "pi05-tiny" and params["steps"] == "12" and params["batch_size"] == "4"
    assert params["dataset_name"] == str(synthetic_dataset_path)
    assert json.loads(params["integrations"]) == recipe.config.model_dump(mode="json")["integrations"]
    tags = {t["key"]: t["value"] for t in found["data"].get("tags", [])}
    assert tags["relay.job_id"] == JOB_ID and tags["relay.attempt"] == "2"
    assert tags["relay.resumed_from"] == "4"
    assert json.loads(tags["relay.dataset"])["path"] == str(synthetic_dataset_path)
    assert tags["relay.summary.status"] == "completed" and tags["relay.summary.step"] == "12"
    assert float(tags["relay.summary.final_loss"]) == pytest.approx(second.loss)

    # The token of the environment is in no file the run left and no event.
    for path in work.rglob("*"):
        if path.is_file():
            assert FAKE_TOKEN.encode() not in path.read_bytes(), path
    assert FAKE_TOKEN not in str(events)


def test_an_unreachable_mlflow_server_costs_one_warning_and_the_job_completes(
    synthetic_dataset_path: Path, dataset_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_TRACKER_FLUSH_SECONDS", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "relay")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", FAKE_TOKEN)
    uri = f"http://127.0.0.1:{closed_port()}"
    integrations = [{"type": "tensorboard"}, {"type": "mlflow", "mlflow": {"tracking_uri": uri}}]
    recipe = recipe_for(synthetic_dataset_path, integrations=integrations, steps=8, checkpoint_every=4)
    result, events = run(recipe, tmp_path / "job", dataset_cache)

    assert result.status == "completed" and result.step == 8
    warnings = [parse_event(e) for e in events if e.kind == TrackerEvent.kind]
    assert len(warnings) == 1, warnings
    (warning,) = warnings
    assert warning.tracker == "mlflow" and "could not be opened" in warning.message
    assert FAKE_TOKEN not in str(events)
    for path in (tmp_path / "job").rglob("*"):
        if path.is_file():
            assert FAKE_TOKEN.encode() not in path.read_bytes(), path


def test_the_sink_keeps_mlflows_batch_limits_and_finds_its_run_by_the_jobs_tag(
    mlflow_server: str, tmp_path: Path
) -> None:
    """The sink on its own against the server: more params and metrics than one log-batch takes,
    a NaN, and an attempt whose work directory lost ``trackers/mlflow.json`` finding the run by
    its ``relay.job_id`` tag, with the steps it holds taken as sent."""
    from relay.integrations import MlflowIntegration
    from relay_engine.trackers import _Mlflow

    entry = MlflowIntegration.parse(
        {"type": "mlflow", "mlflow": {"tracking_uri": mlflow_server, "experiment": "limits"}}
    )
    recipe = {f"field_{i:03d}": i for i in range(250)} | {"long": "x" * 7000}
    first = _Mlflow(entry, tmp_path, "ftjob-limits", "limits")
    first.open({"recipe": recipe, "job_id": "ftjob-limits", "attempt": 1})
    first.scalars(1, {f"m/{i:04d}": float(i) for i in range(1500)} | {"train/loss": float("nan")})
    first.scalars(2, {"train/loss": 0.5})
    first.summary({"status": "stopped", "step": 2})
    first.close()
    run_id = first.run_id
    assert run_id is not None
    found = rest(mlflow_server, "GET", "runs/get", {"run_id": run_id})["run"]
    params = {p["key"]: p["value"] for p in found["data"]["params"]}
    assert len(params) == 251 and params["field_249"] == "249" and len(params["long"]) == 6000
    metrics = {m["key"]: m for m in found["data"]["metrics"]}
    assert len(metrics) == 1501 and metrics["m/1499"]["value"] == 1499.0
    assert [step for step, _ in history(mlflow_server, run_id, "train/loss")] == [1, 2]
    assert found["info"]["status"] == "KILLED"

    (tmp_path / "trackers" / "mlflow.json").unlink()
    second = _Mlflow(entry, tmp_path, "ftjob-limits", "limits")
    second.open({"recipe": recipe, "job_id": "ftjob-limits", "attempt": 2})
    assert second.run_id == run_id and second.sent_through == 2
    second.scalars(2, {"train/loss": 0.25})  # trained again after a resume: not sent twice
    second.scalars(3, {"train/loss": 0.125})
    second.summary({"status": "completed", "step": 3})
    second.close()
    assert [step for step, _ in history(mlflow_server, run_id, "train/loss")] == [1, 2, 3]
    again = rest(mlflow_server, "GET", "runs/get", {"run_id": run_id})["run"]
    assert again["info"]["status"] == "FINISHED"
    tags = {t["key"]: t["value"] for t in again["data"]["tags"]}
    assert tags["relay.attempt"] == "2" and tags["relay.summary.status"] == "completed"


def test_a_token_in_the_recipe_is_the_trackers_over_the_environments(
    synthetic_dataset_path: Path,
    dataset_cache: Path,
    tmp_path: Path,
    mlflow_server: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A local run whose recipe carries mlflow.token logs with it, not with the environment's token;
    a run given the service's held keys (run_recipe's tracker_secrets) logs with those; neither
    token is written to any file or event of the run."""
    from tests.recording_proxy import RecordingProxy

    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", FAKE_TOKEN)
    given, held = "recipe-token-" + "1" * 20, "held-token-" + "2" * 20
    with RecordingProxy(mlflow_server) as proxy:
        mlflow = {"tracking_uri": proxy.url, "experiment": "keys"}
        own = recipe_for(
            synthetic_dataset_path,
            steps=2,
            integrations=[{"type": "mlflow", "mlflow": {**mlflow, "token": given}}],
        )
        _, own_events = run(own, tmp_path / "own", dataset_cache)
        assert set(proxy.authorizations) == {f"Bearer {given}"}
        proxy.authorizations.clear()
        service = recipe_for(
            synthetic_dataset_path, steps=2, integrations=[{"type": "mlflow", "mlflow": mlflow}]
        )
        events: list[Any] = []
        run_recipe(
            service,
            tmp_path / "service",
            on_event=events.append,
            should_stop=lambda: False,
            dataset_cache_dir=dataset_cache,
            tracker_secrets={"MLFLOW_TRACKING_TOKEN": held},
        )
        assert set(proxy.authorizations) == {f"Bearer {held}"}
    for token in (given, held):
        assert token not in str(own_events + events)
        for path in tmp_path.rglob("*"):
            if path.is_file():
                assert token.encode() not in path.read_bytes(), path
