package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// A short run of the burst scenario through the harness's own command, on
// the real Postgres and Redis: a burst of 1,000 over three instances of
// sluice on Postgres allows exactly the limit, every time, decided by the store
// (no fail mode) in far fewer statements than requests; the memory store,
// per instance, allows more. Needs wrk only for its version line.
func TestBurstShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	requireTools(t, "wrk")
	// The bound covers building sluice and the harness's programs: on an
	// empty build cache, beside the rest of CI, that alone passed 3 min.
	o, err := parseFlags([]string{"-scenarios", "5", "-targets", "baseline,redis,memory,postgres", "-rounds", "2", "-timeout", "10m"})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := run(context.Background(), o, &out, io.Discard); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	table := out.String()
	row := func(target string) []string {
		for line := range strings.Lines(table) {
			cells := strings.Split(line, " | ")
			if len(cells) > 8 && strings.HasPrefix(cells[0], "| 5.") && cells[1] == target {
				return cells
			}
		}
		t.Fatalf("no row for %s:\n%s", target, table)
		return nil
	}
	// The Redis peer is measured, not checked: under a burst its own 50 ms
	// deadline lets requests through (as it was built to), and the table
	// says so in its failed checks.
	row("redis_rate")
	pg := row("sluice postgres")
	if pg[2] != "100, 100 (100)" {
		t.Errorf("Postgres allowed %s per burst, want 100, 100 (100):\n%s", pg[2], table)
	}
	if pg[7] != "0" {
		t.Errorf("Postgres: %s checks decided by the fail mode, want 0:\n%s", pg[7], table)
	}
	if pg[6] == "–" || len(pg[6]) > 3 { // statements: measured, and fewer than 1,000
		t.Errorf("Postgres: %s decide statements per burst, want fewer than 1,000:\n%s", pg[6], table)
	}
	if mem := row("sluice memory"); mem[2] == "100, 100 (100)" {
		t.Errorf("memory: %s allowed, want more than the limit (three instances, each its own count):\n%s", mem[2], table)
	}
}
