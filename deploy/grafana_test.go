package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
)

// dashboard is deploy/grafana/sluice.json as the tests read it.
type dashboard struct {
	Title      string
	UID        string
	Panels     []panel
	Templating struct {
		List []struct {
			Name, Type string
			Query      any
			Datasource *struct{ Type, UID string }
		}
	}
}

type panel struct {
	ID         int
	Type       string
	Title      string
	Datasource *struct{ Type, UID string }
	GridPos    struct{ H, W, X, Y int }
	Targets    []struct {
		RefID string `json:"refId"`
		Expr  string
	}
	Panels []panel // a collapsed row's
}

// readDashboard decodes the dashboard and returns it with every PromQL
// query it runs: the panels' and, for template variables, the expression
// inside label_values(…, label).
func readDashboard(t *testing.T) (dashboard, map[string]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "sluice.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("sluice.json: %v", err)
	}
	queries := map[string]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				queries[fmt.Sprintf("panel %d (%s) %s", p.ID, p.Title, tg.RefID)] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		switch x := v.Query.(type) {
		case string:
			q = x
		case map[string]any:
			q, _ = x["query"].(string)
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(expr, label)", v.Name, q)
			continue
		}
		queries["variable "+v.Name] = m[1]
	}
	return d, queries
}

// TestGrafanaDashboard checks the dashboard's structure (every panel on
// the data source variable, ids unique, inside the 24-column grid, every
// target a query) and has promtool parse every query, with Grafana's
// variables replaced, as a recording rule.
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	d, queries := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard title %q uid %q", d.Title, d.UID)
	}
	if !slices.ContainsFunc(d.Templating.List, func(v struct {
		Name, Type string
		Query      any
		Datasource *struct{ Type, UID string }
	}) bool {
		return v.Name == "datasource" && v.Type == "datasource"
	}) {
		t.Error("no datasource variable: the dashboard would be bound to one Prometheus")
	}
	ids := map[int]bool{}
	var check func([]panel)
	check = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			g := p.GridPos
			if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("panel %d (%s): grid position %+v", p.ID, p.Title, g)
			}
			if p.Type != "row" {
				if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
					t.Errorf("panel %d (%s): data source %v, want the ${datasource} variable", p.ID, p.Title, p.Datasource)
				}
				if len(p.Targets) == 0 {
					t.Errorf("panel %d (%s): no query", p.ID, p.Title)
				}
				for _, tg := range p.Targets {
					if strings.TrimSpace(tg.Expr) == "" {
						t.Errorf("panel %d (%s) %s: empty query", p.ID, p.Title, tg.RefID)
					}
				}
			}
			check(p.Panels)
		}
	}
	check(d.Panels)

	promtool := tool(t, "promtool", "prometheus")
	variables := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
		"$job", ".+", "$instance", ".+", "$rule", ".+")
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range queries {
			if !yield(k) {
				return
			}
		}
	})
	for i, name := range names {
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard_query_%d", i), Expr: variables.Replace(queries[name])})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard.rules.yaml")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := proctest.Run("", nil, promtool, "check", "rules", file); err != nil {
		t.Errorf("promtool does not parse the dashboard's queries: %v\n%s\n(query i is the i-th of %q)", err, out, names)
	}
}

// TestMetricsExist starts a sluice on Postgres, sends it traffic that
// allows, limits (from the store and from the fast path) and proxies, and
// checks that every metric the dashboard and the alerts query appears in
// its /metrics: a renamed metric breaks this test, not a dashboard in
// production.
func TestMetricsExist(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	upstream := proctest.NewUpstream(t, nil)
	g := startSluice(t, map[string]string{
		"SLUICE_UPSTREAM":     upstream.URL,
		"SLUICE_DATABASE_URL": db.URL,
		"SLUICE_DB_SCHEMA":    db.Schema,
		"SLUICE_HASH_KEY":     "metrics-test-hash-key-0123456789",
		"SLUICE_DB_TIMEOUT":   "5s",
		"SLUICE_RULES":        "login: POST /api/login by ip 1/1h",
	})
	pgtest.ClearOf(t, time.Hour, 10*time.Second)
	for i, want := range []int{200, 429, 429} { // the store denies, then the fast path
		if code, body := do("POST", g.url+"/api/login", "", ""); code != want {
			t.Fatalf("request %d: %d %s, want %d", i+1, code, body, want)
		}
	}
	exported := map[string]bool{}
	for series := range scrape(t, g.admin+"/metrics") {
		name, _, _ := strings.Cut(series, "{")
		exported[name] = true
	}
	if m := scrape(t, g.admin+"/metrics"); m[`sluice_fast_path_hits_total{rule="login"}`] != 1 {
		t.Fatalf("the traffic did not reach the fast path: %v", m[`sluice_fast_path_hits_total{rule="login"}`])
	}

	_, queries := readDashboard(t)
	var alerts alertRules
	readYAML(t, filepath.Join(root, "deploy", "prometheus", "alerts.yaml"), &alerts)
	for _, gr := range alerts.Groups {
		for _, r := range gr.Rules {
			queries["alert "+r.Alert] = r.Expr
		}
	}
	used := map[string]bool{}
	for where, q := range queries {
		for _, name := range metricNames(q) {
			used[name] = true
			// up is Prometheus' own, about every target.
			if !exported[name] && name != "up" {
				t.Errorf("%s queries %s, which sluice does not export", where, name)
			}
		}
	}
	// Not an error: a metric may be for ad-hoc queries only.
	family := func(name string) string {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if f, ok := strings.CutSuffix(name, suffix); ok && exported[f+"_bucket"] {
				return f
			}
		}
		return name
	}
	usedFamilies := map[string]bool{}
	for name := range used {
		usedFamilies[family(name)] = true
	}
	for name := range exported {
		if f := family(name); strings.HasPrefix(f, "sluice_") && !usedFamilies[f] {
			t.Logf("no dashboard panel or alert uses %s", name)
		}
	}
}

var (
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promqlKeywords = map[string]bool{
		"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true,
		"on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true,
		"Inf": true, "NaN": true, "atan2": true,
	}
)

// metricNames returns the metric names a PromQL expression selects: its
// identifiers, once strings, label matchers, ranges and grouping labels
// are removed, that are not called (functions, aggregations), not
// keywords, not part of a number or duration and not Grafana variables.
func metricNames(expr string) []string {
	s := promqlString.ReplaceAllString(expr, `""`)
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlRange.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, loc := range promqlIdent.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsRune("0123456789.$", rune(s[loc[0]-1])) {
			continue // 1e3, 5m, $var
		}
		if strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(") || promqlKeywords[name] {
			continue
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`up{job=~"sluice.*"} == 0`, []string{"up"}},
		{`sum by (job, instance) (rate(sluice_store_errors_total{kind=~"connection|x"}[2m])) > 0`, []string{"sluice_store_errors_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(a_bucket{x="y"}[$__rate_interval])))`, []string{"a_bucket"}},
		{"max by (job, instance) (a{state=\"acquired\"})\n  / max by (job, instance) (b) >= 0.9\nand sum(rate(c[5m])) > 1e3", []string{"a", "b", "c"}},
		{`sum(rate(x[5m] offset 1h)) without (rule) / on (job) group_left (version) y`, []string{"x", "y"}},
		{`absent(up{job=~"sluice.*"})`, []string{"up"}},
		{`count(a{l="by (x) sum(b)"}) or vector(0)`, []string{"a"}},
		{`rate(a[5m]) unless ignoring (le) b`, []string{"a", "b"}},
		{`sum(rate(process_cpu_seconds_total{job=~"$job"}[$__rate_interval]))`, []string{"process_cpu_seconds_total"}},
	} {
		if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}
