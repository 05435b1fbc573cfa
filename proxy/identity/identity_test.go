package identity

import (
	"net/http"
	"testing"
)

func TestHeader(t *testing.T) {
	tests := []struct {
		name string
		h    http.Header
		want string // "" with err false: not found
		err  bool
	}{
		{name: "present", h: http.Header{"X-Tenant-Id": {"acme"}}, want: "acme"},
		{name: "case kept", h: http.Header{"X-Tenant-Id": {"AcMe"}}, want: "AcMe"},
		{name: "trimmed", h: http.Header{"X-Tenant-Id": {"  acme\t"}}, want: "acme"},
		{name: "Unicode white space trimmed", h: http.Header{"X-Tenant-Id": {"\u00a0acme\u3000"}}, want: "acme"},
		{name: "missing", h: http.Header{"X-Other": {"acme"}}},
		{name: "empty", h: http.Header{"X-Tenant-Id": {""}}},
		{name: "blank", h: http.Header{"X-Tenant-Id": {"  "}}},
		{name: "two lines", h: http.Header{"X-Tenant-Id": {"acme", "evil"}}, err: true},
		{name: "two equal lines", h: http.Header{"X-Tenant-Id": {"acme", "acme"}}, err: true},
		{name: "list", h: http.Header{"X-Tenant-Id": {"acme, evil"}}, err: true},
		{name: "empty list element", h: http.Header{"X-Tenant-Id": {"acme,"}}, err: true},
		{name: "non-canonical key", h: http.Header{"x-tenant-id": {"acme"}}, want: "acme"},
		{name: "underscore variant beside", h: http.Header{"X-Tenant-Id": {"acme"}, "X_tenant_id": {"evil"}}, err: true},
		{name: "tab inside", h: http.Header{"X-Tenant-Id": {"ac\tme"}}, err: true},
		{name: "C1 control", h: http.Header{"X-Tenant-Id": {"acme\u0085x"}}, err: true},
		{name: "DEL", h: http.Header{"X-Tenant-Id": {"acme\x7f"}}, err: true},
		{name: "zero width space", h: http.Header{"X-Tenant-Id": {"acme\u200b"}}, err: true},
		{name: "BOM", h: http.Header{"X-Tenant-Id": {"\ufeffacme"}}, err: true},
		{name: "obs-text (not UTF-8)", h: http.Header{"X-Tenant-Id": {"acme\xa0"}}, err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found, err := Header(tt.h, "X-Tenant-Id")
			expectLookup(t, got, found, err, tt.want, tt.err, "acme", "evil")
		})
	}
}

func TestHeaderNameEqual(t *testing.T) {
	for want, pairs := range map[bool][][2]string{
		true: {{"X-Tenant-Id", "x_tenant_ID"}, {"X-Tenant-Id", "X-Tenant-Id"}, {"a-b", "A_B"}},
		// Header names are ASCII: no Unicode folding of the Kelvin sign.
		false: {{"X-Tenant-Id", "X-Tenant-Ix"}, {"X-Tenant-Id", "X-Tenant-I"}, {"\u212A", "k"}},
	} {
		for _, p := range pairs {
			if got := HeaderNameEqual(p[0], p[1]); got != want {
				t.Errorf("HeaderNameEqual(%q, %q) = %v, want %v", p[0], p[1], got, want)
			}
		}
	}
}

func TestBearer(t *testing.T) {
	const tok = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ2aWN0aW0ifQ.c2ln"
	tests := []struct {
		name string
		h    http.Header
		want string // "" with err false: not found
		err  bool
	}{
		{name: "bearer", h: http.Header{"Authorization": {"Bearer " + tok}}, want: tok},
		{name: "scheme in lower case", h: http.Header{"Authorization": {"bearer " + tok}}, want: tok},
		{name: "scheme in upper case", h: http.Header{"Authorization": {"BEARER " + tok}}, want: tok},
		{name: "several spaces", h: http.Header{"Authorization": {"Bearer   " + tok}}, want: tok},
		{name: "b64token characters and padding", h: http.Header{"Authorization": {"Bearer a-._~+/Z9=="}}, want: "a-._~+/Z9=="},
		{name: "non-canonical key", h: http.Header{"authorization": {"Bearer " + tok}}, want: tok},
		{name: "missing", h: http.Header{"X-Other": {"Bearer " + tok}}},
		{name: "basic", h: http.Header{"Authorization": {"Basic dXNlcjpwYXNz"}}},
		{name: "another scheme that starts like it", h: http.Header{"Authorization": {"Bearerx " + tok}}},
		{name: "scheme alone of another kind", h: http.Header{"Authorization": {"Negotiate"}}},
		{name: "empty", h: http.Header{"Authorization": {""}}},
		{name: "two lines", h: http.Header{"Authorization": {"Bearer " + tok, "Bearer evil"}}, err: true},
		{name: "two equal lines", h: http.Header{"Authorization": {"Bearer " + tok, "Bearer " + tok}}, err: true},
		{name: "bearer beside basic", h: http.Header{"Authorization": {"Basic dXNlcjpwYXNz", "Bearer evil"}}, err: true},
		{name: "two spellings", h: http.Header{"Authorization": {"Bearer " + tok}, "authorization": {"Bearer evil"}}, err: true},
		{name: "list", h: http.Header{"Authorization": {"Bearer " + tok + ", Bearer evil"}}, err: true},
		{name: "two tokens", h: http.Header{"Authorization": {"Bearer " + tok + " evil"}}, err: true},
		{name: "scheme alone", h: http.Header{"Authorization": {"Bearer"}}, err: true},
		{name: "scheme and spaces", h: http.Header{"Authorization": {"Bearer   "}}, err: true},
		{name: "tab", h: http.Header{"Authorization": {"Bearer\t" + tok}}, err: true},
		{name: "padding only", h: http.Header{"Authorization": {"Bearer =="}}, err: true},
		{name: "padding inside", h: http.Header{"Authorization": {"Bearer ab=cd"}}, err: true},
		{name: "quotes", h: http.Header{"Authorization": {`Bearer "` + tok + `"`}}, err: true},
		{name: "control character", h: http.Header{"Authorization": {"Bearer ab\x01cd"}}, err: true},
		{name: "non-ASCII", h: http.Header{"Authorization": {"Bearer ab\u00e9cd"}}, err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found, err := Bearer(tt.h)
			expectLookup(t, got, found, err, tt.want, tt.err, tok, "evil")
		})
	}
}
