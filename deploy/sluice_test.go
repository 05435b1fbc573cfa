package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// process is a sluice started from the built binary.
type process struct {
	url, admin string // http://127.0.0.1:port of the public and admin listeners
	out        *lockedBuffer
}

// lockedBuffer collects a process's output while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startSluice runs the built binary with only env (and PATH) as its
// environment, on free loopback ports, waits until its admin listener
// answers /healthz, and stops it with SIGTERM when the test ends.
func startSluice(t testing.TB, env map[string]string) *process {
	t.Helper()
	bin := sluiceBinary(t)
	public, admin := freePort(t), freePort(t)
	p := &process{
		url:   fmt.Sprintf("http://127.0.0.1:%d", public),
		admin: fmt.Sprintf("http://127.0.0.1:%d", admin),
		out:   &lockedBuffer{},
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
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // may have exited
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill() //nolint:errcheck
			<-exited
		}
	})
	// The admin listener answers at once; the public one opens once the
	// store is ready (/readyz 200).
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, _ := httpGet(p.admin + "/readyz"); code == http.StatusOK {
			if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", public)); err == nil {
				c.Close()
				return p
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("sluice exited: %v\n%s", err, p.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice is not ready (/readyz 200 and the public port open) within 30s\n%s", p.out)
		}
		time.Sleep(20 * time.Millisecond) // start-up is an external event: poll it
	}
}

// scrape reads the exposition at url into series → value, each series
// written as in the exposition, e.g. sluice_store_errors_total{kind="timeout"}.
func scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	code, body := httpGet(url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		m[line[:i]] = v
	}
	return m
}
