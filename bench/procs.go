package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/proctest"
)

// stopGrace is how long a process may take to exit after SIGTERM before it
// is killed. sluice exits at once when no request is in flight.
const stopGrace = 10 * time.Second

// procs starts the harness's child processes and guarantees they end:
// stopAll (deferred by run) stops whatever is still running, and each child
// also gets a signal if the harness itself dies (see setDeathSignal).
type procs struct {
	dir string // working directory: logs go here

	mu   sync.Mutex
	live []*proc
}

// proc is one running child process.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string        // file holding its stdout and stderr
	done chan struct{} // closed when it has exited
	err  error         // its exit status, once done is closed
}

// start runs bin with args and exactly env as its environment (nothing is
// inherited: a SLUICE_* variable of the caller must not leak into a
// target).
func (ps *procs) start(name string, env []string, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(ps.dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	ps.mu.Lock()
	ps.live = append(ps.live, p)
	ps.mu.Unlock()
	return p, nil
}

// stop ends p: SIGTERM, then SIGKILL after stopGrace. It returns once p has
// exited.
func (ps *procs) stop(p *proc) {
	ps.mu.Lock()
	ps.live = slices.DeleteFunc(ps.live, func(q *proc) bool { return q == p })
	ps.mu.Unlock()
	p.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // it may have exited already
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		p.cmd.Process.Kill() //nolint:errcheck // same
		<-p.done
	}
}

// stopAll stops every process still running, newest first.
func (ps *procs) stopAll() {
	ps.mu.Lock()
	live := slices.Clone(ps.live)
	ps.mu.Unlock()
	for _, p := range slices.Backward(live) {
		ps.stop(p)
	}
}

// procName names the instance-th process of a kind: name itself for the
// first, so that a single process keeps its plain name.
func procName(name string, instance int) string {
	if instance == 0 {
		return name
	}
	return fmt.Sprintf("%s-%d", name, instance)
}

// failure describes why p is not usable, with the end of its log.
func (p *proc) failure(err error) error {
	b, _ := os.ReadFile(p.log)
	return fmt.Errorf("%s: %w\n--- %s ---\n%s", p.name, err, p.log, tail(b, 2000))
}

// logsTo writes to w the end of the log of every live process whose name
// starts with prefix and whose log is not empty: what the targets said
// (at their log level) while they were measured.
func (ps *procs) logsTo(w io.Writer, prefix string) {
	ps.mu.Lock()
	live := slices.Clone(ps.live)
	ps.mu.Unlock()
	for _, p := range live {
		if !strings.HasPrefix(p.name, prefix) {
			continue
		}
		if b, _ := os.ReadFile(p.log); len(b) > 0 {
			fmt.Fprintf(w, "--- %s ---\n%s\n", p.name, tail(b, 4000))
		}
	}
}

// tail is the end of b, at most n bytes of it.
func tail(b []byte, n int) string {
	if len(b) > n {
		return "…" + string(b[len(b)-n:])
	}
	return strings.TrimSpace(string(b))
}

// waitReady polls url until it answers 200, p exits, or a deadline passes.
func waitReady(ctx context.Context, p *proc, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if res, err := client.Do(req); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return p.failure(fmt.Errorf("exited before it was ready: %v", p.err))
		case <-ctx.Done():
			return p.failure(fmt.Errorf("not ready at %s: %w", url, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freeAddr returns a loopback address with a port that was free a moment
// ago and that this run has not handed out before, from below the
// kernel's ephemeral range (see proctest.FreePort: a port from that range,
// as port 0 gives, can become the local end of any outgoing connection
// before the child binds it). Another process could still take it first;
// the child then fails to start and says so.
func freeAddr() (string, error) {
	p, err := proctest.Port()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", p), nil
}

// freeAddrs is freeAddr for a public and an admin listener.
func freeAddrs() (public, admin string, err error) {
	if public, err = freeAddr(); err != nil {
		return "", "", err
	}
	admin, err = freeAddr()
	return public, admin, err
}

// childEnv is the harness's environment without any sluice setting, plus
// extra: targets see only the settings the harness gives them.
func childEnv(extra ...string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "SLUICE_") || strings.HasPrefix(kv, "DATABASE_URL=")
	})
	return append(env, extra...)
}

var errNoWrk = errors.New("wrk not found on PATH: install it with apt-get install -y wrk")
