package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/proxy/identity"
)

func TestParseRule(t *testing.T) {
	r, err := parseRule("ip=ip,1000000,1h0m0s")
	if err != nil {
		t.Fatal(err)
	}
	want := rule{name: "ip", by: byIP, limit: redis_rate.PerHour(1000000)}
	if r != want {
		t.Errorf("parseRule = %+v, want %+v", r, want)
	}
	for _, bad := range []string{
		"", "ip", "ip=ip,10", "=ip,10,1h", "ip=email,10,1h", "ip=ip,0,1h", "ip=ip,ten,1h",
		"ip=ip,10,1d", "ip=ip,10,-1h", "i*p=ip,10,1h",
	} {
		if _, err := parseRule(bad); err == nil {
			t.Errorf("parseRule(%q): no error", bad)
		}
	}
}

// fakeLimiter records the keys it is asked about and denies the keys in
// deny.
type fakeLimiter struct {
	keys []string
	deny map[string]bool
	err  error
}

func (f *fakeLimiter) Allow(_ context.Context, key string, limit redis_rate.Limit) (*redis_rate.Result, error) {
	f.keys = append(f.keys, key)
	if f.err != nil {
		return nil, f.err
	}
	if f.deny[key] {
		return &redis_rate.Result{Limit: limit, RetryAfter: 1500 * time.Millisecond}, nil
	}
	return &redis_rate.Result{Limit: limit, Allowed: 1, Remaining: limit.Burst - 1}, nil
}

// upstreamCounter is a next handler that counts the requests it got.
type upstreamCounter struct{ n atomic.Int64 }

func (u *upstreamCounter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	u.n.Add(1)
	w.Write([]byte("ok\n"))
}

func mustRules(t *testing.T, specs ...string) []rule {
	t.Helper()
	var rs []rule
	for _, s := range specs {
		r, err := parseRule(s)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	return rs
}

func newGate(t *testing.T, lim allower, next http.Handler, specs ...string) *gate {
	t.Helper()
	trusted, err := identity.ParseTrustedProxies("127.0.0.1/32")
	if err != nil {
		t.Fatal(err)
	}
	return &gate{rules: mustRules(t, specs...), prefix: "p:", trusted: trusted, lim: lim, next: next}
}

// The keys of the harness's scenarios, derived as sluice derives its
// identities: the client behind the trusted 127.0.0.1 from
// X-Forwarded-For, one key for global, the tenant header or else the IP.
func TestKeysPerScenario(t *testing.T) {
	scenario3 := []string{"global=global,1000000000,1h", "ip=ip,1000000,1h", "tenant=tenant,1000000000,1h"}
	tests := []struct {
		name     string
		rules    []string
		remote   string
		xff      string
		tenant   string
		wantKeys []string
	}{
		{"scenario 1: client from X-Forwarded-For", []string{"ip=ip,1000000,1h"}, "127.0.0.1:4000", "198.18.3.7", "",
			[]string{"p:ip:ip:198.18.3.7"}},
		{"rightmost untrusted entry", []string{"ip=ip,1000000,1h"}, "127.0.0.1:4000", "10.0.0.1, 198.18.3.7, 127.0.0.1", "",
			[]string{"p:ip:ip:198.18.3.7"}},
		{"untrusted peer: its header is ignored", []string{"ip=ip,1000000,1h"}, "192.0.2.9:4000", "198.18.3.7", "",
			[]string{"p:ip:ip:192.0.2.9"}},
		{"IPv6 grouped by /64", []string{"ip=ip,1000000,1h"}, "127.0.0.1:4000", "2001:db8:1:2:3:4:5:6", "",
			[]string{"p:ip:ip:2001:db8:1:2::/64"}},
		{"scenario 2: one global key", []string{"global=global,1000000000,1h"}, "127.0.0.1:4000", "", "",
			[]string{"p:global"}},
		{"scenario 3: three checks in order", scenario3, "127.0.0.1:4000", "198.18.0.1", " tenant-3 ",
			[]string{"p:global", "p:ip:ip:198.18.0.1", "p:tenant:tenant:tenant-3"}},
		{"scenario 3 without a tenant: the tenant rule counts the IP", scenario3, "127.0.0.1:4000", "198.18.0.1", "",
			[]string{"p:global", "p:ip:ip:198.18.0.1", "p:tenant:ip:198.18.0.1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := &fakeLimiter{}
			up := &upstreamCounter{}
			g := newGate(t, lim, up, tt.rules...)
			req := httptest.NewRequest("GET", "/api/bench", nil)
			req.RemoteAddr = tt.remote
			if tt.xff != "" {
				req.Header.Set("X-Forwarded-For", tt.xff)
			}
			if tt.tenant != "" {
				req.Header.Set("X-Tenant-ID", tt.tenant)
			}
			rec := httptest.NewRecorder()
			g.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK || up.n.Load() != 1 {
				t.Errorf("status %d, upstream hit %d times; want 200 and once", rec.Code, up.n.Load())
			}
			if !slices.Equal(lim.keys, tt.wantKeys) {
				t.Errorf("keys = %q, want %q", lim.keys, tt.wantKeys)
			}
		})
	}
}

func TestDenialAnswers429WithoutUpstream(t *testing.T) {
	lim := &fakeLimiter{deny: map[string]bool{"p:ip:ip:198.18.0.1": true}}
	up := &upstreamCounter{}
	g := newGate(t, lim, up, "global=global,1000000000,1h", "ip=ip,10,24h", "tenant=tenant,1000000000,1h")
	req := httptest.NewRequest("GET", "/api/bench", nil)
	req.RemoteAddr = "127.0.0.1:4000"
	req.Header.Set("X-Forwarded-For", "198.18.0.1")
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, req)
	if rec.Code != http.StatusTooManyRequests {
		t.Errorf("status = %d, want 429", rec.Code)
	}
	if got := rec.Header().Get("Retry-After"); got != "2" {
		t.Errorf("Retry-After = %q, want 2 (1.5 s rounded up)", got)
	}
	if up.n.Load() != 0 {
		t.Errorf("upstream hit %d times, want never", up.n.Load())
	}
	if len(lim.keys) != 2 {
		t.Errorf("asked about %q; want the rules up to the denying one only", lim.keys)
	}
	if g.allowed.Load() != 1 || g.limited.Load() != 1 || g.failed.Load() != 0 {
		t.Errorf("counts allowed %d, limited %d, failed %d; want 1, 1, 0", g.allowed.Load(), g.limited.Load(), g.failed.Load())
	}
}

func TestFailureLetsThrough(t *testing.T) {
	lim := &fakeLimiter{err: errors.New("connection refused")}
	up := &upstreamCounter{}
	g := newGate(t, lim, up, "ip=ip,10,24h")
	req := httptest.NewRequest("GET", "/api/bench", nil)
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || up.n.Load() != 1 || g.failed.Load() != 1 {
		t.Errorf("status %d, upstream %d, failed %d; want 200, 1, 1", rec.Code, up.n.Load(), g.failed.Load())
	}
	var b strings.Builder
	g.writeMetrics(&b)
	if !strings.Contains(b.String(), `bench_redis_decisions_total{outcome="failed_open"} 1`+"\n") {
		t.Errorf("metrics lack the failure:\n%s", b.String())
	}
}

// redisClient connects to SLUICE_TEST_REDIS_URL, or else to the Redis of
// the development machine. Redis is only the benchmark's peer, which
// fresh CI machines lack: without the variable, a Redis that does not
// answer skips the test; with it, it fails the test.
func redisClient(t *testing.T) *redis.Client {
	t.Helper()
	u, set := os.LookupEnv("SLUICE_TEST_REDIS_URL")
	if !set {
		u = "redis://127.0.0.1:6379/0"
	}
	opts, err := redis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		if set {
			t.Fatalf("Redis at SLUICE_TEST_REDIS_URL: %v", err)
		}
		t.Skipf("no Redis at %s (%v); set SLUICE_TEST_REDIS_URL to make this a failure", u, err)
	}
	return rdb
}

// Against the real Redis: an IP's eleventh request in a day is denied
// without reaching the upstream, other IPs are not, and deletePrefix
// leaves nothing of the run behind.
func TestAgainstRedis(t *testing.T) {
	rdb := redisClient(t)
	ctx := context.Background()
	b := make([]byte, 4)
	rand.Read(b)
	prefix := "sluice-bench-test-" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() { deletePrefix(context.Background(), rdb, "rate:"+prefix) })

	up := &upstreamCounter{}
	g := newGate(t, redis_rate.NewLimiter(rdb), up, "ip=ip,10,24h")
	g.prefix, g.timeout = prefix, time.Second
	srv := httptest.NewServer(g)
	defer srv.Close()
	get := func(ip string) int {
		req, _ := http.NewRequest("GET", srv.URL+"/api/bench", nil)
		req.Header.Set("X-Forwarded-For", ip)
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for i := range 10 {
		if code := get("198.19.0.1"); code != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200", i+1, code)
		}
	}
	if code := get("198.19.0.1"); code != http.StatusTooManyRequests {
		t.Errorf("11th request: status %d, want 429", code)
	}
	if code := get("198.19.0.2"); code != http.StatusOK {
		t.Errorf("another IP: status %d, want 200", code)
	}
	if up.n.Load() != 11 {
		t.Errorf("upstream hit %d times, want 11 (the denial never reaches it)", up.n.Load())
	}
	if n, err := rdb.Exists(ctx, "rate:"+prefix+"ip:ip:198.19.0.1").Result(); err != nil || n != 1 {
		t.Errorf("key of 198.19.0.1: exists %d (%v), want 1", n, err)
	}

	n, err := deletePrefix(ctx, rdb, "rate:"+prefix)
	if err != nil || n != 2 {
		t.Errorf("deletePrefix = %d, %v; want the 2 keys", n, err)
	}
	if keys, _ := rdb.Keys(ctx, "rate:"+prefix+"*").Result(); len(keys) != 0 {
		t.Errorf("keys left: %q", keys)
	}
	if code := get("198.19.0.1"); code != http.StatusOK {
		t.Errorf("after the deletion: status %d, want 200 (a fresh count)", code)
	}
}
