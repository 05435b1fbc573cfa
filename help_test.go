package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestHelpListsEverySetting: --help and help name every command and every
// variable of the settings struct with its help text, and the README's
// settings table has one row for each variable.
func TestHelpListsEverySetting(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, arg := range []string{"--help", "help", "-h"} {
		var out bytes.Buffer
		if err := run(context.Background(), []string{arg}, nil, &out); err != nil {
			t.Fatalf("%s: %v", arg, err)
		}
		help := out.String()
		for _, c := range []string{"migrate", "check-config", "version", "healthcheck", "demo-upstream", "help"} {
			if !strings.Contains(help, "\n  "+c+" ") {
				t.Errorf("%s does not list the command %s", arg, c)
			}
		}
		st := reflect.TypeFor[settings]()
		for i := range st.NumField() {
			f := st.Field(i)
			name, h := f.Tag.Get("env"), f.Tag.Get("help")
			if name == "" || h == "" {
				t.Errorf("settings.%s: needs an env and a help tag", f.Name)
				continue
			}
			if !strings.Contains(help, "\n  "+name+" ") || !strings.Contains(help, h) {
				t.Errorf("%s does not list %s with its help", arg, name)
			}
			if n := settingsRows(string(readme), name); arg == "--help" && n != 1 {
				t.Errorf("README's settings table has %d rows for %s, want 1", n, name)
			}
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

// settingsRows counts the rows of the README's settings table (under "##
// Settings") that name the variable in their first column.
func settingsRows(readme, name string) int {
	_, section, _ := strings.Cut(readme, "\n## Settings\n")
	section, _, _ = strings.Cut(section, "\n## ")
	n := 0
	for line := range strings.SplitSeq(section, "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.Contains(cells[1], "`"+name+"`") {
			n++
		}
	}
	return n
}
