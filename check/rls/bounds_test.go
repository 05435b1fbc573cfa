package rls

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestBounds: a call carries at most 64 descriptors of at most 16
// entries, keys and values (and its domain) of at most 1 KiB, and at most
// 64 KiB of metadata; beyond, it is INVALID_ARGUMENT (its shape) or
// RESOURCE_EXHAUSTED (its metadata), and nothing of it is counted, not
// even its descriptors within the bounds.
func TestBounds(t *testing.T) {
	const rules = loginRules + "; wide: * rls:edge by descriptor(k0,k1,k2,k3,k4,k5,k6,k7,k8,k9,k10,k11,k12,k13,k14,k15) 3/1m"
	c := start(t, rules, nil)
	logins := func(n int) []*ratelimitv3.RateLimitDescriptor {
		ds := []*ratelimitv3.RateLimitDescriptor{login("10.0.0.1")} // counted, unless refused
		for i := 1; i < n; i++ {
			ds = append(ds, login(fmt.Sprintf("10.1.%d.%d", i/256, i%256)))
		}
		return ds
	}
	wide := func(n int) *ratelimitv3.RateLimitDescriptor {
		var kv []string
		for i := range n {
			kv = append(kv, fmt.Sprintf("k%d", i), "v")
		}
		return desc(kv...)
	}
	tiny := func(n int) []*ratelimitv3.RateLimitDescriptor { // the smallest descriptors: the most per byte
		ds := []*ratelimitv3.RateLimitDescriptor{login("10.0.0.1")}
		for len(ds) < n {
			ds = append(ds, desc("k", "v"))
		}
		return ds
	}
	kib := strings.Repeat("x", 1024)
	pad := func(n int) metadata.MD { // n bytes of metadata in headers of 1 KiB
		md := metadata.MD{}
		for i := 0; n > 0; i++ {
			md.Append(fmt.Sprintf("x-pad-%d", i), strings.Repeat("p", min(n, 1000)))
			n -= 1000 + len(fmt.Sprintf("x-pad-%d", i)) + 32
		}
		return md
	}
	i := 0
	for _, tc := range []struct {
		name   string
		req    *rlsv3.RateLimitRequest
		md     metadata.MD
		want   codes.Code
		counts bool // whether login("10.0.0.1") was counted
	}{
		{"64 descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: logins(64)}, nil, codes.OK, true},
		{"65 descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: logins(65)}, nil, codes.InvalidArgument, false},
		{"150,000 descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: tiny(150_000)}, nil, codes.InvalidArgument, false},
		{"16 entries", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{login("10.0.0.1"), wide(16)}}, nil, codes.OK, true},
		{"17 entries", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{login("10.0.0.1"), wide(17)}}, nil, codes.InvalidArgument, false},
		{"a value of 1 KiB", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{login("10.0.0.1"), login(kib)}}, nil, codes.OK, true},
		{"a value over 1 KiB", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{login("10.0.0.1"), login(kib + "x")}}, nil, codes.InvalidArgument, false},
		{"a key over 1 KiB", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{login("10.0.0.1"), desc(kib+"x", "v")}}, nil, codes.InvalidArgument, false},
		{"a domain over 1 KiB", &rlsv3.RateLimitRequest{Domain: kib + "x", Descriptors: []*ratelimitv3.RateLimitDescriptor{login("10.0.0.1")}}, nil, codes.InvalidArgument, false},
		{"60 KiB of metadata", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: logins(1)}, pad(60 << 10), codes.OK, true},
		{"65 KiB of metadata", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: logins(1)}, pad(65 << 10), codes.ResourceExhausted, false},
		{"one header of 65 KiB", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: logins(1)}, metadata.Pairs("x-pad", strings.Repeat("p", 65<<10)), codes.ResourceExhausted, false},
		// A flood 64 times the bound, below grpc-go's own 16 MiB: the
		// gateway's bound refuses it. (15 MiB took the race-instrumented
		// client more than 20 s to encode on a loaded CI machine.)
		{"4 MiB of metadata", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: logins(1)}, pad(4 << 20), codes.ResourceExhausted, false},
	} {
		i++
		t.Run(tc.name, func(t *testing.T) {
			ip := fmt.Sprintf("10.9.0.%d", i) // a fresh key for each case
			before := call(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{login(ip)}})
			for _, d := range tc.req.Descriptors {
				for _, e := range d.Entries {
					if e.Key == "remote_address" && e.Value == "10.0.0.1" {
						e.Value = ip
					}
				}
			}
			// Nothing here is timed: the deadline only ends a call that
			// hangs. 150,000 descriptors took 8 s under the race detector
			// on a quiet machine and over 20 s beside CI's other jobs.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if tc.md != nil {
				ctx = metadata.NewOutgoingContext(ctx, tc.md)
			}
			_, err := c.ShouldRateLimit(ctx, tc.req)
			if status.Code(err) != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			after := call(t, c, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{login(ip)}})
			used := before.Statuses[0].GetLimitRemaining() - after.Statuses[0].GetLimitRemaining()
			if want := map[bool]uint32{true: 2, false: 1}[tc.counts]; used != want {
				t.Errorf("the key went from %d to %d remaining: the call counted %d, want %d", before.Statuses[0].GetLimitRemaining(), after.Statuses[0].GetLimitRemaining(), used-1, want-1)
			}
		})
	}
}

// TestOverLimitRemaining: an OVER_LIMIT status says limit_remaining 0, as
// its RateLimit header says r=0, also when hits_addend is more than what
// remains (the room left is for a call of that cost: none).
func TestOverLimitRemaining(t *testing.T) {
	c := start(t, "q: * rls:api by descriptor(tenant) 10/1h", nil)
	res := call(t, c, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 8, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant", "acme")}})
	if st := res.GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 2 {
		t.Fatalf("8 hits of 10: %v", res)
	}
	own := desc("tenant", "acme")
	own.HitsAddend = wrapperspb.UInt64(3)
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "api", HitsAddend: 5, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant", "acme")}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{own, desc("other", "x")}},
	} {
		res = call(t, c, req)
		st := res.GetStatuses()[0]
		if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("more hits than remain: %v", res)
		}
		if st.GetLimitRemaining() != 0 || headers(res)["ratelimit"] != `"q";r=0;t=3570` {
			t.Errorf("more hits than remain: limit_remaining %d, headers %v; want 0 and r=0", st.GetLimitRemaining(), headers(res))
		}
	}
	// Nothing was counted: the 2 left still pass.
	res = call(t, c, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant", "acme")}})
	if st := res.GetStatuses()[0]; res.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 0 {
		t.Errorf("2 hits with 2 left: %v", res)
	}
}
