package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/proxy/identity"
)

// allower is what the gate needs of a redis_rate.Limiter.
type allower interface {
	Allow(ctx context.Context, key string, limit redis_rate.Limit) (*redis_rate.Result, error)
}

var _ allower = (*redis_rate.Limiter)(nil)

// The identities a rule may count by: the ones the harness's scenarios
// use.
const (
	byIP     = "ip"
	byGlobal = "global"
	byTenant = "tenant"
)

// tenantHeader is the header a "by tenant" rule reads, as sluice's
// default.
const tenantHeader = "X-Tenant-ID"

// rule is one limit of the gate: every request is counted by it, under
// the key of its identity.
type rule struct {
	name  string
	by    string // byIP, byGlobal or byTenant
	limit redis_rate.Limit
}

// parseRule reads the -limit flag's form NAME=BY,COUNT,WINDOW, e.g.
// ip=ip,1000000,1h. The limit is a GCRA of COUNT per WINDOW with a burst
// of COUNT, redis_rate's own PerHour(COUNT) for a window of an hour.
func parseRule(s string) (rule, error) {
	name, spec, ok := strings.Cut(s, "=")
	parts := strings.Split(spec, ",")
	if !ok || name == "" || strings.ContainsAny(name, ":*?[]") || len(parts) != 3 {
		return rule{}, fmt.Errorf("expected NAME=BY,COUNT,WINDOW, got %q", s)
	}
	by := parts[0]
	if by != byIP && by != byGlobal && by != byTenant {
		return rule{}, fmt.Errorf("%q: BY must be ip, global or tenant", s)
	}
	count, err := strconv.Atoi(parts[1])
	if err != nil || count < 1 {
		return rule{}, fmt.Errorf("%q: COUNT must be a positive integer", s)
	}
	window, err := time.ParseDuration(parts[2])
	if err != nil || window <= 0 {
		return rule{}, fmt.Errorf("%q: WINDOW must be a positive Go duration (1h, 24h)", s)
	}
	return rule{name: name, by: by, limit: redis_rate.Limit{Rate: count, Burst: count, Period: window}}, nil
}

// gate limits every request by its rules, one redis_rate Allow call per
// rule in order, and passes the allowed ones to next. A request that a
// rule denies is answered 429 at once: the rules after it are not asked,
// and what the rules before it counted stays counted (redis_rate has no
// atomic check of several keys; a Go user writes the calls one after the
// other). A rule whose call fails lets the request through (fail open)
// and is counted as failed.
type gate struct {
	rules   []rule
	prefix  string // of every key, before the rule's name
	trusted identity.TrustedProxies
	lim     allower
	timeout time.Duration // of one Allow call; 0: none
	next    http.Handler

	allowed, limited, failed atomic.Int64 // checks, by outcome
}

// key is the Redis key (without redis_rate's own "rate:") that ru counts
// r by. It derives the identity as sluice does: the client IP is the
// rightmost untrusted X-Forwarded-For entry behind a trusted peer, IPv6
// grouped by /64; the tenant is the canonical X-Tenant-ID, and a request
// without one counts its client IP instead. Unlike sluice it does not
// hash the identifier: a redis_rate user keys by the raw value.
func (g *gate) key(r *http.Request, ru rule, client netip.Addr) (string, error) {
	switch ru.by {
	case byGlobal:
		return g.prefix + ru.name, nil
	case byTenant:
		tenant, found, err := identity.Header(r.Header, tenantHeader)
		if err != nil {
			return "", err
		}
		if found {
			return g.prefix + ru.name + ":tenant:" + tenant, nil
		}
	}
	return g.prefix + ru.name + ":ip:" + hashing.IPGroup(client), nil
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	client := g.trusted.ClientIP(r.RemoteAddr, r.Header)
	remaining, limit := -1, 0
	for _, ru := range g.rules {
		key, err := g.key(r, ru, client)
		if err != nil {
			http.Error(w, "rule '"+ru.name+"': "+err.Error(), http.StatusBadRequest)
			return
		}
		res, err := g.allow(r.Context(), key, ru.limit)
		switch {
		case err != nil:
			g.failed.Add(1)
		case res.Allowed == 0:
			g.limited.Add(1)
			w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(res.RetryAfter), 10))
			http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
			return
		default:
			g.allowed.Add(1)
			if remaining < 0 || res.Remaining < remaining {
				remaining, limit = res.Remaining, ru.limit.Burst
			}
		}
	}
	if remaining >= 0 {
		w.Header().Set("X-RateLimit-Limit", strconv.Itoa(limit))
		w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	}
	g.next.ServeHTTP(w, r)
}

// allow asks redis_rate about key under the gate's deadline.
func (g *gate) allow(ctx context.Context, key string, limit redis_rate.Limit) (*redis_rate.Result, error) {
	if g.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.timeout)
		defer cancel()
	}
	res, err := g.lim.Allow(ctx, key, limit)
	if err == nil && res == nil {
		err = errors.New("redis_rate: no result")
	}
	return res, err
}

// ceilSeconds is d in whole seconds, rounded up, at least 1.
func ceilSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}

// metricName is the counter the gate exposes at /metrics, in the form
// the harness reads sluice's sluice_decisions_total.
const metricName = "bench_redis_decisions_total"

// writeMetrics writes the gate's counters of checks by outcome in the
// Prometheus text format.
func (g *gate) writeMetrics(w io.Writer) {
	fmt.Fprintf(w, "# TYPE %s counter\n", metricName)
	fmt.Fprintf(w, "%s{outcome=\"allowed\"} %d\n", metricName, g.allowed.Load())
	fmt.Fprintf(w, "%s{outcome=\"limited\"} %d\n", metricName, g.limited.Load())
	fmt.Fprintf(w, "%s{outcome=\"failed_open\"} %d\n", metricName, g.failed.Load())
}
