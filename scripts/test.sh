#!/usr/bin/env bash
# Install Relay with its development extras in .venv and run the linters, the type checker and the
# whole test suite against real PostgreSQL, Redis and Celery worker processes; then, where a Docker
# engine can run, the production stack's check in real containers (scripts/stack-check.sh). Exits
# non-zero on any failure.
#
#   bash scripts/test.sh                  # everything
#   bash scripts/test.sh tests/engine -x  # pytest's arguments: those tests only, no stack check
#   RELAY_STACK_CHECK=0 bash scripts/test.sh   # the suite without the stack check
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
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[dev]"
# openpi's websocket client, for the serving tests: without its numpy<2 pin (see pyproject's dev extra).
python -m pip install -q --no-deps "openpi-client==0.1.2"
# A real MLflow tracking server for the MLflow tracker's tests (tests/engine/training/
# test_mlflow_tracker.py), in a venv of its own: mlflow pulls some 40 packages (and another
# pyarrow) that Relay's environment must not get; Relay itself speaks its REST API with httpx.
if [ ! -x .venv-mlflow/bin/mlflow ]; then
    python3 -m venv .venv-mlflow
    .venv-mlflow/bin/pip install -q "mlflow==3.17.2"
fi

ruff check .
ruff format --check .
lint-imports
# Every package, listed by name (a new package joins the list once it type-checks clean).
mypy sdk/relay engine/relay_engine api/relay_api worker/relay_worker
# A cascade of failures stops early, with its tracebacks printed, well inside the CI limit.
pytest --durations=15 --maxfail=5 "$@"

if [ "$#" -gt 0 ] || [ "${RELAY_STACK_CHECK:-1}" = 0 ]; then
    echo "the production stack's check (scripts/stack-check.sh) is not run with pytest's arguments or RELAY_STACK_CHECK=0"
elif bash scripts/docker-engine.sh; then
    bash scripts/stack-check.sh
elif [ "${RELAY_REQUIRE_DOCKER:-0}" = 1 ]; then
    echo "RELAY_REQUIRE_DOCKER=1, and no Docker engine runs here"
    exit 1
else
    # Said plainly, not a failure: a machine without a Docker engine still runs every other test.
    echo "no Docker engine runs here: the production stack's check (scripts/stack-check.sh) was not run"
fi
