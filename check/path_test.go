package check

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/proctest"
)

// The rules of the path tests: each limit is one, spent before the
// spellings are tried, so a spelling that left its rule would be allowed.
const pathRules = "login: POST /api/login by ip 1/1h; secret: GET /api/secret by ip 1/1h; keys: GET /api/keys by ip 1/1h; admin: * /admin/* by ip 1/1h"

// pathSpellings are spellings of the rules' paths that some upstream reads
// as the rule's path (see policy's TestPathReaders for which reader reads
// each how): every one must stay under its rule, on every listener.
var pathSpellings = []struct {
	name, method, target, rule string
}{
	{"dotless i (Java equalsIgnoreCase)", "POST", "/api/log%C4%B1n", "login"},
	{"dotless i, raw UTF-8", "POST", "/api/log\u0131n", "login"},
	{"dotted capital I", "POST", "/API/LOG%C4%B0N", "login"},
	{"long s (EqualFold, /iu)", "GET", "/api/%C5%BFecret", "secret"},
	{"Kelvin sign", "GET", "/api/%E2%84%AAeys", "keys"},
	{"dotless i in a prefix", "GET", "/adm%C4%B1n/x", "admin"},
	{"fullwidth letters", "GET", "/%EF%BD%81%EF%BD%84%EF%BD%8D%EF%BD%89%EF%BD%8E/x", "admin"},
	{"fullwidth letters, raw UTF-8", "GET", "/ＡＤＭＩＮ/x", "admin"},
	{"fullwidth solidus", "GET", "/admin%EF%BC%8Fx", "admin"},
	{"fullwidth solidus, raw UTF-8", "GET", "/admin／x", "admin"},
	{"NTFS ::$DATA", "GET", "/admin::$DATA/x", "admin"},
	{"NTFS ::$data", "GET", "/admin::$data/x", "admin"},
	{"NTFS ::$INDEX_ALLOCATION", "GET", "/admin::$INDEX_ALLOCATION/x", "admin"},
	{"NTFS :$i30:$INDEX_ALLOCATION", "GET", "/admin:$i30:$INDEX_ALLOCATION/x", "admin"},
	{"NTFS ::$DATA on the last segment", "POST", "/api/login::$DATA", "login"},
	{"NTFS encoded colons", "POST", "/api/login%3A%3A$DATA", "login"},
	{"no-break space", "POST", "/api/login%C2%A0", "login"},
	{"ideographic space", "POST", "/api/login%E3%80%80", "login"},
	{"em space on a directory", "GET", "/admin%E2%80%83/x", "admin"},
	{"ogham space mark", "GET", "/api/secret%E1%9A%80", "secret"},
	{"line separator and a dot", "GET", "/api/secret%E2%80%A8.", "secret"},
}

// pathRefusals are spellings sluice cannot tell how the upstream reads:
// 400 on every listener, and nothing counted.
var pathRefusals = []struct{ name, method, target string }{
	{"fullwidth solidus and dot dot", "GET", "/admin%EF%BC%8F..%EF%BC%8Fapi/secret"},
	{"fullwidth full stops", "GET", "/admin/x/%EF%BC%8E%EF%BC%8E/%EF%BC%8E%EF%BC%8E/api/secret"},
	{"two dot leader", "GET", "/admin/%E2%80%A5/api/secret"},
	{"dot dot and an NTFS stream", "GET", "/admin/..::$INDEX_ALLOCATION/api/secret"},
	{"dot dot and a no-break space", "GET", "/admin/..%C2%A0/api/secret"},
	{"overlong dot dot", "GET", "/admin/%C0%AE%C0%AE/api/secret"},
	{"overlong solidus", "GET", "/admin%C0%AF..%C0%AFapi/secret"},
}

// rawSend writes a raw HTTP/1.1 request to addr, so that no client
// library respells its target, and reads the answer.
func rawSend(t *testing.T, addr, method, target string, header ...string) answer {
	t.Helper()
	msg := method + " " + target + " HTTP/1.1\r\nHost: sluice.test\r\nConnection: close\r\n"
	for i := 0; i < len(header); i += 2 {
		msg += header[i] + ": " + header[i+1] + "\r\n"
	}
	res, body := proctest.Raw(t, addr, msg+"Content-Length: 0\r\n\r\n", false)
	return answer{res.StatusCode, res.Header, body}
}

// listeners are the two ways a fixture is asked about a request: through
// the proxy, with the request itself, and through the check listener, with
// the request described in X-Forwarded-Uri (and in X-Original-URI, nginx's
// name, which must read alike).
var listeners = []struct {
	name string
	do   func(t *testing.T, f *fixture, method, target string) answer
}{
	{"proxy", func(t *testing.T, f *fixture, method, target string) answer {
		return rawSend(t, f.proxy.Listener.Addr().String(), method, target)
	}},
	{"check", func(t *testing.T, f *fixture, method, target string) answer {
		return rawSend(t, f.check.Listener.Addr().String(), "GET", "/", "X-Forwarded-Method", method, "X-Forwarded-Uri", target)
	}},
	{"check, nginx's headers", func(t *testing.T, f *fixture, method, target string) answer {
		return rawSend(t, f.check.Listener.Addr().String(), "GET", "/", "X-Original-Method", method, "X-Original-URI", target)
	}},
}

// TestPathSpellingsEveryListener: with each rule's limit spent, every
// spelling of its path is denied under that rule, on the proxy and on the
// check listener alike; spellings sluice cannot read as the upstream will
// are refused with 400 on both.
func TestPathSpellingsEveryListener(t *testing.T) {
	for _, l := range listeners {
		t.Run(l.name, func(t *testing.T) {
			f := newFixture(t, pathRules, options{})
			for _, spend := range []struct{ method, target string }{{"POST", "/api/login"}, {"GET", "/api/secret"}, {"GET", "/api/keys"}, {"GET", "/admin/x"}} {
				if a := l.do(t, f, spend.method, spend.target); a.code != http.StatusOK {
					t.Fatalf("%s %s: %d %s, want 200", spend.method, spend.target, a.code, a.body)
				}
			}
			for _, s := range pathSpellings {
				a := l.do(t, f, s.method, s.target)
				if a.code != http.StatusTooManyRequests || !strings.Contains(a.body, `"violated-policies":["`+s.rule+`"]`) {
					t.Errorf("%s: %s %s: %d %s, want 429 under %q", s.name, s.method, s.target, a.code, a.body, s.rule)
				}
			}
			for _, s := range pathRefusals {
				if a := l.do(t, f, s.method, s.target); a.code != http.StatusBadRequest || a.header.Get("Content-Type") != "application/problem+json" {
					t.Errorf("%s: %s %s: %d %s, want 400 problem+json", s.name, s.method, s.target, a.code, a.body)
				}
			}
			if n := f.upstream.Load(); l.name == "proxy" && n != 4 {
				t.Errorf("the upstream saw %d requests, want the 4 that spent the limits", n)
			}
		})
	}
}

// TestFragment: a raw "#" in a request target, or in the target a proxy
// describes, is refused with 400 on every listener, before anything is
// counted: the upstream may read the path up to it, or past it.
func TestFragment(t *testing.T) {
	targets := []string{
		"/api/x#/../secret",
		"/api/secret#",
		"/api/x?q=1#/../../secret",
		"/api/x?q=#",
	}
	for _, l := range listeners {
		t.Run(l.name, func(t *testing.T) {
			f := newFixture(t, pathRules, options{})
			if a := l.do(t, f, "GET", "/api/secret"); a.code != http.StatusOK {
				t.Fatalf("GET /api/secret: %d, want 200", a.code)
			}
			for _, target := range targets {
				a := l.do(t, f, "GET", target)
				if a.code != http.StatusBadRequest || a.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(a.body, `"status":400`) {
					t.Errorf("GET %s: %d %s, want 400 problem+json", target, a.code, a.body)
				}
			}
			if a := l.do(t, f, "GET", "/api/secret"); a.code != http.StatusTooManyRequests {
				t.Errorf("GET /api/secret again: %d, want 429", a.code)
			}
		})
	}
	// An absolute URL with a fragment, as a proxy may describe one.
	f := newFixture(t, pathRules, options{})
	if a := f.ask(t, "/", about("GET", "https://example.com/api/x#/../secret")...); a.code != http.StatusBadRequest {
		t.Errorf("absolute URL with a fragment: %d %s, want 400", a.code, a.body)
	}
}
