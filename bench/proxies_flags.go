package main

// The flags of bench proxies.

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// proxiesOptions are the flags of bench proxies.
type proxiesOptions struct {
	databaseURL      string // empty: no PostgreSQL targets
	load             load
	warmup, duration time.Duration
	rounds           int
	callers, conns   int // gRPC callers, and the HTTP/2 connections they share
	keys             int // distinct X-Tenant-ID values and descriptor values
	deadline         time.Duration
}

func parseProxiesFlags(args []string) (proxiesOptions, error) {
	fs := flag.NewFlagSet("bench proxies", flag.ContinueOnError)
	defaultURL := defaultDatabaseURL()
	var o proxiesOptions
	fs.StringVar(&o.databaseURL, "database-url", defaultURL, "Postgres for the postgres targets (a database of the run's own is created and dropped); empty leaves them out")
	o.load.flags(fs)
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load per target before its first round")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "one measured run")
	fs.IntVar(&o.rounds, "rounds", 3, "measured runs per target, taken in turns")
	fs.IntVar(&o.callers, "callers", 64, "concurrent gRPC callers (closed loop)")
	fs.IntVar(&o.conns, "grpc-connections", 4, "HTTP/2 connections the gRPC callers share, as Envoy's workers hold")
	fs.IntVar(&o.keys, "keys", 10000, "distinct keys (tenants) in rotation")
	fs.DurationVar(&o.deadline, "timeout", 10*time.Minute, "give up (and clean up) after this long")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.load.check() != nil:
		return o, o.load.check()
	case o.duration < time.Second || o.warmup < 0 || o.rounds < 1:
		return o, errors.New("-duration must be at least 1s (wrk counts whole seconds), -warmup not negative, -rounds at least 1")
	case o.callers < 1 || o.conns < 1 || o.keys < 1:
		return o, errors.New("-callers, -grpc-connections and -keys must be at least 1")
	}
	return o, nil
}
