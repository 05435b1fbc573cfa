package deploy

import (
	"cmp"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/proctest"
)

// process is a sluice started from the built binary.
type process struct {
	url, admin string // http://host:port of the public and admin listeners
	check, rls string // host:port of the check and gRPC listeners, when opened
	out        *proctest.Buffer
	stop       func(t testing.TB) // SIGTERM, and wait for the exit
}

// startSluice runs the built binary with only env (and PATH) as its
// environment, waits until it is ready (/readyz 200), and stops it with
// SIGTERM when the test ends. Its public and admin listeners are given
// port 0, as callers give the check and gRPC listeners (127.0.0.1:0): the
// kernel picks ports nothing else holds, and the addresses are read back
// from the child's log, where a port picked before the child starts may
// be taken by then.
func startSluice(t testing.TB, env map[string]string) *process {
	t.Helper()
	p := &process{out: &proctest.Buffer{}}
	cmd := exec.Command(sluiceBinary(t))
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"SLUICE_LISTEN=127.0.0.1:0",
		"SLUICE_ADMIN_LISTEN=127.0.0.1:0",
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	exited, err := proctest.StartChild(cmd, syscall.SIGKILL)
	if err != nil {
		t.Fatal(err)
	}
	p.stop = func(testing.TB) { proctest.Stop(cmd, exited, 30*time.Second) }
	t.Cleanup(func() { p.stop(t) })
	// The admin listener opens at once; the others once the store is
	// ready, and then sluice logs every address with "sluice started".
	admin := proctest.LoggedAddr(p.out, "admin_listen", exited, 30*time.Second)
	last := "listen"
	if env["SLUICE_UPSTREAM"] == "" {
		last = cmp.Or(map[bool]string{true: "check_listen"}[env["SLUICE_CHECK_LISTEN"] != ""], "rls_listen")
	}
	if admin == "" || proctest.LoggedAddr(p.out, last, exited, 30*time.Second) == "" {
		t.Fatalf("sluice did not open its listeners within 30s (%v)\n%s", cmd.ProcessState, p.out)
	}
	p.admin = "http://" + admin
	if a := proctest.LoggedAddr(p.out, "listen", nil, 0); a != "" {
		p.url = "http://" + a
	}
	p.check = proctest.LoggedAddr(p.out, "check_listen", nil, 0)
	p.rls = proctest.LoggedAddr(p.out, "rls_listen", nil, 0)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, _ := httpGet(p.admin + "/readyz"); code == http.StatusOK {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice is not ready (/readyz 200) within 30s\n%s", p.out)
		}
		time.Sleep(20 * time.Millisecond) // readiness is an external event: poll it
	}
}

// scrape reads the exposition at url into series → value, each series
// written as in the exposition, e.g. sluice_store_errors_total{kind="timeout"}.
func scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	return proctest.Scrape(t, client, url)
}
