package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/proctest"
)

// TestCalendarAndChargeRulesOnTheAdminAPI: /v1/rules names a calendar
// window as the rules do (1mo, with its zone and anchor) and says where a
// charge rule reads its cost; an override of a calendar rule keeps its
// calendar when given the rule's window, and says so in /v1/overrides.
func TestCalendarAndChargeRulesOnTheAdminAPI(t *testing.T) {
	env := map[string]string{
		"SLUICE_UPSTREAM":    "http://127.0.0.1:9",
		"SLUICE_ADMIN_TOKEN": "quota-test-token-0123456789",
		"SLUICE_RULES": "credits: * /api/* by tenant 10000/1mo anchor=15 tz=Asia/Kolkata charge=header(X-Credits-Used)\n" +
			"tpm: POST /v1/chat by tenant 100000/1m charge=json(usage.input_tokens+usage.output_tokens)",
	}
	g := start(t, env)
	token := env["SLUICE_ADMIN_TOKEN"]
	code, body := proctest.Call(t, http.MethodGet, g.admin+"/v1/rules", token, "")
	var rules struct {
		Rules []struct {
			Name, Window, TZ, Charge string
			Anchor                   int
			WindowSec                int64 `json:"window_seconds"`
		}
	}
	if err := json.Unmarshal([]byte(body), &rules); code != 200 || err != nil || len(rules.Rules) != 2 {
		t.Fatalf("GET /v1/rules: %d %s (%v)", code, body, err)
	}
	c, tpm := rules.Rules[0], rules.Rules[1]
	if c.Window != "1mo" || c.TZ != "Asia/Kolkata" || c.Anchor != 15 || c.Charge != "header(X-Credits-Used)" ||
		c.WindowSec < 28*86400 || c.WindowSec > 31*86400 {
		t.Errorf("credits in /v1/rules: %+v", c)
	}
	if tpm.Window != "1m" || tpm.TZ != "" || tpm.Charge != "json(usage.input_tokens+usage.output_tokens)" {
		t.Errorf("tpm in /v1/rules: %+v", tpm)
	}
	code, body = proctest.Call(t, http.MethodPut, g.admin+"/v1/overrides?rule=credits&tenant=acme", token, `{"limit":50000,"window":"1mo"}`)
	if code != 200 || !strings.Contains(body, `"window":"1mo"`) {
		t.Fatalf("PUT an override of 1mo: %d %s", code, body)
	}
	code, body = proctest.Call(t, http.MethodGet, g.admin+"/v1/overrides?rule=credits", token, "")
	if code != 200 || !strings.Contains(body, `"window":"1mo"`) || !strings.Contains(body, `"limit":50000`) {
		t.Errorf("GET /v1/overrides: %d %s", code, body)
	}
	code, body = proctest.Call(t, http.MethodGet, g.admin+"/v1/keys?rule=credits&tenant=acme", token, "")
	if code != 200 || !strings.Contains(body, `"limit":50000`) {
		t.Errorf("GET /v1/keys under the override: %d %s", code, body)
	}
	code, body = proctest.Call(t, http.MethodPut, g.admin+"/v1/overrides?rule=credits&tenant=acme", token, `{"limit":50000,"window":"1w"}`)
	if code != 400 {
		t.Errorf("PUT an override of 1w on a 1mo rule: %d %s, want 400", code, body)
	}
}

// TestChargesInStats: /v1/stats shows what a charge rule's responses
// charged, and how the charges were read.
func TestChargesInStats(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("say") == "" {
			w.Header().Set("X-Credits-Used", "7")
		}
	}))
	defer up.Close()
	g := start(t, map[string]string{
		"SLUICE_UPSTREAM":    up.URL,
		"SLUICE_RULES":       "credits: * /api/* by tenant 10000/1mo charge=header(X-Credits-Used)",
		"SLUICE_ADMIN_TOKEN": "t0ken",
	})
	for _, q := range []string{"", "", "", "?say=nothing"} {
		req, _ := http.NewRequest("POST", g.url+"/api/x"+q, nil)
		req.Header.Set("X-Tenant-ID", "acme")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	waitStats(t, g.admin, "t0ken", func(s stats) bool {
		if len(s.Rules) != 1 || s.Rules[0].Charged == nil {
			return false
		}
		r := s.Rules[0]
		return *r.Charged == 22 && r.Charges["charged"] == 3 && r.Charges["missing"] == 1
	})
}
