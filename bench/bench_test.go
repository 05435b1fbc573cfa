package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseWrk(t *testing.T) {
	out := "Running 5s test @ http://127.0.0.1:1/api/bench\n" +
		`BENCH {"requests":1200,"duration_us":2000000,"non2xx":7,"socket_errors":1,"p50_us":812,"p99_us":4096}` + "\n"
	r, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	want := wrkResult{Requests: 1200, DurationUS: 2000000, Non2xx: 7, SocketErrors: 1, P50US: 812, P99US: 4096}
	if r != want {
		t.Errorf("parseWrk = %+v, want %+v", r, want)
	}
	if got := r.rps(); got != 600 {
		t.Errorf("rps = %v, want 600", got)
	}
	if _, err := parseWrk("Running 5s test\nunable to connect\n"); err == nil {
		t.Error("parseWrk without a report: no error")
	}
}

func TestParseDecisions(t *testing.T) {
	exposition := `# HELP sluice_decisions_total Rate-limit checks decided, by rule and outcome.
# TYPE sluice_decisions_total counter
sluice_decisions_total{outcome="allowed",rule="global"} 10
sluice_decisions_total{outcome="allowed",rule="ip"} 5
sluice_decisions_total{outcome="failed_open",rule="ip"} 3
sluice_decisions_total{outcome="local",rule="tenant"} 2
sluice_decisions_total{outcome="limited",rule="ip"} 1.2e+06
sluice_fast_path_hits_total{rule="ip"} 99
`
	o, err := parseDecisions(strings.NewReader(exposition), "sluice_decisions_total")
	if err != nil {
		t.Fatal(err)
	}
	if o["allowed"] != 15 || o["limited"] != 1_200_000 || o.failed() != 5 {
		t.Errorf("parseDecisions = %v, want allowed 15, limited 1200000, failed 5", o)
	}
	if _, err := parseDecisions(strings.NewReader(`sluice_decisions_total{outcome="allowed"} many`), "sluice_decisions_total"); err == nil {
		t.Error("malformed value: no error")
	}
}

func TestRatioIsMedianOfRounds(t *testing.T) {
	rounds := func(rps ...int64) []wrkResult {
		var rs []wrkResult
		for _, n := range rps {
			rs = append(rs, wrkResult{Requests: n, DurationUS: 1e6})
		}
		return rs
	}
	tests := []struct {
		name       string
		got, base  []wrkResult
		wantRatio  string
		wantMedian float64
	}{
		{"one round", rounds(900), rounds(1000), "0.90", 900},
		// Round 2's baseline was hit by a neighbour: per-round ratios
		// 0.9, 1.8, 0.95 have the median 0.95.
		{"noisy round", rounds(900, 900, 950), rounds(1000, 500, 1000), "0.95", 900},
		{"even count", rounds(800, 1000), rounds(1000, 1000), "0.90", 900},
		{"no baseline", rounds(900), nil, "–", 900},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ratio(tt.got, tt.base, wrkResult.rps); got != tt.wantRatio {
				t.Errorf("ratio = %s, want %s", got, tt.wantRatio)
			}
			if got := median(tt.got, wrkResult.rps); got != tt.wantMedian {
				t.Errorf("median = %v, want %v", got, tt.wantMedian)
			}
		})
	}
}

// TestRoundOrder: every round measures every target once, the rounds
// start with different targets, and over two rounds no target has the same
// one before it twice.
func TestRoundOrder(t *testing.T) {
	for n := 1; n <= 7; n++ {
		first := map[int]bool{}
		prev := map[[2]int]int{} // {target, the one before it in its round} -> rounds
		for round := range n {
			order := roundOrder(round, n)
			seen := map[int]bool{}
			for i, c := range order {
				if c < 0 || c >= n || seen[c] {
					t.Fatalf("n=%d round %d: order %v is not a permutation", n, round, order)
				}
				seen[c] = true
				if i > 0 && round < 2 {
					prev[[2]int{c, order[i-1]}]++
				}
			}
			if first[order[0]] {
				t.Errorf("n=%d round %d: starts with %d again (%v)", n, round, order[0], order)
			}
			first[order[0]] = true
		}
		if n < 3 {
			continue // one other target is the only one there can be before it
		}
		for pair, rounds := range prev {
			if rounds > 1 {
				t.Errorf("n=%d: %d is measured right after %d in both of the first two rounds", n, pair[0], pair[1])
			}
		}
	}
}

func TestWithDatabase(t *testing.T) {
	tests := []struct{ in, want string }{
		{"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "postgres://postgres@127.0.0.1:5432/sluice_bench_x?sslmode=disable"},
		{"postgresql://u:p@h/db", "postgresql://u:p@h/sluice_bench_x"},
		{"host=127.0.0.1 user=postgres dbname=postgres", "host=127.0.0.1 user=postgres dbname=postgres dbname=sluice_bench_x"},
	}
	for _, tt := range tests {
		if got := withDatabase(tt.in, "sluice_bench_x"); got != tt.want {
			t.Errorf("withDatabase(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-scenarios", "4,1", "-targets", "postgres,redis,baseline", "-env", "SLUICE_DB_TIMEOUT=100ms"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.scenarios) != 2 || o.scenarios[0].id != "4" || o.scenarios[1].id != "1" {
		t.Errorf("scenarios = %v, want 4 then 1", o.scenarios)
	}
	if strings.Join(o.targets, ",") != "baseline,redis,postgres" {
		t.Errorf("targets = %v, want the baseline first, then redis", o.targets)
	}
	if d, err := parseFlags(nil); err != nil || strings.Join(d.targets, ",") != "baseline,redis,memory,postgres" {
		t.Errorf("default targets = %v (%v), want baseline,redis,memory,postgres", d.targets, err)
	}
	if len(o.sluiceEnv) != 1 || o.sluiceEnv[0] != "SLUICE_DB_TIMEOUT=100ms" {
		t.Errorf("sluiceEnv = %v", o.sluiceEnv)
	}
	for _, bad := range [][]string{
		{"-scenarios", "6"},
		{"-targets", "nosuch"},
		{"-env", "NOEQUALS"},
		{"-rounds", "0"},
		{"-connections", "1", "-threads", "2"},
		{"extra"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q): no error", bad)
		}
	}
}

func TestScriptCarriesTheMix(t *testing.T) {
	dir := t.TempDir()
	path, err := writeScript(dir, "s", mix{GoodIPs: 10000, BadIPs: 1000, Tenants: 8, BadShare: 19})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"local good_ips, bad_ips, tenants, bad_share = 10000, 1000, 8, 19\n",
		`wrk.format("GET", "/api/bench", h)`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("script lacks %q:\n%s", want, b)
		}
	}
}

// Every scenario's rules reach the Redis peer as its -limit values, in
// order; rules the peer cannot apply as sluice does are refused.
func TestRedisLimits(t *testing.T) {
	want := map[string][]string{
		"1": {"ip=ip,1000000,1h0m0s"},
		"2": {"global=global,1000000000,1h0m0s"},
		"3": {"global=global,1000000000,1h0m0s", "ip=ip,1000000,1h0m0s", "tenant=tenant,1000000000,1h0m0s"},
		"4": {"ip=ip,10,24h0m0s"},
		"5": {"ip=ip,100,1h0m0s"},
	}
	for _, s := range scenarios {
		got, err := redisLimits(s.rules)
		if err != nil {
			t.Errorf("scenario %s: %v", s.id, err)
			continue
		}
		if strings.Join(got, " ") != strings.Join(want[s.id], " ") {
			t.Errorf("scenario %s: limits %q, want %q", s.id, got, want[s.id])
		}
	}
	for _, bad := range []string{
		"login: POST /api/* by ip 5/1m",
		"other: * /login by ip 5/1m",
		"email: * /api/* by email 5/1m",
		"slide: * /api/* by ip 5/1m sliding",
		"shadow: * /api/* by ip 5/1m shadow",
		"t: * /api/* by tenant(X-Org) 5/1m",
		"not a rule",
		"",
	} {
		if got, err := redisLimits(bad); err == nil {
			t.Errorf("redisLimits(%q) = %q, want an error", bad, got)
		}
	}
}

// The harness finds its own module and, through its go.mod's replace, the
// repository's sluice, which it builds and measures.
func TestModuleDirs(t *testing.T) {
	harness, product, err := moduleDirs()
	if err != nil {
		t.Fatal(err)
	}
	for dir, module := range map[string]string{harness: "github.com/sluicehq/sluice/bench", product: "github.com/sluicehq/sluice"} {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		if first, _, _ := strings.Cut(string(b), "\n"); first != "module "+module {
			t.Errorf("%s/go.mod starts %q, want module %s", dir, first, module)
		}
	}
}
