#!/usr/bin/env bash
# Start PostgreSQL and Redis on 127.0.0.1 when they are not already running (CI machines and a
# fresh laptop with the Debian packages). Production uses docker-compose instead.
set -euo pipefail

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    echo "starting PostgreSQL"
    if command -v pg_ctlcluster >/dev/null 2>&1; then
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
    else
        echo "PostgreSQL is not running and pg_ctlcluster is not installed" >&2
        exit 1
    fi
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    echo "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --dir /tmp --logfile /tmp/relay-redis.log
    for _ in $(seq 1 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432
redis-cli -h 127.0.0.1 -p 6379 ping
