package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// docExample is one response of docs/quotas.md and what the rules above
// it charge for it.
type docExample struct {
	name     string
	rules    string
	response string
	charged  int64
}

// docExamples reads docs/quotas.md: each "<!-- example: name -->" is
// followed by a rules block, then responses, each followed by
// "<!-- charged: N -->".
func docExamples(t *testing.T) []docExample {
	t.Helper()
	b, err := os.ReadFile("../docs/quotas.md")
	if err != nil {
		t.Fatal(err)
	}
	var (
		out          []docExample
		name, rules  string
		block, fence string
		in           bool
		lines        []string
	)
	charged := regexp.MustCompile(`^<!-- charged: ([0-9]+) -->$`)
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case in && line == "```":
			in = false
			text := strings.Join(lines, "\n")
			if fence == "rules" {
				rules = text
			} else {
				block = text
			}
		case in:
			lines = append(lines, line)
		case strings.HasPrefix(line, "```rules") || strings.HasPrefix(line, "```response"):
			in, fence, lines = true, strings.TrimPrefix(line, "```"), nil
		case strings.HasPrefix(line, "<!-- example: "):
			name = strings.TrimSuffix(strings.TrimPrefix(line, "<!-- example: "), " -->")
		case charged.MatchString(line):
			n, _ := strconv.ParseInt(charged.FindStringSubmatch(line)[1], 10, 64)
			if rules == "" || block == "" {
				t.Fatalf("docs/quotas.md: %q without a rules block and a response before it", line)
			}
			out = append(out, docExample{name, rules, block, n})
			block = ""
		}
	}
	return out
}

// TestDocsQuotasExamples runs every example of docs/quotas.md: a gateway
// with its rules, an upstream that answers with its response, and the
// count each charge rule holds afterwards.
func TestDocsQuotasExamples(t *testing.T) {
	examples := docExamples(t)
	if len(examples) < 5 {
		t.Fatalf("%d examples in docs/quotas.md, want the five it shows", len(examples))
	}
	headers := map[string]string{"Authorization": "Bearer sk-test", "X-Api-Key": "sk-ant-test", "X-Tenant-ID": "acme"}
	for i, ex := range examples {
		t.Run(ex.name+"/"+strconv.Itoa(i), func(t *testing.T) {
			res, err := http.ReadResponse(bufio.NewReader(strings.NewReader(ex.response+"\n")), nil)
			if err != nil {
				t.Fatalf("response: %v\n%s", err, ex.response)
			}
			body, _ := io.ReadAll(res.Body)
			up := fakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				for k, v := range res.Header {
					w.Header()[k] = v
				}
				w.WriteHeader(res.StatusCode)
				w.Write(body)
			})
			pol, err := policy.Parse(ex.rules)
			if err != nil {
				t.Fatalf("the rules do not parse: %v", err)
			}
			g := newGateway(t, up, ex.rules, gatewayOpts{})
			path := pol.Rules()[0].PathString()
			if p, ok := strings.CutSuffix(path, "/*"); ok {
				path = p + "/x"
			}
			got, got2 := g.do(t, "POST", path, "", headers)
			if got.StatusCode != res.StatusCode || string(got2) != string(body) {
				t.Fatalf("the client got %d %q, want the upstream's %d %q", got.StatusCode, got2, res.StatusCode, body)
			}
			for _, r := range pol.Rules() {
				value := headers[r.Identity.Field]
				if r.Identity.Kind == policy.ByTenant {
					value = headers["X-Tenant-ID"]
				}
				live, _ := g.proxy.Policy().Lookup(r.Name)
				peek, err := g.memory.Peek(context.Background(), limiter.Check{Rule: live, Key: g.hasher.Key(r.Identity.Kind.String(), value)})
				if err != nil {
					t.Fatal(err)
				}
				want := int64(1)
				if r.Charge != nil {
					want = ex.charged
				}
				if peek.Count != want {
					t.Errorf("%s: count %d after the response, want %d", r.Name, peek.Count, want)
				}
			}
		})
	}
}
