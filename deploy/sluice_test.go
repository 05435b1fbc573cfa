package deploy

import (
	"cmp"
	"fmt"
	"net"
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
	url, admin string // http://127.0.0.1:port of the public and admin listeners
	out        *proctest.Buffer
	stop       func(t testing.TB) // SIGTERM, and wait for the exit
}

// startSluice runs the built binary with only env (and PATH) as its
// environment, on free loopback ports, waits until its admin listener
// answers /healthz, and stops it with SIGTERM when the test ends.
func startSluice(t testing.TB, env map[string]string) *process {
	t.Helper()
	bin := sluiceBinary(t)
	public, admin := proctest.FreePort(t), proctest.FreePort(t)
	p := &process{
		url:   fmt.Sprintf("http://127.0.0.1:%d", public),
		admin: fmt.Sprintf("http://127.0.0.1:%d", admin),
		out:   &proctest.Buffer{},
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		fmt.Sprintf("SLUICE_LISTEN=127.0.0.1:%d", public),
		fmt.Sprintf("SLUICE_ADMIN_LISTEN=127.0.0.1:%d", admin),
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
	// The admin listener answers at once; the public one (or, for a
	// decision service without an upstream, the check or gRPC listener) opens
	// once the store is ready (/readyz 200).
	opens := fmt.Sprintf("127.0.0.1:%d", public)
	if env["SLUICE_UPSTREAM"] == "" {
		opens = cmp.Or(env["SLUICE_CHECK_LISTEN"], env["SLUICE_RLS_LISTEN"], opens)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, _ := httpGet(p.admin + "/readyz"); code == http.StatusOK {
			if c, err := net.Dial("tcp", opens); err == nil {
				c.Close()
				return p
			}
		}
		select {
		case <-exited:
			t.Fatalf("sluice exited: %v\n%s", cmd.ProcessState, p.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice is not ready (/readyz 200 and %s open) within 30s\n%s", opens, p.out)
		}
		time.Sleep(20 * time.Millisecond) // start-up is an external event: poll it
	}
}

// scrape reads the exposition at url into series → value, each series
// written as in the exposition, e.g. sluice_store_errors_total{kind="timeout"}.
func scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	return proctest.Scrape(t, client, url)
}
