package main

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/internal/pgtest"
)

func TestParseProcStat(t *testing.T) {
	// A command name with spaces and parentheses, as a process may name
	// itself; fields from proc(5).
	line := "4242 (post (gres) x) S 2208 4242 4242 0 -1 4194304 1126 0 0 0 217 805 31 7 20 0 1 0 7594 222543872 2739"
	s, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	want := procStat{comm: "post (gres) x", ppid: 2208, utime: 217, stime: 805, cutime: 31, cstime: 7}
	if s != want {
		t.Errorf("parseProcStat = %+v, want %+v", s, want)
	}
	if s.own() != 1022 {
		t.Errorf("own = %d, want 1022", s.own())
	}
	for _, bad := range []string{
		"",
		"4242 postgres S 2208",
		"4242 (postgres) S 2208 4242 4242 0 -1 4194304 1126 0 0 0 217",
		"4242 (postgres) S 2208 4242 4242 0 -1 4194304 1126 0 0 0 x 805 31 7 20",
	} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q): no error", bad)
		}
	}
}

func TestCPUDelta(t *testing.T) {
	before := map[int]int64{1: 100, 2: 50, 3: 70}
	after := map[int]int64{1: 130, 2: 50, 4: 9} // 3 exited, 4 started
	delta, lost := cpuDelta(before, after)
	if delta != 30+0+9 || lost != 1 {
		t.Errorf("cpuDelta = %d, %d; want 39, 1", delta, lost)
	}
}

// A child that exits between two readings counts in full, through the
// parent's cutime and cstime: the test process plays the postmaster.
func TestTreeCPUCountsExitedChildren(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	before, err := treeCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	child := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	after, err := treeCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if child < 50*time.Millisecond {
		t.Fatalf("the child used only %s; the test needs more", child)
	}
	// Clock ticks are 10 ms: allow two of them.
	if got := ticks(after - before); got < child-20*time.Millisecond {
		t.Errorf("treeCPU grew by %s, less than the exited child's %s", got, child)
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 200; i++ {
		d = append(d, time.Duration(i))
	}
	if p50, p99 := percentile(d, 50), percentile(d, 99); p50 != 100 || p99 != 198 {
		t.Errorf("p50, p99 = %d, %d; want 100, 198", p50, p99)
	}
	if p := percentile(d[:1], 99); p != 1 {
		t.Errorf("p99 of one = %d, want 1", p)
	}
	if p := percentile(nil, 50); p != 0 {
		t.Errorf("p50 of none = %d, want 0", p)
	}
}

func TestParseFleetFlags(t *testing.T) {
	o, err := parseFleetFlags([]string{"-gateways", "1, 3", "-hot", "-synchronous-commit", "on"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.gateways) != 2 || o.gateways[1] != 3 || !o.hot || !o.syncCommit || o.callers != 64 || o.keys != 10000 {
		t.Errorf("options = %+v", o)
	}
	for _, bad := range [][]string{
		{"-gateways", "0"},
		{"-gateways", "1,x"},
		{"-callers", "0"},
		{"-rate", "-1"},
		{"-keys", "3000000"},
		{"-total-rate", "-1"},
		{"-rate", "100", "-total-rate", "1000"},
		{"-private-cluster=maybe"},
		{"-synchronous-commit", "local"},
		{"-duration", "0s"},
		{"extra"},
	} {
		if _, err := parseFleetFlags(bad); err == nil {
			t.Errorf("parseFleetFlags(%q): no error", bad)
		}
	}
}

// The flags of a fleet of 64 gateways: a fleet-wide rate, a million keys,
// a private cluster; -private-cluster is auto unless given, and stands
// alone for true.
func TestParseFleetFlagsLargeFleet(t *testing.T) {
	o, err := parseFleetFlags([]string{"-gateways", "1,64", "-total-rate", "20000", "-keys", "1000000", "-private-cluster"})
	if err != nil {
		t.Fatal(err)
	}
	if o.totalRate != 20000 || o.rate != 0 || o.keys != 1000000 || o.privateCluster != clusterOn {
		t.Errorf("options = %+v", o)
	}
	if r1, r64 := o.gatewayRate(1), o.gatewayRate(64); r1 != 20000 || r64 != 312.5 {
		t.Errorf("gatewayRate(1), (64) = %v, %v; want 20000, 312.5", r1, r64)
	}
	for args, want := range map[string]clusterMode{"": clusterAuto, "-private-cluster=false": clusterOff, "-private-cluster=auto": clusterAuto, "-private-cluster=true": clusterOn} {
		o, err := parseFleetFlags(strings.Fields(args))
		if err != nil || o.privateCluster != want {
			t.Errorf("%q: -private-cluster %v (%v), want %v", args, o.privateCluster.String(), err, want.String())
		}
	}
	if o, _ := parseFleetFlags([]string{"-rate", "500"}); o.gatewayRate(8) != 500 {
		t.Errorf("-rate 500: gatewayRate(8) = %v, want 500", o.gatewayRate(8))
	}
}

// Up to 131,072 keys the clients are IPv4 addresses of 198.18.0.0/15;
// beyond, IPv6 addresses of 2001:db8::/32, each in a /64 of its own, so
// that every key is a group of its own.
func TestFleetIP(t *testing.T) {
	if ip := fleetIP(maxIPv4Keys-1, maxIPv4Keys); ip != netip.MustParseAddr("198.19.255.255") {
		t.Errorf("last IPv4 key: %s", ip)
	}
	if ip := fleetIP(0, 1000000); ip != netip.MustParseAddr("2001:db8::1") {
		t.Errorf("first IPv6 key: %s", ip)
	}
	groups := map[string]bool{}
	for _, i := range []int{0, 1, 255, 256, 65535, 65536, 999999, maxFleetKeys - 1} {
		ip := fleetIP(i, maxFleetKeys)
		if !netip.MustParsePrefix("2001:db8::/32").Contains(ip) {
			t.Errorf("key %d: %s outside 2001:db8::/32", i, ip)
		}
		groups[hashing.IPGroup(ip)] = true
	}
	if len(groups) != 8 {
		t.Errorf("8 keys in %d /64 groups: %v", len(groups), groups)
	}
}

// A short fleet on the real Postgres (SLUICE_TEST_DATABASE_URL, else the
// development machine's, as every store test; never skipped): every row
// measured, with transactions and CPU time, and the database gone after.
func TestFleetShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	r := shortFleet(t, "-gateways", "1,2", "-callers", "8", "-keys", "500", "-warmup", "0s", "-duration", "1s")
	o := r.opts
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if len(r.rows) != 2 {
		t.Fatalf("%d rows, want 2", len(r.rows))
	}
	for _, row := range r.rows {
		if row.decided == 0 || row.lifeDecided < row.decided || row.p99 < row.p50 || row.p50 <= 0 {
			t.Errorf("%d gateways: decided %d (life %d), p50 %s, p99 %s", row.gateways, row.decided, row.lifeDecided, row.p50, row.p99)
		}
		// Batched: far fewer transactions than decisions, but some.
		if row.xacts <= 0 || row.xacts > row.lifeDecided {
			t.Errorf("%d gateways: %d transactions for %d decisions", row.gateways, row.xacts, row.lifeDecided)
		}
		// The backends and the server are read one after the other, not
		// at once, and a backend that exits between the reads is missing
		// from the server's until the postmaster reaps it: a tenth of
		// slack (at least two clock ticks' worth per side).
		slack := max(20*time.Millisecond, row.backendCPU/10)
		if r.cpuErr == nil && (row.backendCPU <= 0 || row.serverCPU+slack < row.backendCPU) {
			t.Errorf("%d gateways: backends' CPU %s, server's %s; want some, the server's at least the backends'", row.gateways, row.backendCPU, row.serverCPU)
		}
	}
	var table strings.Builder
	r.writeTable(&table)
	for _, want := range []string{"\n| 1 | ", "\n| 2 | ", "decisions/s per pg core"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}

	conn, err := pgx.Connect(ctx, o.databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", r.database).Scan(&n); err != nil || n != 0 {
		t.Errorf("database %s: %d left (%v), want dropped", r.database, n, err)
	}
}

// A pacer spreads a gateway's rate over its callers and never bursts to
// catch up: one that fell behind calls at once, then keeps its interval.
func TestPacer(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	if p := newPacer(0, 64, rng); p.every != 0 || !p.wait(context.Background()) {
		t.Errorf("rate 0: %+v, want no pacing", p)
	}
	p := newPacer(1000, 64, rng)
	if p.every != 64*time.Millisecond {
		t.Errorf("1000/s over 64 callers: every %s, want 64ms", p.every)
	}
	p.next = time.Now().Add(-time.Hour) // far behind
	start := time.Now()
	if !p.wait(context.Background()) {
		t.Fatal("wait: false")
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("behind schedule, waited %s", took)
	}
	if ahead := time.Until(p.next); ahead < 50*time.Millisecond {
		t.Errorf("after catching up, the next call is due in %s, want one interval (64ms): no burst", ahead)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.next = time.Now().Add(time.Hour)
	if p.wait(ctx) {
		t.Error("wait on a cancelled context: true")
	}
}

// A paced fleet decides about its rate, never more: without pacing, one
// gateway's callers here make tens of thousands of decisions a second.
func TestFleetPaced(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	r := shortFleet(t, "-gateways", "1", "-callers", "8", "-keys", "500", "-rate", "1000", "-warmup", "0s", "-duration", "1s")
	row := r.rows[0]
	if perSecond := float64(row.decided) / row.elapsed.Seconds(); row.decided == 0 || perSecond > 1250 {
		t.Errorf("paced to 1000/s: %d decisions in %s (%.0f/s)", row.decided, row.elapsed, perSecond)
	}
	var table strings.Builder
	r.writeTable(&table)
	if !strings.Contains(table.String(), "paced to 1000 decisions/s per gateway") {
		t.Errorf("table does not say the load was paced:\n%s", table.String())
	}
}

// A short fleet on a private cluster: it runs, Postgres's CPU is measured
// there, and the cluster is gone after.
func TestFleetPrivateCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	if _, err := pgtest.ToolPath("initdb"); err != nil {
		t.Skip(err)
	}
	r := shortFleet(t, "-private-cluster", "-gateways", "1", "-callers", "8", "-keys", "200", "-warmup", "0s", "-duration", "1s")
	if r.cluster == nil || r.cluster.maxConnections < r.gatewayConns {
		t.Fatalf("cluster %+v for gateways of %d connections", r.cluster, r.gatewayConns)
	}
	if row := r.rows[0]; row.decided == 0 || r.cpuErr != nil || row.backendCPU <= 0 {
		t.Errorf("decided %d, backends' CPU %s (%v)", row.decided, row.backendCPU, r.cpuErr)
	}
	if _, err := os.Stat(r.cluster.dir); !os.IsNotExist(err) {
		t.Errorf("cluster directory %s: %v, want removed", r.cluster.dir, err)
	}
	var table strings.Builder
	r.writeTable(&table)
	if !strings.Contains(table.String(), "a private cluster") {
		t.Errorf("table does not say it ran on a private cluster:\n%s", table.String())
	}
}

// shortFleet runs a fleet with flags args on the real Postgres.
func shortFleet(t *testing.T, args ...string) *fleetRun {
	t.Helper()
	o, err := parseFleetFlags(args)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress strings.Builder
	r, err := fleet(ctx, o, &progress)
	if err != nil {
		t.Fatalf("fleet: %v\n%s", err, progress.String())
	}
	return r
}
