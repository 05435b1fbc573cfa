# Sourced by .ci/test: makes SLUICE_TEST_DATABASE_URL point at a Postgres
# the tests may create schemas in.
#
#   1. SLUICE_TEST_DATABASE_URL already set: used as is.
#   2. A Postgres answering on 127.0.0.1:5432 with trust auth for the
#      postgres user: used.
#   3. Otherwise a private cluster is created with initdb in a temporary
#      directory, as an unprivileged user when run as root (Postgres refuses
#      to run as root), started on a free port and stopped on exit.

pg_bin() {
	if command -v "$1" >/dev/null 2>&1; then command -v "$1"; return; fi
	ls /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1
}

pg_can_connect() {
	local psql
	psql=$(command -v psql || pg_bin psql)
	[ -n "$psql" ] && "$psql" "$1" -Atqc 'select 1' >/dev/null 2>&1
}

pg_start_private() {
	local initdb pg_ctl user dir port
	initdb=$(pg_bin initdb)
	pg_ctl=$(pg_bin pg_ctl)
	if [ -z "$initdb" ] || [ -z "$pg_ctl" ]; then
		echo ".ci/test: no Postgres reachable and no initdb/pg_ctl found; install PostgreSQL (Debian: apt-get install postgresql) or set SLUICE_TEST_DATABASE_URL" >&2
		return 1
	fi
	dir=$(mktemp -d /tmp/sluice-pg.XXXXXX)
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 55432)
	local as=()
	if [ "$(id -u)" = 0 ]; then
		user=sluicetest
		id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
		chown "$user" "$dir"
		as=(runuser -u "$user" --)
	fi
	"${as[@]}" "$initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
	"${as[@]}" "$pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
		-o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=300 -c fsync=off" start >/dev/null || { cat "$dir/server.log" >&2; return 1; }
	SLUICE_PG_PRIVATE_STOP="${as[*]} $pg_ctl -D $dir/data -m fast stop; rm -rf $dir"
	trap 'eval "$SLUICE_PG_PRIVATE_STOP" >/dev/null 2>&1 || true' EXIT
	export SLUICE_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
	echo ".ci/test: started a private Postgres on 127.0.0.1:$port (data in $dir)"
}

if [ -n "${SLUICE_TEST_DATABASE_URL:-}" ]; then
	echo ".ci/test: using SLUICE_TEST_DATABASE_URL"
elif pg_can_connect "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"; then
	export SLUICE_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	echo ".ci/test: using the Postgres on 127.0.0.1:5432"
else
	pg_start_private
fi
