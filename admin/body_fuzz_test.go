package admin

import (
	"encoding/json"
	"mime"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/jsontext"
)

// FuzzReadBody: the admin body reader accepts a body only under one
// Content-Type whose media type is application/json, only what
// jsontext.Decode accepts, and then reads what encoding/json reads; it
// never panics, and refuses with 400, 413 or 415 only.
func FuzzReadBody(f *testing.F) {
	for _, s := range []struct{ ct, body string }{
		{"application/json", `{"limit":3,"window":"1d"}`},
		{"application/json; charset=utf-8", `{"limit":3,"window":"1d"} `},
		{"text/plain", `{"limit":3,"window":"1d"}`},
		{"application/json", `{"limit":3,"Limit":1}`},
		{"application/json", `{"limit":3}x`},
		{"Application/JSON;q=1", `{"window":"\u0031d"}`},
	} {
		f.Add(s.ct, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, ct string, body []byte) {
		r := httptest.NewRequest("PUT", "/v1/overrides", strings.NewReader(string(body)))
		r.Header.Set("Content-Type", ct)
		var got overrideJSON
		prob := readBody(httptest.NewRecorder(), r, &got, "an override")
		if prob != nil {
			if prob.Status != 400 && prob.Status != 413 && prob.Status != 415 {
				t.Fatalf("refused with %d: %s", prob.Status, prob.Detail)
			}
			return
		}
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			t.Fatalf("accepted Content-Type %q", ct)
		}
		var again overrideJSON
		if err := jsontext.Decode(body, &again); err != nil || again != got {
			t.Fatalf("accepted %q as %+v; Decode: %+v, %v", body, got, again, err)
		}
		var std overrideJSON
		if err := json.Unmarshal(body, &std); err != nil || std != got {
			t.Fatalf("accepted %q as %+v; encoding/json: %+v, %v", body, got, std, err)
		}
	})
}
