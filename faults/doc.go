// Package faults holds the fault tests: real faults on real PostgreSQL
// servers, each test on private clusters of its own (pgtest.NewCluster) on
// loopback, so that stopping, locking, filling or failing one over touches
// nobody else. Each file is named for what it breaks: postgres_down (stop
// and start), postgres_crash (pause and kill), postgres_slow (a lock held),
// schema_broken, too_many_clients, failover (a standby promoted, a primary
// turned read-only), pooler (PgBouncer), shutdown, start (without a
// database, cold on a loaded machine) and memory (the in-memory store
// flooded). helpers, traffic, readiness and process hold what they share.
//
// They start gateways in-process through package gateway's API, as main
// does, and as processes of the sluice binary. When initdb, pg_basebackup
// or pgbouncer is missing they skip, or fail when CI is set; .ci/run
// installs them. They measure exactness on a machine they load on
// purpose, so .ci/test runs them alone, after every other package.
//
// The package has no code but tests: nothing may import it, and it
// imports nothing of sluice but from its tests (gateway, limiter/postgres
// and the test support under internal/).
package faults
