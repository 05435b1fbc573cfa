package main

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// layers says which of sluice's packages each package's code (tests
// aside) may import: the code map of docs/architecture.md, enforced. A package
// missing here fails the test, so that a new one gets its place on the
// map.
var layers = map[string][]string{
	// The leaves: what a rule is, how identifiers are hashed, the schema.
	"policy":     {"internal/textfold"},
	"hashing":    {"internal/textfold"},
	"migrations": nil,
	// Verified bearer tokens and their key sets, and their test support.
	"jwt":         {"internal/jsontext"},
	"jwt/jwttest": nil,
	// Decisions: the Store interface, the fast path, the breaker, the fail
	// modes; then one package per store, which know nothing of HTTP.
	"limiter":           {"policy"},
	"limiter/memory":    {"limiter", "policy"},
	"limiter/postgres":  {"limiter", "policy", "migrations"},
	"limiter/storetest": {"limiter", "policy"},
	// HTTP: identities from requests, then the proxy and the admin
	// listener, which see the limiter and never a particular store.
	"proxy/identity": {"hashing", "internal/jsontext", "internal/textfold"},
	"proxy/respscan": {},
	"proxy":          {"hashing", "jwt", "limiter", "policy", "proxy/identity", "proxy/respscan"},
	"admin":          {"hashing", "internal/jsontext", "limiter", "policy", "proxy"},
	// The decision service for other proxies: forward-auth, then Envoy's
	// rate limit service, both deciding through the proxy's Decider.
	"check":     {"hashing", "limiter", "policy", "proxy", "proxy/identity"},
	"check/rls": {"check", "hashing", "limiter", "policy", "proxy", "proxy/identity"},
	// Serving a small server until a context ends; the JSON text checks
	// that identity and jwt share.
	"internal/httpserve": nil,
	"internal/jsontext":  nil,
	"internal/textfold":  nil,
	// OpenTelemetry tracing from the OTEL_* variables.
	"telemetry": nil,
	// Test and measurement support.
	"internal/proctest": nil,
	"faults":            nil, // tests only: see testLayers
	"internal/pgtest":   {"internal/proctest", "limiter/postgres"},
	"proxy/proxytest":   {"hashing", "limiter", "limiter/memory", "limiter/storetest", "policy", "proxy", "proxy/identity"},
	"deploy":            nil,
	"bench":             {"hashing", "limiter", "limiter/postgres", "policy", "internal/proctest", "internal/pgtest"},
	"bench/baseline":    {"internal/httpserve", "proxy"},
	"bench/redis":       {"hashing", "proxy", "proxy/identity"},
	"bench/upstream":    {"internal/httpserve"},
	// The gateway assembles everything; main only dispatches to it.
	"gateway": {"admin", "check", "check/rls", "hashing", "internal/httpserve", "jwt", "limiter", "limiter/memory", "limiter/postgres", "policy", "proxy", "proxy/identity", "telemetry"},
	"":        {"gateway"},
}

// testLayers says what the tests of a package that is tests and nothing
// else may import of sluice. Other packages' tests may import anything.
var testLayers = map[string][]string{
	// The fault tests start gateways through gateway's API, as main does,
	// and migrate through limiter/postgres where a test needs it.
	"faults": {"gateway", "internal/pgtest", "internal/proctest", "limiter/postgres"},
}

// confined are third-party module paths that only the packages named may
// import: gRPC and Envoy's types belong to Envoy's rate limit service (and
// the load harness, its client), so that nothing else of the product
// grows a dependency on them.
var confined = map[string][]string{
	"google.golang.org/grpc":                 {"check/rls", "bench"},
	"github.com/envoyproxy/go-control-plane": {"check/rls", "bench"},
}

// modules are the directories of sluice's modules: the product, and the
// load harness (bench/go.mod), which is a module of its own so that its
// Redis client is none of the product's dependencies.
var modules = []string{".", "bench"}

// TestLayering checks every package's imports of sluice's own packages,
// in every module, against layers, and the confined third-party ones.
func TestLayering(t *testing.T) {
	const module = "github.com/sluicehq/sluice"
	var out []byte
	for _, dir := range modules {
		list := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}} |{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}`, "./...")
		list.Dir = dir
		b, err := list.Output()
		if err != nil {
			t.Fatalf("go list in %s: %v", dir, err)
		}
		out = append(out, b...)
	}
	seen := map[string]bool{}
	check := func(pkg, what string, imports []string, allowed []string) {
		for _, imp := range imports {
			dep, ours := strings.CutPrefix(imp, module+"/")
			if ours && !slices.Contains(allowed, dep) {
				t.Errorf("%q%s imports %q, which its layer does not allow (allowed: %v)", pkg, what, dep, allowed)
			}
		}
	}
	for line := range strings.Lines(string(out)) {
		code, tests, _ := strings.Cut(line, " |")
		fields := strings.Fields(code)
		pkg := strings.TrimPrefix(strings.TrimPrefix(fields[0], module), "/")
		seen[pkg] = true
		allowed, ok := layers[pkg]
		if !ok {
			t.Errorf("package %q has no place in the layers (layering_test.go and the code map of docs/architecture.md)", pkg)
			continue
		}
		check(pkg, "", fields[1:], allowed)
		for _, imp := range fields[1:] {
			for prefix, owners := range confined {
				if (imp == prefix || strings.HasPrefix(imp, prefix+"/")) && !slices.Contains(owners, pkg) {
					t.Errorf("%q imports %q, which only %q may", pkg, imp, owners)
				}
			}
		}
		if allowed, ok := testLayers[pkg]; ok {
			check(pkg, " (its tests)", strings.Fields(tests), allowed)
		}
	}
	for _, l := range []map[string][]string{layers, testLayers} {
		for pkg := range l {
			if !seen[pkg] {
				t.Errorf("layering_test.go names %q, which is no package: remove it", pkg)
			}
		}
	}
}

// TestCodeMap: the code map of docs/architecture.md names every package
// of layers, and names in its first column nothing that is not one, so
// that the table a reader trusts stays the one this file enforces.
func TestCodeMap(t *testing.T) {
	b, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "\n## The code map\n")
	if !ok {
		t.Fatal(`docs/architecture.md has no "## The code map" section`)
	}
	table, _, _ = strings.Cut(table, "\n## ")
	listed := map[string]string{} // a row's package (first column): the row
	code := regexp.MustCompile("`([a-z/]+)`")
	for line := range strings.Lines(table) {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(line, "| `") {
			continue
		}
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			listed[m[1]] = line
		}
	}
	for pkg := range layers {
		if pkg == "" {
			pkg = "main"
		}
		if _, ok := listed[pkg]; ok {
			continue
		}
		// A package may share its parent's row (jwt/jwttest, bench/redis),
		// which then names it.
		parent, _, nested := strings.Cut(pkg, "/")
		if row, ok := listed[parent]; !nested || !ok || !strings.Contains(row, "`"+pkg+"`") {
			t.Errorf("package %q is not on the code map of docs/architecture.md: give it a row, or name it in its parent's", pkg)
		}
	}
	for pkg := range listed {
		if _, ok := layers[pkg]; !ok && pkg != "main" {
			t.Errorf("the code map of docs/architecture.md has a row for %q, which is no package of layers", pkg)
		}
	}
	if len(listed) < 20 {
		t.Errorf("read %d rows of the code map: the reader of the table is broken", len(listed))
	}
}
