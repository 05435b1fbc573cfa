package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/caarlos0/env/v11"
)

// healthcheckTimeout bounds one probe, connection included. Container
// runtimes give a check 30 s by default; a live process answers in
// microseconds.
const healthcheckTimeout = 3 * time.Second

// healthcheckSettings are the only settings `sluice healthcheck` reads, with
// the same names and defaults as in settings (a test keeps them equal), so
// that the probe works whatever else the environment holds or lacks.
type healthcheckSettings struct {
	AdminListen string `env:"SLUICE_ADMIN_LISTEN" envDefault:"127.0.0.1:9090"`
}

// healthcheck asks the admin listener of the sluice running on this host
// (in this container) whether it is alive: GET /healthz at
// SLUICE_ADMIN_LISTEN, where an unspecified host (":9090", "0.0.0.0:9090",
// "[::]:9090") means loopback. It returns nil on 200 and an error
// otherwise, so the process exits 0 or 1. It is the container image's
// HEALTHCHECK: the image has no shell and no curl.
func healthcheck(ctx context.Context, environ map[string]string, stdout io.Writer) error {
	var s healthcheckSettings
	if err := env.ParseWithOptions(&s, env.Options{Environment: environ}); err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	host, port, err := net.SplitHostPort(s.AdminListen)
	if err != nil {
		return fmt.Errorf("healthcheck: SLUICE_ADMIN_LISTEN: expected host:port such as 127.0.0.1:9090, got %q", s.AdminListen)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		// A wildcard listener also listens on loopback (Go's "tcp"
		// listeners on [::] are dual-stack).
		host = "127.0.0.1"
	}
	url := "http://" + net.JoinHostPort(host, port) + "/healthz"
	ctx, cancel := context.WithTimeout(ctx, healthcheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	// No proxy from the environment: the probe is for this host's sluice.
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	res, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer res.Body.Close()
	io.Copy(io.Discard, io.LimitReader(res.Body, 4096)) //nolint:errcheck // only the status matters
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: GET %s: %s", url, res.Status)
	}
	fmt.Fprintf(stdout, "healthy: GET %s: %s\n", url, res.Status)
	return nil
}
