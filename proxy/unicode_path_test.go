package proxy

import "testing"

// TestAttackUnicodePathSpellings: spellings that readers which ignore case
// or normalise compatibility forms, and Windows, read as a rule's path are
// counted under that rule; the upstream still receives the canonical path
// as sent, since folding is for matching only; and a raw "#" is refused.
func TestAttackUnicodePathSpellings(t *testing.T) {
	up := newUpstream(t)
	g := newGateway(t, up, "login: POST /api/login by ip 1000/1h; admin: * /admin/* by ip 1000/1h", gatewayOpts{})
	login := []string{"login=ip:127.0.0.1"}
	admin := []string{"admin=ip:127.0.0.1"}
	replay(t, g, up, []attack{
		{name: "dotless i", msg: request("POST", "/api/log%C4%B1n", ""), status: 200, keys: login},
		{name: "fullwidth", msg: request("POST", "/%EF%BD%81pi/login", ""), status: 200, keys: login},
		{name: "NTFS stream", msg: request("GET", "/ADMIN::$DATA/x", ""), status: 200, keys: admin},
		{name: "fullwidth solidus", msg: request("GET", "/admin%EF%BC%8Fx", ""), status: 200, keys: admin},
		{name: "ideographic space", msg: request("GET", "/admin%E3%80%80/x", ""), status: 200, keys: admin},
		{name: "fragment", msg: request("GET", "/api/x#/../admin/x", ""), status: 400},
		{name: "fullwidth dot dot", msg: request("GET", "/admin/%EF%BC%8E%EF%BC%8E/api/login", ""), status: 400},
	})
	for _, target := range []string{"/ADM%C4%B1N::$DATA/x", "/admin%EF%BC%8Fx%E3%80%80"} {
		g.send(t, request("GET", target, ""), false)
		if r, _ := up.lastRequest(); r.URL.RequestURI() != target {
			t.Errorf("the upstream received %q, want %q: folding is for matching only", r.URL.RequestURI(), target)
		}
	}
}
