"""docker-compose.yml, docker-compose.gpu.yml, the Dockerfile and .env.example, read: the services
and their order, the GPU reservation in the override, and that every setting they pass is one the
service reads. scripts/stack-check.sh runs them, in real containers."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import yaml

from relay_api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
# Read by the engine (dataset cache) and huggingface_hub rather than by Settings.
OTHER_VARIABLES = {"RELAY_CACHE_DIR", "HF_TOKEN"}


def compose(name: str = "docker-compose.yml") -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / name).read_text()))


def test_the_services_and_their_order() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "redis", "migrate", "api", "worker", "serving-worker"}
    migrate = services["migrate"]
    assert migrate["command"][:3] == ["python", "-m", "relay_api.migrate"] and migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("api", "worker", "serving-worker"):
        assert services[name]["depends_on"] == {
            "migrate": {"condition": "service_completed_successfully"},
            "redis": {"condition": "service_healthy"},
        }
    assert "relay_api.app:create_app" in services["api"]["command"][-1]
    assert services["worker"]["command"][:3] == ["python", "-m", "relay_worker"]
    # Deployments go to a worker of their own, which the API reaches by the service's name.
    serving = services["serving-worker"]
    assert serving["command"][:5] == ["python", "-m", "relay_worker", "--queues", Settings().serving_queue]
    assert serving["environment"]["RELAY_SERVING_ADVERTISED_HOST"] == "serving-worker"
    for module in ("relay_api.app", "relay_api.migrate", "relay_worker.__main__", "relay_worker.app"):
        assert importlib.util.find_spec(module) is not None, module
    assert "noeviction" in services["redis"]["command"]


def test_the_workers_reserve_a_gpu_only_with_the_gpu_override() -> None:
    # As written, the stack starts on a host without NVIDIA GPUs, its workers on the CPU.
    base = compose()["services"]
    for name in ("worker", "serving-worker"):
        assert "deploy" not in base[name]
        assert base[name]["environment"]["RELAY_CPU_WORKERS_ONLY"] == "${RELAY_CPU_WORKERS_ONLY:-true}"
    gpu = compose("docker-compose.gpu.yml")["services"]
    for name in ("worker", "serving-worker"):
        devices = gpu[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    for name in ("api", "worker", "serving-worker"):
        assert gpu[name]["environment"]["RELAY_CPU_WORKERS_ONLY"] == "false"


def test_every_setting_passed_is_one_the_service_reads() -> None:
    services = compose()["services"]
    fields = {f"RELAY_{name.upper()}" for name in Settings.model_fields}
    for name in ("migrate", "api", "worker", "serving-worker"):
        environment = services[name]["environment"]
        unknown = {v for v in environment if v not in fields and v not in OTHER_VARIABLES}
        assert not unknown, (name, unknown)
        assert environment["RELAY_DATABASE_URL"].startswith("postgresql://")
        assert environment["RELAY_BROKER_URL"].startswith("redis://")


def test_env_example_documents_exactly_what_compose_reads() -> None:
    text = (ROOT / "docker-compose.yml").read_text() + (ROOT / "docker-compose.gpu.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z0-9_]+)(?::-[^}]*)?\}", text))
    documented = {
        line.split("=", 1)[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert used == documented


def test_the_image_holds_what_the_service_needs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = {
        part for line in dockerfile.splitlines() if line.startswith("COPY") for part in line.split()[1:-1]
    }
    assert {"sdk", "engine", "api", "worker", "migrations", "alembic.ini", "pyproject.toml"} <= copied
    # The server, the simulators an eval block offers, and the trackers a recipe's integrations name.
    assert 'pip install --find-links /tmp/extra/wheels -e ".[server,pusht,aloha,trackers]"' in dockerfile
