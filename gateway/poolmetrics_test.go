package gateway

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestPoolMetrics: a gateway on Postgres exports its pool's statistics.
func TestPoolMetrics(t *testing.T) {
	db := pgtest.New(t)
	env := base()
	env["SLUICE_DATABASE_URL"] = db.URL
	env["SLUICE_DB_SCHEMA"] = db.Schema
	env["SLUICE_HASH_KEY"] = "shared-secret-0123456789"
	g := start(t, env)
	_, body := get(t, g.admin+"/metrics")
	for _, series := range []string{
		`sluice_db_pool_connections{state="acquired"}`, `sluice_db_pool_connections{state="idle"}`,
		`sluice_db_pool_connections{state="constructing"}`, "sluice_db_pool_max_connections",
		"sluice_db_pool_empty_acquire_total", "sluice_db_pool_empty_acquire_wait_seconds_total",
	} {
		if !strings.Contains(body, "\n"+series+" ") {
			t.Errorf("/metrics lacks %s", series)
		}
	}
}
