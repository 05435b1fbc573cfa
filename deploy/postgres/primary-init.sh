#!/bin/sh
# Makes a fresh primary require a synchronous standby. The official postgres
# image runs it from /docker-entrypoint-initdb.d on the first start only (an
# empty data directory), after initdb, as the postgres user, while a
# temporary server listens on the unix socket alone; the entrypoint then
# restarts the server, which is when what this script sets takes effect.
#
# It creates the role the standby replicates as, lets that role in for
# replication with its password from any address (pg_hba.conf), and sets
# synchronous_standby_names: from then on a commit returns only once a
# listed standby has the commit's WAL on disk, so a failover to that
# standby loses no commit the primary acknowledged.
#
# Environment (compose.yaml gives it; the image adds POSTGRES_USER,
# POSTGRES_DB and PGDATA):
#   REPLICATION_USER           the role standby.sh connects as
#   REPLICATION_PASSWORD       its password
#   SYNCHRONOUS_STANDBY_NAMES  the application_name of the standby
#                              (standby.sh's STANDBY_NAME), or a list such as
#                              'ANY 1 (s1, s2)'
set -eu

: "${PGDATA:?PGDATA: the data directory (the image sets it)}"
: "${POSTGRES_USER:?POSTGRES_USER: the superuser (the image sets it)}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${REPLICATION_USER:?REPLICATION_USER: the role the standby replicates as}"
: "${REPLICATION_PASSWORD:?REPLICATION_PASSWORD: the password of that role}"
: "${SYNCHRONOUS_STANDBY_NAMES:?SYNCHRONOUS_STANDBY_NAMES: the standby the primary waits for}"

# The values travel as psql variables, quoted by psql (:"" and :''), never
# pasted into SQL. ALTER SYSTEM writes postgresql.auto.conf and is read at
# the restart that follows: reloading now would make the next init
# script's commits wait for a standby that cannot exist yet.
psql -v ON_ERROR_STOP=1 --no-psqlrc --quiet \
	--username="$POSTGRES_USER" --dbname="$POSTGRES_DB" \
	-v role="$REPLICATION_USER" -v password="$REPLICATION_PASSWORD" \
	-v names="$SYNCHRONOUS_STANDBY_NAMES" <<'SQL'
CREATE ROLE :"role" WITH LOGIN REPLICATION PASSWORD :'password';
ALTER SYSTEM SET synchronous_standby_names = :'names';
SQL

# The standby runs elsewhere (another container), so the image's own lines
# (trust on the socket and on loopback only) do not let it in.
printf 'host replication %s all scram-sha-256\n' "$REPLICATION_USER" >>"$PGDATA/pg_hba.conf"
