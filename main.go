// Command sluice is a rate-limiting reverse proxy whose limits are kept in
// PostgreSQL, so they hold across every gateway instance and survive
// restarts.
//
//	sluice               run the gateway
//	sluice migrate       apply the database migrations and exit
//	sluice check-config  validate the settings and rules, print the rules
//	sluice version       print the version, the commit and the Go version
//	sluice healthcheck   probe the admin listener's /healthz, exit 0 or 1
//	sluice demo-upstream serve a tiny demo API for the quickstart
//	sluice --help        list the commands and every setting
//
// This file only dispatches: each command, and the assembly of a gateway
// (settings, store, limiter, listeners, lifecycle, reloads), is in package
// gateway, the only package of sluice it imports.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sluicehq/sluice/gateway"
)

// version and commit are set at link time by release builds and the
// container image:
//
//	go build -ldflags "-X main.version=1.4.0 -X main.commit=$(git rev-parse HEAD)"
//
// Left empty, they come from the build information the Go toolchain
// records in every binary (see gateway.Stamp). Nothing assigns them at run
// time.
var (
	version string
	commit  string
)

func main() {
	// SIGHUP's default action ends the process. It reloads the rules once
	// the gateway serves (gateway.Gateway.Run asks for it again); until
	// then, and for every other command, it is ignored rather than fatal.
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], environ(), os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice:", err)
		os.Exit(1)
	}
}

// run executes the command named by args and returns when it is done: for
// the gateway, when ctx is cancelled and in-flight requests have finished.
func run(ctx context.Context, args []string, env map[string]string, stdout io.Writer) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd = args[0]
	}
	switch {
	case cmd == "demo-upstream" && len(args) == 2:
		return gateway.DemoUpstream(ctx, args[1], stdout)
	case len(args) > 1:
		return fmt.Errorf("%s takes no arguments, got %q", cmd, strings.Join(args[1:], " "))
	}
	stamp := gateway.Stamp{Version: version, Commit: commit}
	switch cmd {
	case "serve":
		return gateway.Serve(ctx, env, gateway.Options{Stamp: stamp})
	case "check-config":
		return gateway.CheckConfig(env, stdout)
	case "migrate":
		return gateway.Migrate(ctx, env, stdout)
	case "version", "--version", "-version":
		return gateway.Version(stdout, stamp)
	case "healthcheck":
		return gateway.Healthcheck(ctx, env, stdout)
	case "demo-upstream":
		return gateway.DemoUpstream(ctx, "", stdout)
	case "help", "-h", "--help", "-help":
		return gateway.Help(stdout)
	default:
		return fmt.Errorf("unknown command %q: sluice --help lists the commands", cmd)
	}
}

// environ returns the process environment as a map.
func environ() map[string]string {
	m := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}
