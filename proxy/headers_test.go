package proxy

import (
	"net/http"
	"slices"
	"testing"
)

func TestStripClientHeaders(t *testing.T) {
	spoofable := []string{
		"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Port",
		"X-Forwarded-Prefix", "X-Forwarded-Server", "X-Forwarded-Ssl", "X-Real-IP", "True-Client-IP",
		"CF-Connecting-IP", "X-Client-IP", "X-Cluster-Client-IP", "X-Original-Forwarded-For",
		"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override", "X-Original-URL", "X-Rewrite-URL",
		// Spellings that Go does not canonicalise but CGI-style upstreams
		// read as the same variable.
		"x_forwarded_for", "X_Real_IP", "x-real-ip", "X-HTTP-METHOD-OVERRIDE",
	}
	kept := []string{
		"Content-Type", "Authorization", "X-Tenant-Id", "Cookie", "X-Forwarded", "Forwarded-For",
		"X-Real-IPs", "User-Agent", "X-Request-Id",
	}
	h := http.Header{}
	for _, name := range spoofable {
		h[name] = []string{"1.2.3.4"} // raw map keys: exactly the spelling given
		h.Add(name, "5.6.7.8")        // and its canonical form
	}
	for _, name := range kept {
		h.Set(name, "v")
	}
	stripClientHeaders(h)
	var got []string
	for name := range h {
		got = append(got, name)
	}
	slices.Sort(got)
	want := make([]string, 0, len(kept))
	for _, name := range kept {
		want = append(want, http.CanonicalHeaderKey(name))
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after stripClientHeaders: %q, want %q", got, want)
	}
}

func TestHdrNameEqual(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"X-Tenant-Id", "x_tenant_ID", true},
		{"X-Tenant-Id", "X-Tenant-Id", true},
		{"X-Tenant-Id", "X-Tenant-Ix", false},
		{"X-Tenant-Id", "X-Tenant-I", false},
		{"a-b", "A_B", true},
		{"\u212A", "k", false}, // header names are ASCII: no Unicode folding
	}
	for _, tt := range tests {
		if got := hdrNameEqual(tt.a, tt.b); got != tt.want {
			t.Errorf("hdrNameEqual(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}
