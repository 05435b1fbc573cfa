//go:build unix

package faults

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestChargesAcrossGateways: two gateway processes share a tenant's
// tokens. 400 chat completions at once over both, each answered with its
// own count of tokens (JSON bodies and SSE streams alike), are charged
// exactly: the tenant's count on the minute rule and on the monthly
// quota is the sum of what the upstream reported, read through either
// gateway's admin API; the requests-per-minute rule beside them counts
// requests, not tokens.
func TestChargesAcrossGateways(t *testing.T) {
	db := parallelDB(t)
	const n = 400
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		tokens, _ := strconv.Atoi(r.Header.Get("X-Tokens"))
		if r.Header.Get("Accept") == "text/event-stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n")
			w.(http.Flusher).Flush()
			fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", tokens)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"message":{"content":"%s"}}],"usage":{"prompt_tokens":1,"total_tokens":%d}}`, strings.Repeat("x", tokens), tokens)
	}))
	t.Cleanup(up.Close)
	rules := `
tpm:     POST /v1/chat/completions by tenant 100000000/1m charge=json(usage.total_tokens)
monthly: *    /v1/*                by tenant 100000000/1mo tz=Europe/Berlin charge=json(usage.total_tokens)
rpm:     POST /v1/chat/completions by tenant 100000/1m
`
	ps := startGatewayProcesses(t, 2, leaseGatewayEnv(up.URL, db, rules))
	// Every request in one window of the minute rules (a burst that
	// crossed into the next minute counted 147 of 400 in it).
	pgtest.ClearOf(t, time.Minute, 10*time.Second)

	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	want := int64(0)
	for i := range n {
		tokens := 1 + i*7%500
		want += int64(tokens)
		wg.Go(func() {
			req, _ := http.NewRequest("POST", "http://"+ps[i%2].public+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
			req.Header.Set("X-Tenant-ID", "acme")
			req.Header.Set("X-Tokens", strconv.Itoa(tokens))
			if i%3 == 0 {
				req.Header.Set("Accept", "text/event-stream")
			}
			res, err := faultClient.Do(req)
			code := 0
			if err == nil {
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				code = res.StatusCode
			} else {
				t.Errorf("request %d: %v", i, err)
			}
			mu.Lock()
			statuses[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if statuses[200] != n {
		t.Fatalf("statuses %v, want %d×200", statuses, n)
	}
	for _, tc := range []struct {
		rule string
		want int64
	}{{"tpm", want}, {"monthly", want}, {"rpm", n}} {
		for _, p := range ps {
			var got struct {
				Count, Remaining, Limit int64
				Window                  string
			}
			res, err := faultClient.Get("http://" + p.admin + "/v1/usage?tenant=acme")
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Usage []json.RawMessage `json:"usage"`
			}
			if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			found := false
			for _, u := range body.Usage {
				var one struct {
					Rule                    string
					Count, Remaining, Limit int64
					Window                  string
				}
				json.Unmarshal(u, &one)
				if one.Rule == tc.rule {
					got.Count, got.Remaining, got.Limit, got.Window = one.Count, one.Remaining, one.Limit, one.Window
					found = true
				}
			}
			if !found || got.Count != tc.want || got.Remaining != got.Limit-tc.want {
				t.Errorf("%s through %s: count %d remaining %d of %d, want count %d (found %v)", tc.rule, p.admin, got.Count, got.Remaining, got.Limit, tc.want, found)
			}
			if tc.rule == "monthly" && got.Window != "1mo" {
				t.Errorf("monthly: window %q, want 1mo", got.Window)
			}
		}
	}
	var charged, statements float64
	for _, p := range ps {
		v, err := p.metricValue("sluice_db_decide_statements_total")
		if err != nil {
			t.Fatal(err)
		}
		statements += v
	}
	// What a charge rule costs the store: the admission (batched with
	// others) and the settlement, per request.
	t.Logf("%d charged requests: %.0f decide statements (%.2f per request)", n, statements, statements/n)
	for _, p := range ps {
		v, err := p.metricValue(`sluice_charges_total{result="charged",rule="tpm"}`)
		if err != nil {
			t.Fatal(err)
		}
		charged += v
	}
	var retried float64
	for _, p := range ps {
		if v, err := p.metricValue(`sluice_charges_total{result="retried",rule="tpm"}`); err == nil {
			retried += v
		}
	}
	if retried != 0 {
		// Load is not an outage: a settlement waits its turn. (A retried
		// one whose first commit went through would count twice.)
		t.Errorf("%v charges were retried on a database that answers", retried)
	}
	if charged != n {
		t.Errorf("sluice_charges_total{result=\"charged\",rule=\"tpm\"} sums to %v over the gateways, want %d", charged, n)
	}
}
