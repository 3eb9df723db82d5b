#!/usr/bin/env bash
# Build, from Debian's packages, the images docker-compose.yml needs on a host that cannot pull the
# public ones (python:3.11-slim, postgres:16, redis:7), and write docker/local.env naming them:
#
#   bash docker/base-image.sh
#   docker compose --env-file docker/local.env up -d --build      # or docker-compose 1.29
#
# - relay-debian:bookworm: a Debian 12 root file system made by debootstrap (Python 3.11, its venv
#   module, PostgreSQL, Redis, the GL and glib libraries the simulators load) and imported with
#   `docker import`: the base of the Relay image and Redis's image.
# - relay-postgres:local: that base with docker/postgres/entrypoint.sh, which starts Debian's
#   PostgreSQL as the public image starts.
# - docker/extra/: what the Relay image's build needs from this host: ca.crt (this host's CA
#   bundle, for a pip behind a proxy that presents its own certificate authority) and, where pip's
#   configuration finds it (find-links), the CPU build of torch, so a CPU host's image does not
#   download the multi-GB CUDA build.
#
# Needs root, debootstrap and a running Docker daemon. Images already built are kept (delete one,
# or set RELAY_REBUILD_BASE=1, to build it again).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${RELAY_BASE_IMAGE:-relay-debian:bookworm}
POSTGRES=${RELAY_LOCAL_POSTGRES_IMAGE:-relay-postgres:local}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-venv,ca-certificates,postgresql,redis-server,libgl1,libegl1,libglib2.0-0

if [ "${RELAY_REBUILD_BASE:-0}" = 1 ] || ! docker image inspect "$BASE" > /dev/null 2>&1; then
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    echo "debootstrap: Debian bookworm with $PACKAGES (a few minutes)"
    debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root/rootfs" "$MIRROR" > "$root/log" \
        || { tail -20 "$root/log"; exit 1; }
    tar -C "$root/rootfs" -c . | docker import - "$BASE" > /dev/null
    echo "imported $BASE"
fi
docker build -q -f docker/postgres/Dockerfile --build-arg BASE_IMAGE="$BASE" -t "$POSTGRES" . > /dev/null
echo "built $POSTGRES"

mkdir -p docker/extra/wheels
for bundle in "${PIP_CERT:-}" /etc/ssl/certs/ca-certificates.crt; do
    if [ -n "$bundle" ] && [ -f "$bundle" ]; then
        cp "$bundle" docker/extra/ca.crt
        break
    fi
done
torch_version=$(sed -n 's/^train = \["torch==\(.*\)"\]$/\1/p' pyproject.toml)
for directory in $(printf '%s\n' ${PIP_FIND_LINKS:-} $(pip config get global.find-links 2>/dev/null || true) | sort -u); do
    for wheel in "$directory"/torch-"$torch_version"+cpu-*.whl; do
        if [ -f "$wheel" ]; then
            cp -u "$wheel" docker/extra/wheels/
            echo "the image takes $(basename "$wheel") from $directory"
        fi
    done
done

cat > docker/local.env <<ENV
RELAY_PYTHON_IMAGE=$BASE
RELAY_POSTGRES_IMAGE=$POSTGRES
RELAY_REDIS_IMAGE=$BASE
ENV
echo "wrote docker/local.env: docker compose --env-file docker/local.env up -d --build"
