package proxy

import "net/http"

// hdrSpoofable lists the headers a client could use to pose as another
// client, another host or scheme, another path or another method, to sluice
// or to the upstream. None of them is believed, and none is passed on.
var hdrSpoofable = [...]string{
	"Forwarded",
	"X-Real-IP",
	"True-Client-IP",
	"CF-Connecting-IP",
	"X-Client-IP",
	"Client-IP",
	"Fastly-Client-IP",
	"X-Cluster-Client-IP",
	"X-Original-Forwarded-For",
	"X-ProxyUser-IP",
	"X-Host",
	"X-Original-Host",
	// Path overrides honoured by some frameworks (Symfony, IIS URL
	// Rewrite): they would let a request be matched under one path and
	// served under another.
	"X-Original-URL",
	"X-Rewrite-URL",
	"X-HTTP-Method-Override",
	"X-HTTP-Method",
	"X-Method-Override",
}

// hdrSpoofablePrefix covers X-Forwarded-For, -Host, -Proto, -Port, -Prefix,
// -Server, -Ssl, -Scheme and any other member of the family.
const hdrSpoofablePrefix = "X-Forwarded-"

// stripClientHeaders removes from h every header a client might use to
// spoof its address, the host, scheme, port or path prefix the upstream
// believes it was reached under, or the request method (see hdrSpoofable;
// every X-Forwarded-* header is removed).
//
// Names are matched case-insensitively and with '_' equal to '-', because
// Go only canonicalises names it considers valid tokens, and CGI-style
// upstreams (PHP, Python WSGI, Ruby Rack) fold both "X-Real-IP" and
// "x_real_ip" into the same HTTP_X_REAL_IP variable: a spelling sluice
// ignored must not reach them. The caller sets its own forwarding headers
// after stripping.
func stripClientHeaders(h http.Header) {
	for name := range h {
		if hdrIsSpoofable(name) {
			delete(h, name) // deleting during range is safe in Go
		}
	}
}

// hdrIsSpoofable reports whether a header of that name must be stripped.
func hdrIsSpoofable(name string) bool {
	if len(name) >= len(hdrSpoofablePrefix) && hdrNameEqual(name[:len(hdrSpoofablePrefix)], hdrSpoofablePrefix) {
		return true
	}
	for _, s := range hdrSpoofable {
		if hdrNameEqual(name, s) {
			return true
		}
	}
	return false
}

// hdrNameEqual reports whether two header names are the same for a
// CGI-style upstream: ASCII case-insensitive, with '_' equal to '-'.
func hdrNameEqual(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if hdrFold(a[i]) != hdrFold(b[i]) {
			return false
		}
	}
	return true
}

// hdrFold maps a header name byte to its CGI-style comparison form.
func hdrFold(c byte) byte {
	switch {
	case 'a' <= c && c <= 'z':
		return c - ('a' - 'A')
	case c == '_':
		return '-'
	}
	return c
}
