#!/usr/bin/env bash
# A Docker engine for the production stack's check (scripts/stack-check.sh): installs Debian's
# docker.io, docker-compose and debootstrap where they are missing, and starts the engine where
# none answers (log: /tmp/relay-dockerd.log). Exits non-zero, saying why, when no engine can run
# here (no root, no package registry, a sandbox that refuses the engine).
set -uo pipefail

if ! command -v dockerd > /dev/null || ! command -v docker-compose > /dev/null || ! command -v debootstrap > /dev/null; then
    if [ "$(id -u)" != 0 ]; then
        echo "no Docker engine here: installing docker.io, docker-compose and debootstrap needs root"
        exit 1
    fi
    echo "installing docker.io, docker-compose and debootstrap (Debian's packages)"
    apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose debootstrap > /dev/null \
        || { echo "no Docker engine here: apt-get could not install docker.io"; exit 1; }
fi
if ! docker info > /dev/null 2>&1; then
    echo "starting the Docker engine (log: /tmp/relay-dockerd.log)"
    (dockerd > /tmp/relay-dockerd.log 2>&1 &)
    for _ in $(seq 60); do docker info > /dev/null 2>&1 && break; sleep 1; done
fi
if ! docker info > /dev/null 2>&1; then
    echo "no Docker engine here: dockerd did not start (the last lines of its log follow)"
    tail -5 /tmp/relay-dockerd.log 2>/dev/null
    exit 1
fi
