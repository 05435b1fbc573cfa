package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
)

// stats is the part of GET /v1/stats these tests read.
type stats struct {
	Rules []struct {
		Rule      string             `json:"rule"`
		Decisions map[string]float64 `json:"decisions"`
		Charged   *float64           `json:"charged_units"`
		Charges   map[string]float64 `json:"charges"`
	} `json:"rules"`
	TopLimited []struct {
		Rule, Key string
		Count     int
	} `json:"top_limited"`
	Store struct {
		Kind    string `json:"kind"`
		Ready   bool   `json:"ready"`
		Breaker string `json:"breaker"`
		Calls   float64
		Latency *struct{ P50, P99 float64 }        `json:"latency_seconds"`
		Pool    *struct{ Acquired, Idle, Max int } `json:"pool"`
	} `json:"store"`
}

// waitStats reads /v1/stats until ok accepts it (the figures are sampled
// every second) or 10 s have passed.
func waitStats(t *testing.T, admin, token string, ok func(stats) bool) stats {
	t.Helper()
	var s stats
	for deadline := time.Now().Add(10 * time.Second); ; {
		code, body := proctest.Call(t, "GET", admin+"/v1/stats", token, "")
		if code != 200 {
			t.Fatalf("GET /v1/stats: %d %s", code, body)
		}
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatal(err)
		}
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stats did not show the traffic: %s", body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestStatsOfAGateway: a gateway's /v1/stats shows its decisions, the
// keys it limited (hashed) and its store: on Postgres with the breaker
// and the pool, on the memory store without either.
func TestStatsOfAGateway(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	const hashKey = "shared-secret-0123456789"
	h, err := hashing.New([]byte(hashKey))
	if err != nil {
		t.Fatal(err)
	}
	for _, store := range []string{"memory", "postgres"} {
		t.Run(store, func(t *testing.T) {
			env := map[string]string{
				"SLUICE_UPSTREAM":    up.URL,
				"SLUICE_RULES":       "login: POST /api/login by ip 2/1h",
				"SLUICE_HASH_KEY":    hashKey,
				"SLUICE_ADMIN_TOKEN": "t0ken",
			}
			if store == "postgres" {
				db := pgtest.New(t)
				env["SLUICE_DATABASE_URL"], env["SLUICE_DB_SCHEMA"] = db.URL, db.Schema
			}
			g := start(t, env)
			pgtest.ClearOf(t, time.Hour, 10*time.Second)
			for range 5 {
				proctest.Call(t, "POST", g.url+"/api/login", "", "")
			}
			s := waitStats(t, g.admin, "t0ken", func(s stats) bool {
				return len(s.Rules) == 1 && s.Rules[0].Decisions["limited"] == 3
			})
			if s.Rules[0].Rule != "login" || s.Rules[0].Decisions["allowed"] != 2 {
				t.Errorf("rules: %+v", s.Rules)
			}
			key := h.Key("ip", "127.0.0.1")
			if len(s.TopLimited) != 1 || s.TopLimited[0].Key != key || s.TopLimited[0].Count != 3 {
				t.Errorf("top limited: %+v, want %s 3 times", s.TopLimited, key)
			}
			st := s.Store
			if st.Kind != store || !st.Ready || st.Calls < 3 || st.Latency == nil {
				t.Errorf("store: %+v", st)
			}
			switch store {
			case "memory":
				if st.Breaker != "" || st.Pool != nil {
					t.Errorf("the memory store has no breaker nor pool: %+v", st)
				}
			case "postgres":
				if st.Breaker != "closed" || st.Pool == nil || st.Pool.Max < 1 || st.Pool.Acquired+st.Pool.Idle < 1 {
					t.Errorf("Postgres: breaker %q, pool %+v", st.Breaker, st.Pool)
				}
			}
		})
	}
}
