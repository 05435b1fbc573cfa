//go:build unix

package main

// Tests of the sluice binary as a whole: the commands main dispatches,
// and the process's signals. The gateway's own tests are in package
// gateway, the fault tests in package faults.

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/proctest"
)

// TestCommands: main dispatches each command to its function, refuses an
// unknown one and arguments a command does not take.
func TestCommands(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		args   []string
		env    map[string]string
		output string // the start of stdout
		err    string // in the error; "" for none
	}{
		{[]string{"frobnicate"}, nil, "", `unknown command "frobnicate"`},
		{[]string{"migrate"}, nil, "", "migrate: no database configured"},
		{[]string{"check-config", "extra"}, nil, "", `check-config takes no arguments, got "extra"`},
		{[]string{"check-config"}, map[string]string{"SLUICE_UPSTREAM": "http://127.0.0.1:3000", "SLUICE_RULES": "a: GET /a by ip 1/1m"}, "configuration ok", ""},
		{[]string{"check-config"}, map[string]string{}, "", "SLUICE_UPSTREAM: required"},
		{[]string{"healthcheck"}, map[string]string{"SLUICE_ADMIN_LISTEN": "nonsense"}, "", "healthcheck: SLUICE_ADMIN_LISTEN"},
		{[]string{"version"}, nil, "sluice ", ""},
		{[]string{"--version"}, nil, "sluice ", ""},
		{[]string{"-version"}, nil, "sluice ", ""},
		{[]string{"help"}, nil, "usage: sluice", ""},
		{[]string{"--help"}, nil, "usage: sluice", ""},
		{[]string{"-help"}, nil, "usage: sluice", ""},
		{[]string{"-h"}, nil, "usage: sluice", ""},
	} {
		var out bytes.Buffer
		err := run(ctx, tc.args, tc.env, &out)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: got %v, want an error containing %q", tc.args, err, tc.err)
		case !strings.HasPrefix(out.String(), tc.output):
			t.Errorf("%q printed %q, want it to start with %q", tc.args, out.String(), tc.output)
		}
	}
}

// TestDemoUpstream: `sluice demo-upstream ADDR` answers every request with
// 200 and a line naming it, until its context ends.
func TestDemoUpstream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"demo-upstream", addr}, nil, io.Discard) }()
	var res *http.Response
	for deadline := time.Now().Add(10 * time.Second); ; {
		if res, err = http.Get("http://" + addr + "/hello"); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the listener opens in another goroutine
	}
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(body) != "demo upstream: GET /hello\n" {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"demo-upstream", "a", "b"}, nil, io.Discard); err == nil {
		t.Fatal("demo-upstream accepted two arguments")
	}
}

// sluiceBinary is the sluice binary, built once per test run as users
// build it (no race detector); TestMain removes it.
func sluiceBinary(t *testing.T) string { return proctest.Sluice(t) }

func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }

// TestSIGHUPNeverKills runs the real binary: SIGHUP with a good file, a
// bad file, and a SIGHUP with no rules file at all leave it serving, and
// SIGTERM then stops it with status 0.
func TestSIGHUPNeverKills(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := sluiceBinary(t)
	rules := filepath.Join(dir, "rules")
	os.WriteFile(rules, []byte("a: GET /a by ip 5/1m\n"), 0o600)
	for _, env := range [][]string{
		{"SLUICE_RULES_FILE=" + rules},
		{"SLUICE_RULES=a: GET /a by ip 5/1m"},
	} {
		cmd := exec.Command(bin)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "SLUICE_UPSTREAM=http://127.0.0.1:9",
			"SLUICE_LISTEN=127.0.0.1:0", "SLUICE_ADMIN_LISTEN=127.0.0.1:0"}, env...)
		logs := &proctest.Buffer{}
		cmd.Stderr = logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		admin := proctest.LoggedAddr(logs, "admin_listen", nil, 10*time.Second)
		if admin == "" {
			cmd.Process.Kill()
			t.Fatalf("%v: no admin listener within 10 s; log:\n%s", env, logs.String())
		}
		waitHTTP(t, "http://"+admin+"/healthz")
		for _, src := range []string{"a: GET /a by ip 6/1m\n", "a: GETT /a by ip 6/1m\n"} {
			os.WriteFile(rules, []byte(src), 0o600)
			cmd.Process.Signal(syscall.SIGHUP)
			time.Sleep(200 * time.Millisecond) // let the signal be handled, or kill
			waitHTTP(t, "http://"+admin+"/healthz")
		}
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%v: sluice exited with %v after SIGHUPs; log:\n%s", env, err, logs.String())
		}
		want := []string{`"msg":"rules reloaded"`, `"msg":"rules not reloaded: the running rules stay"`}
		if env[0][:len("SLUICE_RULES=")] == "SLUICE_RULES=" {
			want = []string{"nothing to reload: the rules come from SLUICE_RULES"}
		}
		for _, w := range want {
			if !strings.Contains(logs.String(), w) {
				t.Errorf("%v: the log lacks %s:\n%s", env, w, logs.String())
			}
		}
	}
}

// waitHTTP waits up to 10 s for url to answer 200.
func waitHTTP(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("%s did not answer 200 within 10 s: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond) // a process starting in the background
	}
}
