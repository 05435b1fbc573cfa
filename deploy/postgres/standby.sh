#!/bin/sh
# Runs a streaming hot standby of the primary at PRIMARY_HOST, as the
# entrypoint of a container of the official postgres image (as its postgres
# user). On the first start, with an empty data directory, it copies the
# primary with pg_basebackup -R, which writes standby.signal and
# primary_conninfo (with the password and STANDBY_NAME as application_name,
# the name listed in synchronous_standby_names of the primary). Every start then
# runs postgres with the arguments given to this script: a hot standby that
# replays what the primary streams, or a primary once promoted
# (pg_ctl promote, or SELECT pg_promote()).
#
# Environment (compose.yaml gives it; the image sets PGDATA):
#   PRIMARY_HOST, PRIMARY_PORT  the primary (port default 5432)
#   REPLICATION_USER            the role primary-init.sh made
#   REPLICATION_PASSWORD        its password
#   STANDBY_NAME                this standby's application_name
set -eu

: "${PGDATA:?PGDATA: the data directory (the image sets it)}"
: "${PRIMARY_HOST:?PRIMARY_HOST: the primary to copy and follow}"
: "${PRIMARY_PORT:=5432}"
: "${REPLICATION_USER:?REPLICATION_USER: the role to replicate as}"
: "${REPLICATION_PASSWORD:?REPLICATION_PASSWORD: the password of that role}"
: "${STANDBY_NAME:?STANDBY_NAME: the name listed in synchronous_standby_names of the primary}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	# The primary's first start runs its init scripts on the unix socket
	# only: it takes TCP connections once they are done.
	until pg_isready --quiet --host="$PRIMARY_HOST" --port="$PRIMARY_PORT"; do
		echo "standby.sh: waiting for the primary at $PRIMARY_HOST:$PRIMARY_PORT" >&2
		sleep 1
	done
	PGPASSWORD=$REPLICATION_PASSWORD pg_basebackup --pgdata="$PGDATA" \
		--dbname="host=$PRIMARY_HOST port=$PRIMARY_PORT user=$REPLICATION_USER application_name=$STANDBY_NAME" \
		--write-recovery-conf --wal-method=stream --checkpoint=fast
	# The copy carries the primary's synchronous_standby_names. Promoted,
	# this server has no standby of its own: requiring one would make every
	# commit on it wait for good, and sluice could never decide there. So
	# it runs alone once promoted, until it is given a standby (then set
	# synchronous_standby_names on it with ALTER SYSTEM). Later lines of
	# postgresql.auto.conf win, as pg_basebackup -R relies on too.
	echo "synchronous_standby_names = ''" >>"$PGDATA/postgresql.auto.conf"
fi
# A fresh volume of the image is mode 1777; postgres requires 0700 (or 0750).
chmod 0700 "$PGDATA"
exec postgres "$@"
