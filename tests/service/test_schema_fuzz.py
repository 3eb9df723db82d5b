"""Schemathesis over /openapi.json, with a valid key, bounded: a fixed seed, a few dozen cases per
operation and generation mode (well-formed requests, and requests the document says are not), a
time limit. Every check schemathesis has (`--checks all`) must pass, with the settings in
schemathesis.toml: no 5xx, and every answer (status, headers, body) as the document says."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis import checks as st_checks
from schemathesis.config import SchemathesisConfig

from relay.checkpoints import is_fine_tune_id
from relay.dataset_names import DATABASE_URL_PATTERN, names_local_directory
from relay_api.app import create_app
from tests.hub import FakeHub
from tests.service.stack import PARKED_QUEUE, Stack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CASES_PER_OPERATION = 25
TIME_LIMIT_SECONDS = 75.0
# Every check schemathesis has (`--checks all`): the OpenAPI ones register once loaded.
st_checks.load_all_checks()
CHECKS = st_checks.CHECKS.get_all()


@pytest.fixture(scope="module")
def app_and_key(stack: Stack) -> Iterator[tuple[object, str]]:
    # Jobs and sessions go to queues no worker reads: they stay queued or starting.
    parked = stack.settings.model_copy(
        update={
            "fine_tune_queue": PARKED_QUEUE,
            "session_queue": PARKED_QUEUE + "-sessions",
            "dataset_cache_dir": stack.root / "cache",
            # Every well-formed POST /v1/webhooks of the run is created, for one user.
            "webhooks_per_user": 10_000,
        }
    )
    app = create_app(parked)
    # The datasets it is asked to describe are looked for on a loopback Hub that has none (the Hub
    # itself cannot be reached from tests: that would be a 502).
    with FakeHub() as hub, pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_ENDPOINT", hub.endpoint)
        with TestClient(app):  # runs the app's lifespan
            yield app, stack.new_user()[1]


def adjust(case: schemathesis.Case) -> None:
    """What no schema can say, taken out of a well-formed case. (A malformed one is left as it is:
    it may be malformed in just that field, and the API refuses it before it streams or waits.)"""
    if case.query and str(case.query.get("stream", "")).lower() in ("true", "1"):
        case.query["stream"] = "false"  # a live stream of a queued job never ends
    if case.query and "wait" in case.query:
        case.query["wait"] = 0  # a long-poll of a call that never runs waits it out
    if isinstance(case.body, dict) and case.operation.path == "/v1/fine-tunes":
        _adjust_recipe(case.body)

    # A receiver's URL must also parse (a host, a port from 1 to 65535, no spaces or control
    # characters), which the document's pattern states only in part; tests/service/test_webhooks.py
    # covers those refusals.
    if (
        isinstance(case.body, dict)
        and case.operation.path == "/v1/webhooks"
        and isinstance(case.body.get("url"), str)
    ):
        case.body["url"] = "https://receiver.example.com/relay"


def _adjust_recipe(body: dict[str, Any]) -> None:
    """What no schema can say, taken out of a well-formed recipe (POST /v1/fine-tunes)."""
    # How many GPUs a job may have depends on the workers alive and on batch_size (a 400 when
    # no worker has enough, or gpus > batch_size), which JSON Schema cannot state;
    # tests/service cover gpus on their own.
    body.pop("gpus", None)
    # An episodes text is refused for a range that runs backwards ("9-0") or an episode named
    # twice ("0-9,5"), which no pattern states; tests/sdk/test_validation_episodes.py covers them.
    if isinstance(body.get("validation_episodes"), str):
        body.pop("validation_episodes")
    # At most one integration of each type, which the document states only in words (no
    # generator reads `not` over `contains`); tests/sdk/test_integrations.py covers the refusal.
    if isinstance(body.get("integrations"), list):
        body["integrations"] = _with_parsing_urls(_one_of_each(body["integrations"]))
    # A database URL must also parse (brackets closed, a port from 1 to 65535: no pattern says
    # it), and a SQLite one name an absolute path on the workers' disk; tests/sdk and
    # tests/service/test_database_jobs.py cover those refusals.
    if isinstance(body.get("dataset_name"), str) and re.fullmatch(DATABASE_URL_PATTERN, body["dataset_name"]):
        body["dataset_name"] = "postgresql://relay@db.invalid/shop"
    # A mixture names each dataset once (by name and revision), and its dataset_name, if given,
    # is its first dataset's, which no schema states; tests/service/test_mixture_jobs.py covers
    # those refusals.
    if isinstance(body.get("datasets"), list):
        _one_mixture(body)
    # A checkpoint that is a fine-tune's id or a directory must exist (a completed job of the
    # caller's; a directory on the workers' disk), which no schema states;
    # tests/service/test_from_checkpoint.py covers those refusals. A Hub repo is left in.
    checkpoint = body.get("from_checkpoint")
    if isinstance(checkpoint, str) and (is_fine_tune_id(checkpoint) or names_local_directory(checkpoint)):
        body.pop("from_checkpoint")
        if body.get("normalization") == "checkpoint":
            body.pop("normalization")
    # An eval block's budget is a product of its episodes, max_steps, at_checkpoints and the
    # job's steps, which no schema states; tests/sdk/test_job_eval.py covers it.
    if isinstance(body.get("eval"), dict):
        for field in ("episodes", "max_steps", "at_checkpoints"):
            body["eval"].pop(field, None)


def _one_mixture(body: dict[str, Any]) -> None:
    """The body's datasets with each (name, revision) once, and its dataset_name the first's (or no
    datasets, where fewer than two are left)."""
    kept: dict[Any, Any] = {}
    for item in body["datasets"]:
        if isinstance(item, dict):
            kept.setdefault((item.get("name"), item.get("revision")), item)
    if len(kept) < 2:
        body.pop("datasets")
        return
    body["datasets"] = list(kept.values())
    if "dataset_name" in body:
        body["dataset_name"] = body["datasets"][0].get("name")


def _one_of_each(integrations: list[Any]) -> list[Any]:
    """The first integration of each type, in order."""
    kept: dict[Any, Any] = {}
    for item in integrations:
        kept.setdefault(item.get("type") if isinstance(item, dict) else None, item)
    return list(kept.values())


def _with_parsing_urls(integrations: list[Any]) -> list[Any]:
    """An MLflow tracking_uri must also parse (a host, no user or password in it), which its
    pattern states only in part; tests/sdk/test_integrations.py covers those refusals."""
    for item in integrations:
        settings = item.get("mlflow") if isinstance(item, dict) else None
        if isinstance(settings, dict) and isinstance(settings.get("tracking_uri"), str):
            settings["tracking_uri"] = "https://mlflow.example.com"
    return integrations


def fuzz(operation: Any, mode: GenerationMode, headers: dict[str, str]) -> int:
    """Run one operation's cases of one generation mode through every check; how many ran."""
    ran = 0

    @seed(20261130)
    @settings(
        max_examples=CASES_PER_OPERATION,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        nonlocal ran
        ran += 1
        if mode is GenerationMode.POSITIVE:
            adjust(case)
        # Spelled as the security scheme names it: ignored_auth sends the case again without the
        # key, and with a wrong one, expecting a 401.
        case.call_and_validate(headers=headers, checks=CHECKS)

    try:
        run()
    except Unsatisfiable:  # nothing of it can be malformed (GET /v1/states has no parameters)
        assert mode is GenerationMode.NEGATIVE and ran == 0, operation.label
    return ran


def test_every_operation_answers_as_its_schema_says(app_and_key: tuple[object, str]) -> None:
    app, key = app_and_key
    config = SchemathesisConfig.from_path(str(ROOT / "schemathesis.toml"))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    headers = {"Authorization": f"Bearer {key}"}  # as the security scheme names it
    deadline = time.monotonic() + TIME_LIMIT_SECONDS
    cases = dict.fromkeys(GenerationMode, 0)
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        for mode in GenerationMode:
            if time.monotonic() < deadline:
                cases[mode] += fuzz(operation, mode, headers)
    print(f"\nschemathesis: {cases} cases over {len(operations)} operations, checks: {len(CHECKS)}")
    assert len(CHECKS) >= 14, [check.__name__ for check in CHECKS]
    assert cases[GenerationMode.POSITIVE] >= 150 and cases[GenerationMode.NEGATIVE] >= 100
