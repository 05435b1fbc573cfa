package proxy

import (
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/proxy/identity"
)

// spoofable lists the headers a client could use to pose as another
// client, another host or scheme, another path or another method, to
// sluice or to the upstream. None of them is believed, and none is passed
// on: the upstream sees only the forwarding headers sluice sets itself.
var spoofable = [...]string{
	// Client addresses, as CDNs, load balancers and frameworks name them.
	"Forwarded",
	"Forwarded-For",
	"X-Forwarded",
	"X-Real-IP",
	"True-Client-IP",
	"CF-Connecting-IP",
	"X-Client-IP",
	"Client-IP",
	"Fastly-Client-IP",
	"Akamai-Client-IP",
	"X-Azure-ClientIP",
	"X-Cluster-Client-IP",
	"X-Originating-IP",
	"X-Remote-IP",
	"X-Remote-Addr",
	"X-Envoy-External-Address",
	"X-AppEngine-User-IP",
	"X-Original-Forwarded-For",
	"X-ProxyUser-IP",
	// Hosts.
	"X-Host",
	"X-Original-Host",
	// Path overrides honoured by some frameworks (Symfony, IIS URL
	// Rewrite): they would let a request be matched under one path and
	// served under another.
	"X-Original-URL",
	"X-Rewrite-URL",
	// Method overrides: a request would be matched under its own method
	// and served under another. (A "_method" field is read instead.)
	"X-HTTP-Method-Override",
	"X-HTTP-Method",
	"X-Method-Override",
}

// spoofablePrefix covers X-Forwarded-For, -Host, -Proto, -Port, -Prefix,
// -Server, -Ssl, -Scheme and any other member of the family.
const spoofablePrefix = "X-Forwarded-"

// stripClientHeaders removes from h every header a client might use to
// spoof its address, the host, scheme, port or path prefix the upstream
// believes it was reached under, or the request method (see spoofable;
// every X-Forwarded-* header is removed).
//
// Names are matched as identity.HeaderNameEqual matches them, because
// CGI-style upstreams fold "X-Real-IP" and "x_real_ip" into one
// HTTP_X_REAL_IP variable: a spelling sluice ignored must not reach them.
// The caller sets its own forwarding headers after stripping.
func stripClientHeaders(h http.Header) {
	for name := range h {
		if isSpoofable(name) {
			delete(h, name) // deleting during range is safe in Go
		}
	}
}

// isSpoofable reports whether a header of that name must be stripped.
func isSpoofable(name string) bool {
	if len(name) >= len(spoofablePrefix) && identity.HeaderNameEqual(name[:len(spoofablePrefix)], spoofablePrefix) {
		return true
	}
	for _, s := range spoofable {
		if identity.HeaderNameEqual(name, s) {
			return true
		}
	}
	return false
}

// removeHopByHop removes from h what concerns only the connection between
// the client and sluice, before anything is read from h, so that sluice
// reads identities and methods from the request the upstream will receive:
//
//   - Every header named in Connection (matched as stripClientHeaders
//     matches names) is removed: httputil.ReverseProxy would drop it on the
//     way upstream, so an identity header named there is absent, and the
//     rule counts the client IP. TE is left for the proxy, which passes on
//     only "TE: trailers".
//   - Upgrade is kept only for a WebSocket handshake (exactly one Upgrade
//     value, "websocket", announced in Connection), which the proxy then
//     tunnels. Any other upgrade, such as h2c, is removed with
//     HTTP2-Settings, and the request is forwarded as a plain one: an
//     upstream that switched protocols would give the client a tunnel that
//     sluice no longer sees.
//
// Connection itself is left to httputil.ReverseProxy, which drops it on the
// way upstream (and sends its own for a WebSocket upgrade).
func removeHopByHop(h http.Header) {
	conn := h["Connection"]
	if len(conn) == 0 && len(h["Upgrade"]) == 0 && len(h["Http2-Settings"]) == 0 {
		return
	}
	websocket := isWebSocket(h)
	for _, line := range conn {
		for token := range strings.SplitSeq(line, ",") {
			token = strings.Trim(token, " \t")
			switch {
			case token == "",
				websocket && strings.EqualFold(token, "Upgrade"),
				strings.EqualFold(token, "TE"),
				strings.EqualFold(token, "Connection"):
				continue
			}
			for name := range h {
				if identity.HeaderNameEqual(name, token) {
					delete(h, name)
				}
			}
		}
	}
	if !websocket {
		for name := range h {
			if identity.HeaderNameEqual(name, "Upgrade") || identity.HeaderNameEqual(name, "Http2-Settings") {
				delete(h, name)
			}
		}
	}
}

// isWebSocket reports whether h asks for a WebSocket upgrade and nothing
// else.
func isWebSocket(h http.Header) bool {
	up := h["Upgrade"]
	if len(up) != 1 || !strings.EqualFold(strings.Trim(up[0], " \t"), "websocket") {
		return false
	}
	for _, line := range h["Connection"] {
		for token := range strings.SplitSeq(line, ",") {
			if strings.EqualFold(strings.Trim(token, " \t"), "Upgrade") {
				return true
			}
		}
	}
	return false
}
