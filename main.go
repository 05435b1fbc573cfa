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
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	// SIGHUP's default action ends the process. It reloads the rules once
	// the gateway serves (gateway.serve asks for it again); until then, and
	// for every other command, it is ignored rather than fatal.
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
		return demoUpstream(ctx, args[1], stdout)
	case len(args) > 1:
		return fmt.Errorf("%s takes no arguments, got %q", cmd, strings.Join(args[1:], " "))
	}
	switch cmd {
	case "serve", "check-config":
	case "migrate":
		// Needs only the database and the schema: a migration job has
		// nothing else of the gateway's configuration.
		return migrateCmd(ctx, env, stdout)
	case "version", "--version", "-version":
		return printVersion(stdout)
	case "healthcheck":
		return healthcheck(ctx, env, stdout)
	case "demo-upstream":
		return demoUpstream(ctx, "", stdout)
	case "help", "-h", "--help", "-help":
		return writeUsage(stdout)
	default:
		return fmt.Errorf("unknown command %q: sluice --help lists the commands", cmd)
	}

	cfg, err := load(env)
	if err != nil {
		return err
	}
	switch cmd {
	case "check-config":
		return checkConfig(cfg, stdout)
	}
	return serve(ctx, cfg)
}

// checkConfig prints the parsed rules as a table.
func checkConfig(cfg *config, stdout io.Writer) error {
	store := "memory (per-instance, not durable)"
	if cfg.databaseURL != "" {
		store = "postgres, schema " + cfg.DBSchema
	}
	fmt.Fprintf(stdout, "configuration ok: upstream %s, store %s, %d rules\n\n", cfg.upstream.Redacted(), store, len(cfg.policy.Rules()))
	return cfg.policy.WriteTable(stdout)
}

// migrate applies the migrations and reports how many were new.
func migrate(ctx context.Context, cfg *config, stdout io.Writer) error {
	if cfg.databaseURL == "" {
		return errors.New("migrate: no database configured: set SLUICE_DATABASE_URL")
	}
	pool, err := openPool(cfg, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := applyMigrations(ctx, pool, cfg.DBSchema)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "schema %s: %d migrations applied\n", cfg.DBSchema, n)
	return nil
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
