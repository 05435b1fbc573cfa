# Sourced by .ci/test: makes SLUICE_TEST_DATABASE_URL point at a Postgres
# the tests may create schemas in.
#
#   1. SLUICE_TEST_DATABASE_URL already set: used as is.
#   2. When initdb and pg_ctl are installed, a private cluster is created
#      in a temporary directory, as an unprivileged user when run as root
#      (Postgres refuses to run as root), started on a free port and
#      stopped on exit.
#   3. Otherwise a Postgres answering on 127.0.0.1:5432 with trust auth for
#      the postgres user.
#
# A private cluster before the machine's own: the suite needs a server set
# for it, and a machine's is set for something else. Debian's allows 100
# connections, and the suite's five jobs at once were seen holding 92 of
# them. It syncs every commit to the disk the compilers beside it share
# (a commit loop there: 3 ms on average, up to 76 ms beside a build and
# bench's CREATE and DROP DATABASE, which force checkpoints), and it serves
# whatever else the machine runs. The private cluster allows 300
# connections and runs with fsync off, which loses nothing in a process
# crash (the fault tests' SIGKILLs), only in the machine's.

# pg_bin prints the path of a PostgreSQL program (the newest version's when
# several are installed), or nothing. It always succeeds, so that callers
# running under `set -e -o pipefail` get to print their own message.
pg_bin() {
	if command -v "$1" >/dev/null 2>&1; then command -v "$1"; return 0; fi
	local f found=""
	for f in /usr/lib/postgresql/*/bin/"$1"; do
		[ -x "$f" ] && found="$found$f"$'\n'
	done
	[ -n "$found" ] && printf '%s' "$found" | sort -V | tail -n 1
	return 0
}

pg_can_connect() {
	local psql
	psql=$(pg_bin psql)
	[ -n "$psql" ] && "$psql" "$1" -Atqc 'select 1' >/dev/null 2>&1
}

# pg_port_free reports whether nothing accepts connections on
# 127.0.0.1:$1 (bash's /dev/tcp: no python3 or netcat needed).
pg_port_free() {
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
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
	local as=()
	if [ "$(id -u)" = 0 ]; then
		user=sluicetest
		id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
		chown "$user" "$dir"
		as=(runuser -u "$user" --)
	fi
	"${as[@]}" "$initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 || {
		echo ".ci/test: initdb failed:" >&2
		cat "$dir/initdb.log" >&2
		return 1
	}
	# A port that looks free may be taken before the server binds it (by
	# another test run on this machine): try a few.
	local try started=""
	for try in 1 2 3 4 5 6 7 8; do
		port=$((20000 + RANDOM % 30000))
		pg_port_free "$port" || continue
		if "${as[@]}" "$pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
			-o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=300 -c fsync=off" start >/dev/null; then
			started=1
			break
		fi
	done
	if [ -z "$started" ]; then
		echo ".ci/test: could not start a private Postgres (initdb worked; server log follows)" >&2
		cat "$dir/server.log" >&2
		return 1
	fi
	SLUICE_PG_PRIVATE_STOP="${as[*]} $pg_ctl -D $dir/data -m fast stop; rm -rf $dir"
	trap 'eval "$SLUICE_PG_PRIVATE_STOP" >/dev/null 2>&1 || true' EXIT
	export SLUICE_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
	echo ".ci/test: started a private Postgres on 127.0.0.1:$port (data in $dir)"
}

if [ -n "${SLUICE_TEST_DATABASE_URL:-}" ]; then
	echo ".ci/test: using SLUICE_TEST_DATABASE_URL"
elif [ -n "$(pg_bin initdb)" ] && [ -n "$(pg_bin pg_ctl)" ]; then
	pg_start_private
elif pg_can_connect "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"; then
	export SLUICE_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	echo ".ci/test: using the Postgres on 127.0.0.1:5432"
else
	pg_start_private # says what to install
fi
