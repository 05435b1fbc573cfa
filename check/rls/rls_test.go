package rls

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/proxytest"
)

// start serves a rate limit service for rules on a memory store at a
// fixed instant (or on store), and returns a client of it built from
// go-control-plane's types, as Envoy calls it.
func start(t *testing.T, rules string, store limiter.Store) rlsv3.RateLimitServiceClient {
	t.Helper()
	dec := proxytest.NewDecider(t, rules, proxytest.DeciderOptions{Now: time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC), Store: store})
	srv, err := New(Config{Decider: dec})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// desc is a descriptor of key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func call(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return res
}

const loginRules = "rls-login: * rls:edge by descriptor(generic_key=login,remote_address) 3/1m"

func login(ip string) *ratelimitv3.RateLimitDescriptor {
	return desc("generic_key", "login", "remote_address", ip)
}

// headers returns the answer's response_headers_to_add as a map.
func headers(res *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range res.GetResponseHeadersToAdd() {
		m[h.GetKey()] = h.GetValue()
	}
	return m
}

// TestOKAndOverLimit: a descriptor's calls within its limit are OK with
// current_limit, limit_remaining and duration_until_reset, then
// OVER_LIMIT; the RateLimit headers ride along; each value of the open
// key counts on its own.
func TestOKAndOverLimit(t *testing.T) {
	c := start(t, loginRules, nil)
	for i := range 3 {
		res := call(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{login("10.0.0.1")}})
		st := res.GetStatuses()[0]
		if res.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v", i+1, res)
		}
		lim := st.GetCurrentLimit()
		if lim.GetName() != "rls-login" || lim.GetRequestsPerUnit() != 3 || lim.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || lim.GetUnitMultiplier() != nil {
			t.Errorf("call %d: current_limit %v", i+1, lim)
		}
		if st.GetLimitRemaining() != uint32(2-i) || st.GetDurationUntilReset().AsDuration() != 30*time.Second {
			t.Errorf("call %d: remaining %d, reset in %v", i+1, st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration())
		}
		if h := headers(res); h["ratelimit"] != `"rls-login";r=`+string(rune('2'-i))+`;t=30` || h["x-ratelimit-limit"] != "3" || h["ratelimit-policy"] != `"rls-login";q=3;w=60` {
			t.Errorf("call %d: headers %v", i+1, h)
		}
	}
	res := call(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{login("10.0.0.1")}})
	st := res.GetStatuses()[0]
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() != 0 {
		t.Errorf("fourth call: %v", res)
	}
	if h := headers(res); h["retry-after"] != "30" || h["ratelimit"] != `"rls-login";r=0;t=30` {
		t.Errorf("fourth call: headers %v", h)
	}
	other := call(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{login("10.0.0.2")}})
	if other.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("another address: %v", other)
	}
}

// TestUnmatched: descriptors that no rule matches — another domain, other
// keys, another fixed value, keys in another order — are OK without a
// limit, as in Envoy's own service; so is a call of only those.
func TestUnmatched(t *testing.T) {
	c := start(t, loginRules+"; web: * /* by ip 1/1m", nil)
	for _, tc := range []struct {
		domain string
		d      *ratelimitv3.RateLimitDescriptor
	}{
		{"other", login("10.0.0.1")},
		{"edge", desc("remote_address", "10.0.0.1")},
		{"edge", desc("generic_key", "signup", "remote_address", "10.0.0.1")},
		{"edge", desc("remote_address", "10.0.0.1", "generic_key", "login")},
		{"edge", desc("generic_key", "login", "remote_address", "10.0.0.1", "path", "/")},
	} {
		for range 2 {
			res := call(t, c, &rlsv3.RateLimitRequest{Domain: tc.domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{tc.d}})
			if res.GetOverallCode() != rlsv3.RateLimitResponse_OK || res.GetStatuses()[0].GetCurrentLimit() != nil || len(res.GetResponseHeadersToAdd()) != 0 {
				t.Errorf("%s %v: %v", tc.domain, tc.d, res)
			}
		}
	}
	_, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge"})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("no descriptors: %v, want INVALID_ARGUMENT", err)
	}
}

// TestHitsAddend: hits_addend is the cost, the descriptor's own before the
// request's; a call whose cost does not fit is OVER_LIMIT and consumes
// nothing.
func TestHitsAddend(t *testing.T) {
	c := start(t, "q: * rls:api by descriptor(tenant) 10/1h", nil)
	tenant := desc("tenant", "acme")
	res := call(t, c, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 4, Descriptors: []*ratelimitv3.RateLimitDescriptor{tenant}})
	if st := res.GetStatuses()[0]; st.GetLimitRemaining() != 6 || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
		t.Fatalf("hits 4: %v", res)
	}
	own := desc("tenant", "acme")
	own.HitsAddend = wrapperspb.UInt64(5)
	res = call(t, c, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{own}})
	if st := res.GetStatuses()[0]; st.GetLimitRemaining() != 1 {
		t.Fatalf("descriptor's hits 5: %v", res)
	}
	res = call(t, c, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{tenant}})
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("hits 2 with 1 left: %v", res)
	}
	res = call(t, c, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{tenant}})
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OK || res.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Errorf("one hit (unset) with 1 left: %v", res)
	}
	huge := desc("tenant", "globex")
	huge.HitsAddend = wrapperspb.UInt64(1 << 63)
	if res = call(t, c, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{huge}}); res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("2^63 hits: %v", res)
	}
}

// TestAtomic: every descriptor of a call is decided together: when one is
// over its limit, the call is OVER_LIMIT and the others consume nothing;
// a counter named twice in one call counts both hits.
func TestAtomic(t *testing.T) {
	c := start(t, `ip: * rls:edge by descriptor(remote_address) 10/1m
user: * rls:edge by descriptor(user) 1/1m`, nil)
	both := func(ip, user string) *rlsv3.RateLimitResponse {
		return call(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("remote_address", ip), desc("user", user), desc("unknown", "x"),
		}})
	}
	res := both("10.0.0.1", "alice")
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OK || res.GetStatuses()[0].GetLimitRemaining() != 9 || res.GetStatuses()[1].GetLimitRemaining() != 0 {
		t.Fatalf("first call: %v", res)
	}
	for range 3 {
		res = both("10.0.0.1", "alice")
		ip, user, unknown := res.GetStatuses()[0], res.GetStatuses()[1], res.GetStatuses()[2]
		if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || user.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
			unknown.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("over the user's limit: %v", res)
		}
		// The address was checked (or not looked at, when the over-limit
		// cache denied the call on the user) and consumed nothing.
		if ip.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT || ip.GetCode() == rlsv3.RateLimitResponse_OK && ip.GetLimitRemaining() != 9 {
			t.Fatalf("the address in a denied call: %v", ip)
		}
	}
	res = call(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1")}})
	if st := res.GetStatuses()[0]; st.GetLimitRemaining() != 8 {
		t.Errorf("the address alone after three denied calls: remaining %d, want 8 (9 before it)", st.GetLimitRemaining())
	}
	res = call(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("remote_address", "10.0.0.1"), desc("remote_address", "10.0.0.1"),
	}})
	if a, b := res.GetStatuses()[0], res.GetStatuses()[1]; a.GetLimitRemaining() != 6 || b.GetLimitRemaining() != 6 {
		t.Errorf("one counter named twice: remaining %d and %d, want 6 (two hits)", a.GetLimitRemaining(), b.GetLimitRemaining())
	}
}

// TestWindows: current_limit gives a window in the longest unit that it is
// a whole number of, with a multiplier.
func TestWindows(t *testing.T) {
	for _, tc := range []struct {
		window time.Duration
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
		mult   uint32 // 0: none
	}{
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
		{90 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{15 * time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE, 15},
		{2 * time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR, 2},
		{48 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY, 2},
	} {
		got := currentLimit(&policy.Rule{Name: "r"}, &limiter.Result{Limit: 5, Window: tc.window})
		if got.GetUnit() != tc.unit || got.GetUnitMultiplier().GetValue() != tc.mult || (tc.mult == 0) != (got.GetUnitMultiplier() == nil) {
			t.Errorf("%v: %v", tc.window, got)
		}
	}
}

// TestCalendarWindows: a calendar rule's current_limit is in its own
// unit, DAY, WEEK or MONTH, without a multiplier, whatever the current
// period's length in hours (a month in New York across a change of
// daylight saving time is 721 of them).
func TestCalendarWindows(t *testing.T) {
	c := start(t, `monthly: * rls:cal by descriptor(m) 5/1mo tz=America/New_York anchor=31
weekly: * rls:cal by descriptor(w) 5/1w
daily: * rls:cal by descriptor(d) 5/1d tz=Asia/Kolkata
hours: * rls:cal by descriptor(h) 5/24h`, nil)
	for _, tc := range []struct {
		key  string
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{"m", rlsv3.RateLimitResponse_RateLimit_MONTH},
		{"w", rlsv3.RateLimitResponse_RateLimit_WEEK},
		{"d", rlsv3.RateLimitResponse_RateLimit_DAY},
		{"h", rlsv3.RateLimitResponse_RateLimit_DAY}, // 24h is one day's length, not a calendar's
	} {
		res := call(t, c, &rlsv3.RateLimitRequest{Domain: "cal", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(tc.key, "v")}})
		got := res.GetStatuses()[0].GetCurrentLimit()
		if got.GetUnit() != tc.unit || got.GetUnitMultiplier() != nil || got.GetRequestsPerUnit() != 5 {
			t.Errorf("descriptor %s: current_limit %v, want 5 per %v", tc.key, got, tc.unit)
		}
	}
}

// failingStore fails every decision, as a dead database does.
type failingStore struct{}

func (failingStore) Decide(context.Context, []limiter.Check, []limiter.Result) (bool, error) {
	return false, errors.New("connection refused")
}

// TestFailModes: when the store cannot decide, a fail=closed rule fails
// the call with the gRPC status UNKNOWN (the contract's word), for Envoy
// to apply its own failure mode;
// fail=open answers OK, fail=local decides per instance.
func TestFailModes(t *testing.T) {
	c := start(t, `closed: * rls:e by descriptor(k=closed) 5/1m fail=closed
open: * rls:e by descriptor(k=open) 1/1m fail=open
local: * rls:e by descriptor(k=local) 1/1m fail=local`, failingStore{})
	_, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "e", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "closed")}})
	if status.Code(err) != codes.Unknown {
		t.Errorf("closed: %v, want the status UNKNOWN", err)
	}
	for range 3 {
		if res := call(t, c, &rlsv3.RateLimitRequest{Domain: "e", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "open")}}); res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("open: %v", res)
		}
	}
	local := &rlsv3.RateLimitRequest{Domain: "e", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "local")}}
	if res := call(t, c, local); res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("local, first: %v", res)
	}
	if res := call(t, c, local); res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("local, second: %v", res)
	}
}
