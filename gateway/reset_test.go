package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// TestResetAgrees: a key's X-RateLimit-Reset is the same Unix second on
// its allowed answers, on its 429 (decided by the store, and by the
// over-limit cache after it) and in GET /v1/keys, for every algorithm, on
// the memory store and on Postgres; Retry-After is whole seconds, at
// least 1, and no earlier than that reset for a window that only resets.
func TestResetAgrees(t *testing.T) {
	const rules = "fixed: POST /fixed by ip 2/1h; reset: POST /reset by ip 2/1h reset; " +
		"sliding: POST /sliding by ip 2/1h sliding; token: POST /token by ip 2/1h token"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	for _, store := range []string{"memory", "postgres"} {
		t.Run(store, func(t *testing.T) {
			env := base()
			env["SLUICE_UPSTREAM"], env["SLUICE_RULES"] = up.URL, rules
			if store == "postgres" {
				env = databaseEnv(pgtest.New(t), up.URL, rules)
			}
			g := start(t, env)
			pgtest.ClearOf(t, time.Hour, 10*time.Second)
			post := func(path string) (int, int64, int64) {
				t.Helper()
				res, err := http.Post(g.url+path, "", nil)
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				reset, err := strconv.ParseInt(res.Header.Get("X-Ratelimit-Reset"), 10, 64)
				if err != nil {
					t.Fatalf("POST %s: %d, X-RateLimit-Reset %q", path, res.StatusCode, res.Header.Get("X-Ratelimit-Reset"))
				}
				retry := int64(0)
				if res.StatusCode == http.StatusTooManyRequests {
					if retry, err = strconv.ParseInt(res.Header.Get("Retry-After"), 10, 64); err != nil || retry < 1 {
						t.Fatalf("POST %s: Retry-After %q, want whole seconds, at least 1", path, res.Header.Get("Retry-After"))
					}
				}
				return res.StatusCode, reset, retry
			}
			for _, rule := range []string{"fixed", "reset", "sliding", "token"} {
				var resets []int64
				for i, want := range []int{200, 200, 429, 429} {
					before := time.Now()
					code, reset, retry := post("/" + rule)
					if code != want {
						t.Fatalf("%s: request %d got %d, want %d", rule, i+1, code, want)
					}
					resets = append(resets, reset)
					if code == 429 && (rule == "fixed" || rule == "reset") && before.Add(time.Duration(retry)*time.Second).Unix()+1 < reset {
						t.Errorf("%s: Retry-After %d s from %v is before the reset %d", rule, retry, before, reset)
					}
				}
				code, body := get(t, g.admin+"/v1/keys?rule="+rule+"&ip=127.0.0.1")
				var key struct{ Reset int64 }
				if code != 200 || json.Unmarshal([]byte(body), &key) != nil {
					t.Fatalf("%s: GET /v1/keys: %d %s", rule, code, body)
				}
				// A sliding window's and a token bucket's reset moves with
				// each request counted: from the second on, nothing more
				// is. The fourth comes from the over-limit cache, which
				// reports the key's reset as the store gave it.
				first := 0
				if rule == "sliding" || rule == "token" {
					first = 1
				}
				for i, r := range resets[first:] {
					i += first
					if r != key.Reset {
						t.Errorf("%s: X-RateLimit-Reset of request %d is %d, GET /v1/keys says %d (all: %v)", rule, i+1, r, key.Reset, resets)
					}
				}
			}
		})
	}
}
