package jwt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Run keeps the key set of the JWKS URL fresh until ctx ends: it fetches
// it at once (unless Refresh already has), then after the interval the
// last response asked for (see Config.JWKSURL), after a failure again in
// 5 s, 10 s, ... up to a minute, and early whenever a token named an
// unknown kid (at most once per EarlyRefreshGap). A failed fetch keeps the
// last good key set in force, and says so in a WARN line and in
// sluice_jwt_jwks_refreshes_total{result="error"}. Without a JWKS URL, Run
// only waits for ctx. Run it once.
func (v *Verifier) Run(ctx context.Context) {
	if v.jwksURL == "" {
		<-ctx.Done()
		return
	}
	for {
		c, stop := v.after(v.untilNext())
		select {
		case <-ctx.Done():
			stop()
			return
		case <-c:
		case <-v.kick:
			stop()
		}
		_ = v.Refresh(ctx) // logged and counted; the loop goes on
	}
}

// untilNext is how long Run waits before its next fetch.
func (v *Verifier) untilNext() time.Duration {
	v.fetchMu.Lock()
	defer v.fetchMu.Unlock()
	if v.lastFetch.IsZero() {
		return 0
	}
	return max(0, v.wait-v.now().Sub(v.lastFetch))
}

// Refresh fetches the JWKS URL now and puts its keys in force, or keeps
// the last good set when the fetch fails, returning the failure. It is
// what Run does on its schedule; a gateway may call it once at start-up,
// with its own deadline, to verify tokens from the first request on.
// Without a JWKS URL it does nothing.
func (v *Verifier) Refresh(ctx context.Context) error {
	if v.jwksURL == "" {
		return nil
	}
	v.fetchMu.Lock()
	defer v.fetchMu.Unlock()
	start := v.now()
	v.holdEarly(start)
	keys, skipped, wait, err := v.fetch(ctx)
	v.lastFetch = start
	if err == nil {
		v.failures, v.wait = 0, wait
		v.set.Store(&keySet{keys: keys, at: start})
	} else {
		v.failures++
		v.wait = min(maxRetry, firstRetry<<min(v.failures-1, 10))
		err = fmt.Errorf("jwt: JWKS %s: %w", v.urlLabel, err)
	}
	v.record("JWKS", v.urlLabel, len(keys), skipped, err)
	v.fetchedOnce.Do(func() { close(v.fetched) })
	return err
}

// Reload reads the JWKS file again (on SIGHUP) and puts its keys in
// force, or keeps the last good set when the file cannot be read or holds
// no usable key, returning why. Without a JWKS file it does nothing.
func (v *Verifier) Reload() error {
	if v.file == "" {
		return nil
	}
	if err := v.readKeyFile(); err != nil {
		return fmt.Errorf("jwt: JWKS file %s: %w", v.file, err)
	}
	return nil
}

// readKeyFile is Reload, its error without the file's name.
func (v *Verifier) readKeyFile() error {
	v.fetchMu.Lock()
	defer v.fetchMu.Unlock()
	now := v.now()
	data, err := readFile(v.file)
	var keys []verifyKey
	var skipped []string
	if err == nil {
		keys, skipped, err = parseJWKS(data)
	}
	if err == nil {
		v.set.Store(&keySet{keys: keys, at: now})
	}
	var logged error
	if err != nil {
		logged = fmt.Errorf("jwt: JWKS file %s: %w", v.file, err)
	}
	v.record("JWKS file", v.file, len(keys), skipped, logged)
	return err
}

// record logs and counts one fetch or read of a key set.
func (v *Verifier) record(what, where string, n int, skipped []string, err error) {
	for _, s := range skipped {
		v.log.Warn(what+": a key is left out", zap.String("source", where), zap.String("reason", s))
	}
	if err != nil {
		fields := []zap.Field{zap.String("source", where), zap.Error(err)}
		if set := v.set.Load(); set != nil {
			fields = append(fields, zap.Int("keys_in_force", len(set.keys)), zap.Duration("age", v.now().Sub(set.at)))
		} else {
			fields = append(fields, zap.Int("keys_in_force", 0))
		}
		v.log.Warn(what+" refresh failed; the last good key set stays in force", fields...)
	} else {
		v.log.Debug(what+" refreshed", zap.String("source", where), zap.Int("keys", n))
	}
	v.metrics.refreshed(err == nil)
	v.onFetch(err)
}

// fetch gets and parses the JWKS URL, returning its keys, the keys it
// left out and why, and how long until the next refresh.
func (v *Verifier) fetch(ctx context.Context) ([]verifyKey, []string, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.jwksURL, nil)
	if err != nil {
		return nil, nil, 0, err
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	res, err := v.client.Do(req)
	if err != nil {
		// The error of a failed request names the URL, which may hold a
		// password; keep only its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, nil, 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(res.Body, 4096)) //nolint:errcheck // only to reuse the connection
		return nil, nil, 0, fmt.Errorf("status %d", res.StatusCode)
	}
	data, err := readLimited(res.Body)
	if err != nil {
		return nil, nil, 0, err
	}
	keys, skipped, err := parseJWKS(data)
	return keys, skipped, refreshInterval(res.Header), err
}

// readLimited reads r whole, or fails past maxJWKSBytes.
func readLimited(r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxJWKSBytes+1))
	if err == nil && len(data) > maxJWKSBytes {
		err = fmt.Errorf("larger than %d bytes", maxJWKSBytes)
	}
	return data, err
}

// refreshInterval is how long a JWKS response may be used, from its
// Cache-Control: max-age, no-cache or no-store (MinRefresh), or
// DefaultRefresh without either, bounded by MinRefresh and MaxRefresh.
func refreshInterval(h http.Header) time.Duration {
	d := DefaultRefresh
	for _, line := range h.Values("Cache-Control") {
		for directive := range strings.SplitSeq(line, ",") {
			name, value, _ := strings.Cut(strings.TrimSpace(directive), "=")
			switch strings.ToLower(strings.TrimSpace(name)) {
			case "no-cache", "no-store":
				return MinRefresh
			case "max-age":
				n, err := strconv.ParseUint(strings.Trim(strings.TrimSpace(value), `"`), 10, 64)
				if err == nil {
					d = time.Duration(min(n, uint64(MaxRefresh/time.Second))) * time.Second
				}
			}
		}
	}
	return min(max(d, MinRefresh), MaxRefresh)
}

// refreshSoon asks Run for an early refresh, unless a fetch started, or an
// early refresh was asked for, less than EarlyRefreshGap ago. It never
// blocks.
func (v *Verifier) refreshSoon() {
	if v.jwksURL == "" {
		return
	}
	now := v.now().UnixNano()
	next := v.nextEarly.Load()
	if now < next || !v.nextEarly.CompareAndSwap(next, now+int64(EarlyRefreshGap)) {
		return
	}
	select {
	case v.kick <- struct{}{}:
	default:
	}
}

// holdEarly puts off early refreshes until EarlyRefreshGap after a fetch
// that starts at start.
func (v *Verifier) holdEarly(start time.Time) {
	n := start.Add(EarlyRefreshGap).UnixNano()
	for {
		old := v.nextEarly.Load()
		if old >= n || v.nextEarly.CompareAndSwap(old, n) {
			return
		}
	}
}
