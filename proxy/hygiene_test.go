package proxy

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// clientIPHeaders are every client-address header sluice strips, as the
// product promises them, each also in its '_' spelling by the caller.
var clientIPHeaders = []string{
	"X-Real-IP", "True-Client-IP", "CF-Connecting-IP", "Forwarded", "X-Forwarded", "Forwarded-For",
	"X-Client-IP", "X-Cluster-Client-IP", "X-Originating-IP", "X-Remote-IP", "X-Remote-Addr",
	"Fastly-Client-IP", "Akamai-Client-IP", "X-Azure-ClientIP", "X-Envoy-External-Address",
	"X-AppEngine-User-IP", "X-Forwarded-For", "Client-IP",
}

func TestStripClientHeaders(t *testing.T) {
	spoofable := append(slices.Clone(clientIPHeaders),
		"X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Port", "X-Forwarded-Prefix",
		"X-Forwarded-Server", "X-Forwarded-Ssl", "X-Original-Forwarded-For",
		"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override", "X-Original-URL", "X-Rewrite-URL",
		// Spellings that Go does not canonicalise but CGI-style upstreams
		// read as the same variable.
		"x_forwarded_for", "X_Real_IP", "x-real-ip", "X-HTTP-METHOD-OVERRIDE", "x_originating_ip",
	)
	for _, name := range clientIPHeaders {
		spoofable = append(spoofable, strings.ReplaceAll(name, "-", "_"))
	}
	kept := []string{
		"Content-Type", "Authorization", "X-Tenant-Id", "Cookie", "User-Agent", "X-Request-Id",
		"X-Real-IPs", "Forwarded-Fo", "X-Forwarde",
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

func TestRemoveHopByHop(t *testing.T) {
	tests := []struct {
		name string
		in   http.Header
		want http.Header
	}{
		{
			name: "nothing to do",
			in:   http.Header{"X-Tenant-Id": {"acme"}},
			want: http.Header{"X-Tenant-Id": {"acme"}},
		},
		{
			name: "an identity header named in Connection is gone",
			in:   http.Header{"Connection": {"X-Tenant-ID"}, "X-Tenant-Id": {"acme"}, "Accept": {"*/*"}},
			want: http.Header{"Connection": {"X-Tenant-ID"}, "Accept": {"*/*"}},
		},
		{
			name: "every token, every line, every spelling",
			in: http.Header{"Connection": {"keep-alive, X-Key", " x-tenant-id ,,"}, "X-Key": {"k"}, "X_tenant_id": {"a"},
				"X-Tenant-Id": {"b"}, "Keep-Alive": {"300"}, "X-Other": {"o"}},
			want: http.Header{"Connection": {"keep-alive, X-Key", " x-tenant-id ,,"}, "X-Other": {"o"}},
		},
		{
			name: "TE is left for the proxy",
			in:   http.Header{"Connection": {"TE"}, "Te": {"trailers"}},
			want: http.Header{"Connection": {"TE"}, "Te": {"trailers"}},
		},
		{
			name: "h2c upgrade removed",
			in:   http.Header{"Connection": {"Upgrade, HTTP2-Settings"}, "Upgrade": {"h2c"}, "Http2-Settings": {"AAMAAABkAARAAAAAAAIAAAAA"}, "Accept": {"*/*"}},
			want: http.Header{"Connection": {"Upgrade, HTTP2-Settings"}, "Accept": {"*/*"}},
		},
		{
			name: "Upgrade without Connection removed",
			in:   http.Header{"Upgrade": {"h2c"}, "Http2-Settings": {"x"}},
			want: http.Header{},
		},
		{
			name: "WebSocket kept",
			in:   http.Header{"Connection": {"keep-alive, Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Key": {"k"}, "Keep-Alive": {"1"}},
			want: http.Header{"Connection": {"keep-alive, Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Key": {"k"}},
		},
		{
			name: "WebSocket among other protocols is not WebSocket",
			in:   http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket, h2c"}},
			want: http.Header{"Connection": {"Upgrade"}},
		},
		{
			name: "two Upgrade lines",
			in:   http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket", "h2c"}},
			want: http.Header{"Connection": {"Upgrade"}},
		},
		{
			name: "underscore spelling of Upgrade",
			in:   http.Header{"Connection": {"close"}, "UPGRADE": {"h2c"}},
			want: http.Header{"Connection": {"close"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.in.Clone()
			removeHopByHop(h)
			if len(h) != len(tt.want) {
				t.Fatalf("got %v, want %v", h, tt.want)
			}
			for k, v := range tt.want {
				if !slices.Equal(h[k], v) {
					t.Fatalf("got %v, want %v", h, tt.want)
				}
			}
		})
	}
}
