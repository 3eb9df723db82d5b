#!/usr/bin/env bash
# Install Relay with its development extras in .venv and run the linters, the type checker and the
# whole test suite against real PostgreSQL, Redis and Celery worker processes. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/services.sh
# The console's browser tests drive Debian's Chromium (Playwright's own browsers are not used).
if [ ! -x /usr/bin/chromium ]; then
    echo "installing chromium for the browser tests"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
fi
# gym-pusht's opencv-python (the PushT harness test) loads libGL and glib's libgthread.
if ! ldconfig -p | grep -q "libGL.so.1" || ! ldconfig -p | grep -q "libgthread-2.0.so.0"; then
    echo "installing libgl1 and libglib2.0-0 for opencv-python"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libgl1 libglib2.0-0
fi
# The production stack's test (tests/stack) builds and runs docker-compose.yml's containers: Debian's
# Docker engine and docker-compose, and debootstrap for base images no registry is needed for.
if ! command -v dockerd > /dev/null || ! command -v docker-compose > /dev/null || ! command -v debootstrap > /dev/null; then
    echo "installing docker.io, docker-compose and debootstrap for the compose stack's test"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose debootstrap
fi
if ! docker info > /dev/null 2>&1; then
    echo "starting the Docker engine (log: /tmp/relay-dockerd.log)"
    (dockerd > /tmp/relay-dockerd.log 2>&1 &)
    for _ in $(seq 60); do docker info > /dev/null 2>&1 && break; sleep 1; done
fi
# Said plainly, not a failure: a machine without a Docker engine still runs every other test.
docker info > /dev/null 2>&1 || echo "no Docker engine runs here: tests/stack (the compose stack) will be skipped"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[dev]"
# openpi's websocket client, for the serving tests: without its numpy<2 pin (see pyproject's dev extra).
python -m pip install -q --no-deps "openpi-client==0.1.2"

ruff check .
ruff format --check .
lint-imports
# Every package, listed by name (a new package joins the list once it type-checks clean).
mypy sdk/relay engine/relay_engine api/relay_api worker/relay_worker
# A cascade of failures stops early, with its tracebacks printed, well inside the CI limit.
pytest --durations=15 --maxfail=5 "$@"
