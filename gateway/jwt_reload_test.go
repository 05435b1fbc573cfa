//go:build unix

package gateway

import (
	"os"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestJWTReloadJWKSFileOnSIGHUP: SIGHUP (sent to this process, as an
// operator sends it to sluice's) re-reads SLUICE_JWT_JWKS_FILE, also when
// the rules come from SLUICE_RULES: a key added verifies, a key removed
// stops verifying; a file that no longer reads keeps the last good keys,
// and says so in sluice_jwt_jwks_refreshes_total.
func TestJWTReloadJWKSFileOnSIGHUP(t *testing.T) {
	m := mintGateway(t)
	file := writeJWKS(t, m.JWKS("rsa"))
	env := base()
	env["SLUICE_UPSTREAM"] = "http://127.0.0.1:9" // nothing answers: 502 after the decision
	env["SLUICE_RULES"] = "api: GET /api/* by jwt 1000/1h"
	env["SLUICE_JWT_JWKS_FILE"] = file
	env["SLUICE_JWT_ISSUER"], env["SLUICE_JWT_AUDIENCE"] = jwtIssuer, jwtAudience
	core, logs := observer.New(zapcore.InfoLevel)
	_, r := startJWT(t, env, nil, zap.New(core))
	alice, rotated := m.Token(t, "alice-rs"), m.Token(t, "new-key")
	expect := func(step, token, query string, want int64) {
		t.Helper()
		send(t, r.url+"/api/x", token)
		if n := used(t, r, "rule=api&"+query); n != want {
			t.Fatalf("%s: %s counted %d times, want %d", step, query, n, want)
		}
	}
	hup := func(series string, want float64) {
		t.Helper()
		hup(t)
		waitMetric(t, r, series, want) // the signal arrives asynchronously
	}
	expect("the file's key", alice, "jwt=alice", 1)
	expect("a key not in the file", rotated, "ip=127.0.0.1", 1)
	if got := metric(t, r, refreshesOK); got != 1 {
		t.Fatalf("%v reads of the file counted at start-up, want 1", got)
	}

	replaceFile(t, file, m.JWKS("rsa-new"))
	hup(refreshesOK, 2)
	expect("the key added", rotated, "jwt=rotated-user", 1)
	expect("the key removed", alice, "ip=127.0.0.1", 2)
	if logs.FilterMessage("JWKS file reloaded").Len() != 1 || logs.FilterMessageSnippet("only SLUICE_JWT_JWKS_FILE is read again").Len() != 1 {
		t.Errorf("the reload was not logged: %v", logs.All())
	}

	replaceFile(t, file, []byte(`{"keys":[`))
	hup(refreshesError, 1)
	expect("the last good key after a broken file", rotated, "jwt=rotated-user", 2)
	if logs.FilterMessageSnippet("JWKS file refresh failed; the last good key set stays in force").Len() != 1 {
		t.Errorf("the failed reload was not logged: %v", logs.All())
	}
}

// hup sends SIGHUP to this process, as an operator sends it to sluice's.
func hup(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}
