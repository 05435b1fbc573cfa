package gateway

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestMigrateNeedsOnlyTheDatabase: `sluice migrate` runs with nothing but
// the database URL and the schema, as a migration job has them.
func TestMigrateNeedsOnlyTheDatabase(t *testing.T) {
	db := pgtest.New(t)
	schema := db.Schema + "_only"
	t.Cleanup(func() { db.Pool.Exec(context.Background(), fmt.Sprintf("DROP SCHEMA IF EXISTS %s CASCADE", schema)) })
	var out bytes.Buffer
	env := map[string]string{"DATABASE_URL": db.URL, "SLUICE_DB_SCHEMA": schema}
	if err := Migrate(context.Background(), env, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "schema "+schema+": ") || strings.Contains(out.String(), ": 0 migrations") {
		t.Fatalf("printed %q", out.String())
	}
}

func TestMigrateSettings(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "migrate: no database configured: set SLUICE_DATABASE_URL"},
		{map[string]string{"SLUICE_DATABASE_URL": "postgres://u:hunter2@h/db", "SLUICE_DB_SCHEMA": "public"},
			"invalid configuration (1 problem):\n  SLUICE_DB_SCHEMA: expected a lower-case identifier other than public ([a-z_][a-z0-9_]*, at most 63 characters), got \"public\""},
		{map[string]string{"SLUICE_DATABASE_URL": "postgres://u:hunter2@h:notaport/db", "SLUICE_DB_SCHEMA": "Bad"},
			"invalid configuration (2 problems):\n  SLUICE_DATABASE_URL: not a valid Postgres connection string\n" +
				"  SLUICE_DB_SCHEMA: expected a lower-case identifier other than public ([a-z_][a-z0-9_]*, at most 63 characters), got \"Bad\""},
	} {
		_, err := loadMigrate(tc.env)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v: got %v, want %q", tc.env, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%v: the error repeats the password: %v", tc.env, err)
		}
	}
}
