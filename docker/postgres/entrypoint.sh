#!/bin/sh
# Debian's PostgreSQL, started the way the public postgres image starts, for hosts that build their
# own images (docker/base-image.sh): on an empty PGDATA, POSTGRES_USER (a superuser) with
# POSTGRES_PASSWORD and the database POSTGRES_DB are created; then the server runs in the
# foreground as the postgres user, listening on every address with password authentication.
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}" "${PGDATA:=/var/lib/postgresql/data}"
# The server's own binaries, not Debian's wrappers (which pick a cluster of their own configuration).
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    # A first start that fails leaves nothing half made for the next one to take as done.
    trap 'rm -rf "${PGDATA:?}"/*' EXIT
    password_file=$(mktemp)
    printf '%s' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}" > "$password_file"
    chown postgres "$password_file"
    runuser -u postgres -- "$BIN/initdb" -D "$PGDATA" --username="$POSTGRES_USER" \
        --pwfile="$password_file" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8
    rm -f "$password_file"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/run/postgresql" -w start
    if [ "$POSTGRES_DB" != postgres ]; then
        runuser -u postgres -- "$BIN/psql" -v ON_ERROR_STOP=1 -h /run/postgresql -p 5432 -U "$POSTGRES_USER" -d postgres \
            -c "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDATA" -m fast -w stop
    trap - EXIT
fi
exec runuser -u postgres -- "$BIN/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/run/postgresql
