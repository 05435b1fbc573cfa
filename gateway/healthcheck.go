package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// healthcheckTimeout bounds one probe, connection included. Container
// runtimes give a check 30 s by default; a live process answers in
// microseconds.
const healthcheckTimeout = 3 * time.Second

// Healthcheck is `sluice healthcheck`: it asks the admin listener of the
// sluice running on this host (in this container) whether it is alive:
// GET /healthz at SLUICE_ADMIN_LISTEN (see loadHealthcheck), the only
// setting it reads. It returns nil on 200 and an error otherwise, so the
// process exits 0 or 1. It is the container image's HEALTHCHECK: the image
// has no shell and no curl.
func Healthcheck(ctx context.Context, environ map[string]string, stdout io.Writer) error {
	url, err := loadHealthcheck(environ)
	if err != nil {
		return err
	}
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
