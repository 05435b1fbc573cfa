//go:build unix

package faults

// Gateways as processes of the sluice binary.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/proctest"
)

// sluiceBinary is the sluice binary, built once per test run as users
// build it (no race detector); TestMain removes it.
func sluiceBinary(t *testing.T) string { return proctest.Sluice(t) }

func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }

// process is a sluice binary running as a child of the test, on free
// loopback ports, its output collected.
type process struct {
	cmd           *exec.Cmd
	public, admin string
	out           *proctest.Buffer
	exited        chan struct{}
}

// startProcess starts bin with env, its SLUICE_LISTEN and
// SLUICE_ADMIN_LISTEN on loopback ports the kernel chooses (p.public and
// p.admin are set by waitAccepts, from the log); it is killed if the test
// binary dies, and stopped when the test ends. The log level is info for
// the lines that give the ports: with the access log off, info adds only
// the lines of start, reload and stop to the warnings.
func startProcess(t *testing.T, bin string, env map[string]string) *process {
	t.Helper()
	p := &process{out: &proctest.Buffer{}}
	p.cmd = exec.Command(bin)
	p.cmd.Env = []string{"SLUICE_LISTEN=127.0.0.1:0", "SLUICE_ADMIN_LISTEN=127.0.0.1:0", "SLUICE_LOG_LEVEL=info"}
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	exited, err := proctest.StartChild(p.cmd, syscall.SIGKILL)
	if err != nil {
		t.Fatal(err)
	}
	p.exited = exited
	t.Cleanup(func() { p.stop(t) })
	return p
}

// startGatewayProcesses starts n gateway processes of the binary with env
// and waits until each accepts requests and says it is ready.
func startGatewayProcesses(t *testing.T, n int, env map[string]string) []*process {
	t.Helper()
	bin := sluiceBinary(t)
	var ps []*process
	for range n {
		p := startProcess(t, bin, env)
		ps = append(ps, p)
	}
	for _, p := range ps {
		if !p.waitAccepts(30 * time.Second) {
			t.Fatalf("a gateway did not open its port:\n%s", p.output())
		}
		waitFor(t, 30*time.Second, "the gateway is ready", func() bool {
			res, err := faultClient.Get("http://" + p.admin + "/readyz")
			if err != nil {
				return false
			}
			res.Body.Close()
			return res.StatusCode == 200
		})
	}
	return ps
}

// waitAccepts waits until the public listener accepts a connection (the
// process logs its address then, with the admin listener's) and sets
// p.public and p.admin.
func (p *process) waitAccepts(limit time.Duration) bool {
	p.public = proctest.LoggedAddr(p.out, "listen", p.exited, limit)
	p.admin = proctest.LoggedAddr(p.out, "admin_listen", p.exited, time.Second)
	return p.public != "" && p.admin != ""
}

// stop sends SIGTERM and waits for the process to exit.
func (p *process) stop(t *testing.T) {
	if !proctest.Stop(p.cmd, p.exited, 30*time.Second) {
		t.Errorf("sluice did not stop within 30s of SIGTERM:\n%s", p.output())
	}
}

func (p *process) output() string { return p.out.String() }

// metrics reads the process's /metrics into series → value, each series
// written as in the exposition (proctest.ParseMetrics). Unlike
// proctest.Scrape it may be called from any goroutine.
func (p *process) metrics() (map[string]float64, error) {
	res, err := faultClient.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	return proctest.ParseMetrics(res.Body)
}

// metricValue returns the value of one series of the process's /metrics;
// it is an error when the series is absent.
func (p *process) metricValue(series string) (float64, error) {
	m, err := p.metrics()
	if err != nil {
		return 0, err
	}
	v, ok := m[series]
	if !ok {
		return 0, fmt.Errorf("%s: no series %s", p.admin, series)
	}
	return v, nil
}

// storeMetrics returns the store's latency histogram and statement count
// from the process's /metrics, for failure messages.
func (p *process) storeMetrics() string {
	m, err := p.metrics()
	if err != nil {
		return err.Error()
	}
	var kept []string
	for series, v := range m {
		for _, prefix := range []string{"sluice_store_duration_seconds_bucket", "sluice_db_decide_statements_total",
			"sluice_db_decisions_total", "sluice_store_breaker", "sluice_db_pool_", "sluice_db_progress_questions_total",
			"sluice_lease_", "sluice_store_errors_total"} {
			if strings.HasPrefix(series, prefix) {
				kept = append(kept, fmt.Sprint(series, " ", v))
			}
		}
	}
	slices.Sort(kept)
	return strings.Join(kept, " ")
}

// gateway is the process as a faultGateway, for requests and metrics.
func (p *process) gateway() *faultGateway {
	return &faultGateway{url: "http://" + p.public, admin: "http://" + p.admin}
}

// kill kills the process (SIGKILL) and waits until it has exited.
func (p *process) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck // it may have died already
	<-p.exited
}

// busyCores starts n processes that each keep a core busy, for at most
// limit; the returned function stops them.
func busyCores(t *testing.T, n int, limit time.Duration) func() {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	var cmds []*exec.Cmd
	for range n {
		cmd := exec.CommandContext(ctx, "sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			cancel()
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	stop := func() {
		cancel()
		for _, c := range cmds {
			c.Wait() //nolint:errcheck // killed, or waited for already
		}
	}
	t.Cleanup(stop)
	return stop
}

// rss returns the resident memory of process pid in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(v, "%d kB", &kb); err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
