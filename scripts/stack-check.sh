#!/usr/bin/env bash
# The production stack, checked end to end in real containers (docker-compose.yml, the Dockerfile):
#
#   bash scripts/stack-check.sh
#
# From a fresh clone, as root: installs and starts Debian's Docker engine where none runs, pulls
# the public base images or, where no registry answers, builds them from Debian's packages
# (docker/base-image.sh), and brings the stack up with the compose tool this machine has (the
# `docker compose` plugin, else docker-compose 1.29). Then scripts/stack_check.py runs the check's
# steps, printing each and its time: a key made in the API container; a pi05-tiny job by curl on a
# v3.0 video dataset from a mounted host directory, its events followed, its output downloaded and
# its sha256 checked; a worker container killed between two checkpoints, the job resumed to the
# weights of an uninterrupted run; a deployment reached by openpi-client through the API; down
# and up with a rebuilt image, keeping keys, jobs, events and files; a gpus=2 job across two
# worker containers, equal to one process; and down -v.
#
# Costs on a 2-core machine (docs/service.md): about 5 minutes the first time (base images and
# the Relay image), 2 to 4 once the base images are built; 3.4 GB of images. The stack it runs is the
# compose project "relaycheck", taken down with its volumes at the end (--keep leaves a failed one up).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

bash scripts/docker-engine.sh
if docker compose version > /dev/null 2>&1; then
    compose="docker compose"
elif command -v docker-compose > /dev/null; then
    compose="docker-compose"
else
    echo "neither the docker compose plugin nor docker-compose is installed"
    exit 1
fi
echo "compose tool: $compose ($($compose version --short 2>/dev/null || true))"

env_file=()
if [ -n "${RELAY_PYTHON_IMAGE:-}" ]; then
    echo "images named by the environment: $RELAY_PYTHON_IMAGE, ${RELAY_POSTGRES_IMAGE:-postgres:16}, ${RELAY_REDIS_IMAGE:-redis:7}"
elif docker pull -q python:3.11-slim > /dev/null 2>&1 && docker pull -q postgres:16 > /dev/null 2>&1 \
    && docker pull -q redis:7 > /dev/null 2>&1; then
    echo "images: python:3.11-slim, postgres:16 and redis:7, pulled"
else
    echo "no registry gives python:3.11-slim, postgres:16 and redis:7: building base images from Debian's packages"
    bash docker/base-image.sh
    env_file=(--env-file docker/local.env)
fi

# The check's own client on this host: openpi-client (without its numpy<2 pin, which Relay's
# numpy 2 does not meet; its other needs listed here) and numpy.
client=.stack-check-venv
if [ ! -x "$client/bin/python" ] || ! "$client/bin/python" -c "import openpi_client" 2> /dev/null; then
    echo "making $client (openpi-client, numpy) for the check's client side"
    python3 -m venv "$client"
    "$client/bin/pip" install -q --disable-pip-version-check numpy msgpack websockets typing_extensions \
        2> "$client.log" || { cat "$client.log"; exit 1; }
    "$client/bin/pip" install -q --disable-pip-version-check --no-deps "openpi-client==0.1.2" 2>> "$client.log" \
        || { cat "$client.log"; exit 1; }
fi
echo "ready to check after $((SECONDS - started)) s"
"$client/bin/python" scripts/stack_check.py --compose "$compose" "${env_file[@]}" "$@"
echo "the whole of scripts/stack-check.sh: $((SECONDS - started)) s"
