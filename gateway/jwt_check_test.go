package gateway

import (
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// checkJWT runs a gateway that answers forward-auth only (no
// SLUICE_UPSTREAM, SLUICE_CHECK_LISTEN on a free loopback port), whose
// tokens are verified with the keys of the minted JWK set in a file and
// the secret, trusting the asking proxies in trusted ("" for none), with
// the extra settings given. It returns the check listener's URL, once it
// accepts, and the running gateway (for its admin listener).
func checkJWT(t *testing.T, jwksFile, trusted, rules string, extra ...string) (string, *running) {
	t.Helper()
	env := jwtEnv("", "", rules) // no upstream, and the keys in a file
	env["SLUICE_JWT_JWKS_FILE"] = jwksFile
	env["SLUICE_CHECK_LISTEN"] = "127.0.0.1:0"
	env["SLUICE_TRUSTED_PROXIES"] = trusted
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	_, r, _ := serveGatewayAsync(t, env, Options{Logger: zap.NewNop()})
	url := "http://" + r.addr(t, "SLUICE_CHECK_LISTEN")
	pgtest.ClearOf(t, time.Hour, 10*time.Second) // the callers count in the rules' hour windows
	return url, r
}

// askJWT asks the check listener at url about GET uri from the client at
// xff ("": no X-Forwarded-For), with the bearer token the asking proxy
// passes on ("": none), and returns the answer, its body read and closed.
func askJWT(t *testing.T, url, uri, xff, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Forwarded-Method", "GET")
	req.Header.Set("X-Forwarded-Uri", uri)
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return sendDiscard(t, req)
}

// TestJWTForwardAuth: forward-auth (SLUICE_CHECK_LISTEN) keys a jwt rule
// by the verified claim of the token the asking proxy passes on, as the
// public proxy does: one user's tokens of two algorithms share one quota,
// whatever client address the proxy reports, and plans choose the limit.
// A forged token is counted by the client IP the asker reports when the
// asker is trusted, by the asker's own address when it is not, and never
// under its victim's key; with SLUICE_JWT_INVALID=reject it gets 401 with
// the Bearer challenge.
func TestJWTForwardAuth(t *testing.T) {
	m := mintGateway(t)
	jwks := writeJWKS(t, m.JWKS("rsa", "ec"))
	const rules = "api: GET /api/* by jwt 2/1h\nplan: GET /plan/* by jwt 1/1h plans(app_metadata.plan)=pro:3/1h"
	const client = "198.51.100.7"

	t.Run("trusted asker", func(t *testing.T) {
		url, r := checkJWT(t, jwks, "127.0.0.1/32", rules)
		var got []int
		for i, tok := range []string{"alice-rs", "alice-es", "alice-rs"} {
			// Each question says another client: the user's key does not
			// change with the address.
			xff := "198.51.100." + string(rune('1'+i))
			got = append(got, askJWT(t, url, "/api/x", xff, m.Token(t, tok)).StatusCode)
		}
		if got[0] != 200 || got[1] != 200 || got[2] != 429 {
			t.Fatalf("alice's questions: %v, want [200 200 429]", got)
		}
		if n := used(t, r, "rule=api&jwt=alice"); n != 2 {
			t.Errorf("alice's key counts %d, want 2", n)
		}
		for _, ip := range []string{"198.51.100.1", "198.51.100.2", "127.0.0.1"} {
			if n := used(t, r, "rule=api&ip="+ip); n != 0 {
				t.Errorf("ip %s counts %d: a verified token keys by its claim", ip, n)
			}
		}

		// A token signed with another key under the issuer's kid, and an
		// expired one, both naming the victim: counted by the client IP
		// the trusted asker reports.
		for _, tok := range []string{"evil-key", "expired"} {
			if res := askJWT(t, url, "/api/x", client, m.Token(t, tok)); res.StatusCode != 200 {
				t.Fatalf("%s: %d, want 200 (counted by IP)", tok, res.StatusCode)
			}
		}
		if n := used(t, r, "rule=api&ip="+client); n != 2 {
			t.Errorf("the reported client counts %d, want 2", n)
		}
		if n := used(t, r, "rule=api&jwt=victim"); n != 0 {
			t.Errorf("the victim's key counts %d, want 0", n)
		}

		// Plans: the pro user's verified plan gives 3, the free user the
		// rule's own 1; a pro plan in a forged token gives nothing.
		for _, tc := range []struct{ token, limit string }{{"pro", "3"}, {"free", "1"}, {"forged-pro", "1"}} {
			res := askJWT(t, url, "/plan/x", client, m.Token(t, tc.token))
			if res.StatusCode != 200 || res.Header.Get("X-Ratelimit-Limit") != tc.limit {
				t.Errorf("%s: %d, limit %q, want 200 and %s", tc.token, res.StatusCode, res.Header.Get("X-Ratelimit-Limit"), tc.limit)
			}
		}
	})

	t.Run("untrusted asker", func(t *testing.T) {
		url, r := checkJWT(t, jwks, "", rules)
		if res := askJWT(t, url, "/api/x", client, m.Token(t, "evil-key")); res.StatusCode != 200 {
			t.Fatalf("forged: %d, want 200 (counted by IP)", res.StatusCode)
		}
		if n := used(t, r, "rule=api&ip=127.0.0.1"); n != 1 {
			t.Errorf("the asker's own address counts %d, want 1: its X-Forwarded-For is not believed", n)
		}
		if n := used(t, r, "rule=api&ip="+client); n != 0 {
			t.Errorf("the client an untrusted asker reports counts %d, want 0", n)
		}
		if n := used(t, r, "rule=api&jwt=victim"); n != 0 {
			t.Errorf("the victim's key counts %d, want 0", n)
		}
	})

	t.Run("reject", func(t *testing.T) {
		url, r := checkJWT(t, jwks, "127.0.0.1/32", rules, "SLUICE_JWT_INVALID", "reject")
		res := askJWT(t, url, "/api/x", client, m.Token(t, "evil-key"))
		if res.StatusCode != 401 || res.Header.Get("Www-Authenticate") != `Bearer error="invalid_token"` {
			t.Fatalf("forged: %d %q, want 401 with the Bearer challenge", res.StatusCode, res.Header.Get("Www-Authenticate"))
		}
		if res := askJWT(t, url, "/api/x", client, ""); res.StatusCode != 200 {
			t.Fatalf("no token: %d, want 200 (counted by IP)", res.StatusCode)
		}
		if res := askJWT(t, url, "/api/x", client, m.Token(t, "rs-user")); res.StatusCode != 200 {
			t.Fatalf("valid: %d, want 200", res.StatusCode)
		}
		if n := used(t, r, "rule=api&ip="+client); n != 1 {
			t.Errorf("the client counts %d, want 1: the rejected question is counted nowhere", n)
		}
		if n := used(t, r, "rule=api&jwt=victim"); n != 0 {
			t.Errorf("the victim's key counts %d, want 0", n)
		}
	})
}
