// Package rls is Envoy's rate limit service on sluice's decisions
// (SLUICE_RLS_LISTEN): envoy.service.ratelimit.v3.RateLimitService's
// ShouldRateLimit over gRPC, which Envoy's envoy.filters.http.ratelimit
// filter calls before it forwards a request.
//
// Rules whose path is rls:DOMAIN and identity descriptor(k1,k2=v,...)
// match the descriptors of a call in that domain (see
// policy.Rule.MatchesDescriptor). Every check of every descriptor of one
// call is decided together, atomically, as the tiers of one HTTP request
// are: a call that one descriptor denies consumes nothing on the others.
// The keys, the decision, the rate-limit headers, the metrics and the
// access log are the proxy's (proxy.Decider).
//
// It is the one package of sluice that imports gRPC and Envoy's
// go-control-plane types; of sluice it imports policy and proxy (and may
// import what package check may, and check); its listener is gateway's.
package rls

import (
	"context"
	"crypto/tls"
	"errors"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
)

// Config configures a Server. Decider is required.
type Config struct {
	// Decider decides, shared with the proxy and forward-auth.
	Decider *proxy.Decider
	// TLS, when not nil, serves gRPC over TLS with it (see
	// gateway's certificates: mutual TLS when it asks for client
	// certificates); nil serves plaintext HTTP/2.
	TLS *tls.Config
}

// Server is the rate limit service. It is safe for concurrent use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	dec  *proxy.Decider
	grpc *grpc.Server
}

// The bounds of one call. Envoy's calls carry a handful of descriptors
// of a few short entries, and little metadata; the bounds keep what one
// call may cost (counters created, keys hashed, memory) small and
// known. A call beyond them is refused before anything is decided.
const (
	// MaxDescriptors is the most descriptors of one call.
	MaxDescriptors = 64
	// MaxEntries is the most entries of one descriptor.
	MaxEntries = 16
	// MaxValue is the longest value of an entry, in bytes; keys and the
	// domain have the same bound.
	MaxValue = 1 << 10
	// MaxMetadata is the most metadata of one call, in bytes, counted as
	// HTTP/2 counts a header list: each field's name and value plus 32.
	MaxMetadata = 64 << 10
	// maxHeaderList is what the transport reads of a call's headers at
	// most (gRPC's own default, set here so that it is a decision): a
	// larger list is refused by the transport (RST_STREAM, which a client
	// reports as INTERNAL), so the contract's RESOURCE_EXHAUSTED is
	// answered for everything between MaxMetadata and it.
	maxHeaderList = 16 << 20
	// maxMessage bounds a request message: the largest within the
	// bounds, with room for its framing, so that no larger one is even
	// decoded (gRPC answers RESOURCE_EXHAUSTED).
	maxMessage = MaxDescriptors*MaxEntries*(2*MaxValue+16) + MaxValue + 64<<10
)

// New returns a Server for cfg; Serve runs it.
func New(cfg Config) (*Server, error) {
	if cfg.Decider == nil {
		return nil, errors.New("rls: a Decider is required")
	}
	opts := []grpc.ServerOption{
		// Envoy keeps its connection to the service open and may ping it
		// while idle; do not answer its pings with GOAWAY.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.MaxHeaderListSize(maxHeaderList),
		grpc.MaxRecvMsgSize(maxMessage),
		grpc.UnaryInterceptor(boundMetadata),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	s := &Server{dec: cfg.Decider, grpc: grpc.NewServer(opts...)}
	rlsv3.RegisterRateLimitServiceServer(s.grpc, s)
	return s, nil
}

// boundMetadata refuses a call with more than MaxMetadata of metadata
// with RESOURCE_EXHAUSTED, before its handler runs.
func boundMetadata(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	size := 0
	for name, values := range md {
		for _, v := range values {
			size += len(name) + len(v) + 32
		}
	}
	if size > MaxMetadata {
		return nil, status.Errorf(codes.ResourceExhausted, "the call carries %d bytes of metadata; at most %d are read", size, MaxMetadata)
	}
	return handler(ctx, req)
}

// checkShape reports, as INVALID_ARGUMENT, a request beyond the bounds
// of one call: its domain, its number of descriptors, their entries, and
// their keys and values.
func checkShape(req *rlsv3.RateLimitRequest) error {
	ds := req.GetDescriptors()
	switch {
	case len(req.GetDomain()) > MaxValue:
		return status.Errorf(codes.InvalidArgument, "the domain is %d bytes long; at most %d are allowed", len(req.GetDomain()), MaxValue)
	case len(ds) > MaxDescriptors:
		return status.Errorf(codes.InvalidArgument, "the call has %d descriptors; at most %d are allowed", len(ds), MaxDescriptors)
	}
	for i, d := range ds {
		es := d.GetEntries()
		if len(es) > MaxEntries {
			return status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries; at most %d are allowed", i, len(es), MaxEntries)
		}
		for j, e := range es {
			if len(e.GetKey()) > MaxValue || len(e.GetValue()) > MaxValue {
				return status.Errorf(codes.InvalidArgument, "entry %d of descriptor %d has a key or value over %d bytes", j, i, MaxValue)
			}
		}
	}
	return nil
}

// Serve serves calls on l until Shutdown; it returns nil then.
func (s *Server) Serve(l net.Listener) error { return s.grpc.Serve(l) }

// Shutdown stops accepting calls and waits for those in flight to be
// answered, or, once ctx ends, cuts them.
func (s *Server) Shutdown(ctx context.Context) error {
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
		return ctx.Err()
	}
}

// ShouldRateLimit decides every descriptor of req together:
//
//   - A descriptor matches the rls:DOMAIN rules of req's domain whose
//     pattern it fits; one no rule matches is OK, as in Envoy's own
//     service.
//   - Each match is a check of the rule and the key its open values
//     form; a call that names one rule and key twice counts it once, with
//     both costs.
//   - The cost of a check is the rule's cost times hits_addend: the
//     descriptor's own, else the request's; 0 or unset is 1 hit.
//   - All checks are decided at once: OVER_LIMIT when any non-shadow check
//     denies, and then none consumes (but count=all rules).
//
// Each descriptor's status has its own code, and, from its rule with the
// least room (for a denied one, the denying rule with the longest wait),
// current_limit (the limit in force, an override's included, as
// requests per unit with a unit multiplier), limit_remaining and
// duration_until_reset; a descriptor whose checks were not looked at,
// because the over-limit cache denied the call on another one, is
// UNKNOWN. response_headers_to_add carries the RateLimit headers (and
// Retry-After when denied) that sluice's proxy would send.
//
// When a fail=closed rule cannot be decided, the call fails with the gRPC
// status UNKNOWN (the contract's word; Envoy treats every error status
// alike), so that Envoy applies its own failure mode (failure_mode_deny);
// an answer with overall_code UNKNOWN would not do it: Envoy asserts that
// it never gets one, and takes it for OK. A call
// without a domain or descriptors, or beyond the bounds of one call
// (MaxDescriptors, MaxEntries, MaxValue), is INVALID_ARGUMENT, and one
// with more than MaxMetadata of metadata RESOURCE_EXHAUSTED; such a call
// counts nothing.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	began := time.Now()
	x := s.dec.Get()
	defer s.dec.Put(x)
	code := http.StatusOK // the HTTP status Envoy answers, for the access log
	defer func() { s.dec.Finish(proxy.ListenerRLS, "", x, code, time.Since(began), 0) }()

	domain := req.GetDomain()
	x.Path = "rls:" + domain
	if domain == "" || len(req.GetDescriptors()) == 0 {
		code = http.StatusBadRequest
		return nil, status.Error(codes.InvalidArgument, "a rate limit request needs a domain and at least one descriptor")
	}
	if err := checkShape(req); err != nil {
		code = http.StatusBadRequest
		return nil, err
	}
	owners := s.checks(x, req)
	s.dec.Decide(ctx, x)
	if x.Verdict == proxy.OutcomeUnavailable {
		code = http.StatusServiceUnavailable
		return nil, status.Error(codes.Unknown, "the rate limiter cannot decide right now (a fail=closed rule): apply the proxy's failure mode")
	}

	res := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors())),
	}
	if x.Verdict == proxy.OutcomeLimited {
		res.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		code = http.StatusTooManyRequests
	}
	for i := range res.Statuses {
		res.Statuses[i] = descriptorStatus(x, owners[i])
	}
	if len(x.Checks) > 0 {
		h := http.Header{}
		s.dec.SetHeaders(h, x.Checks, &x.Outcome)
		res.ResponseHeadersToAdd = headerValues(h)
	}
	return res, nil
}

// checks works out x's checks from req's descriptors, and returns, for
// each descriptor, the indexes of its checks in x.Checks.
func (s *Server) checks(x *proxy.Decision, req *rlsv3.RateLimitRequest) [][]int {
	pol := s.dec.Policy()
	owners := make([][]int, len(req.GetDescriptors()))
	var (
		entries []policy.DescriptorEntry
		values  []string
		at      map[string]int // rule name and key → index in x.Checks, for repeats
	)
	for i, d := range req.GetDescriptors() {
		entries = entries[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, policy.DescriptorEntry{Key: e.GetKey(), Value: e.GetValue()})
		}
		hits := uint64(req.GetHitsAddend())
		if h := d.GetHitsAddend(); h != nil {
			hits = h.GetValue()
		}
		hits = max(hits, 1)
		x.Rules = pol.MatchDescriptor(req.GetDomain(), entries, x.Rules[:0])
		for _, rule := range x.Rules {
			values = rule.DescriptorValues(entries, values[:0])
			key := s.dec.DescriptorKey(values)
			counter := rule.Name + "\x00" + key
			if j, ok := at[counter]; ok { // the same counter again: one check, both costs
				x.Checks[j].Rule = withCost(x.Checks[j].Rule, x.Checks[j].Rule.Cost, rule.Cost, hits)
				owners[i] = append(owners[i], j)
				continue
			}
			if at == nil {
				at = map[string]int{}
			}
			at[counter] = len(x.Checks)
			owners[i] = append(owners[i], len(x.Checks))
			r := rule
			if hits > 1 {
				r = withCost(rule, 0, rule.Cost, hits)
			}
			x.Checks = append(x.Checks, limiter.Check{Rule: r, Key: key})
		}
	}
	x.Rules = x.Rules[:0]
	for _, c := range x.Checks { // what the access log names when nothing was decided
		x.Rules = append(x.Rules, c.Rule)
	}
	return owners
}

// withCost returns a copy of rule that costs base plus cost × hits,
// capped at policy.MaxCount (such a request never passes, as a cost above
// the limit never does).
func withCost(rule *policy.Rule, base, cost int64, hits uint64) *policy.Rule {
	total := int64(policy.MaxCount)
	if hits <= uint64(policy.MaxCount/cost) {
		total = min(base+cost*int64(hits), policy.MaxCount)
	}
	r := *rule
	r.Cost = total
	return &r
}

// descriptorStatus is the status of the descriptor whose checks are at
// idx in x.Checks.
func descriptorStatus(x *proxy.Decision, idx []int) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	if len(idx) == 0 {
		return st // no rule: OK, as in Envoy's own service
	}
	checks := make([]limiter.Check, len(idx))
	sub := limiter.Outcome{
		Allowed: true,
		Results: make([]limiter.Result, len(idx)),
		Sources: make([]limiter.Source, len(idx)),
	}
	evaluated := false
	for k, j := range idx {
		checks[k], sub.Results[k], sub.Sources[k] = x.Checks[j], x.Outcome.Results[j], x.Outcome.Sources[j]
		evaluated = evaluated || sub.Sources[k] != limiter.SourceNotEvaluated
		if x.Outcome.Denied(x.Checks, j) {
			sub.Allowed = false
		}
	}
	if !evaluated {
		st.Code = rlsv3.RateLimitResponse_UNKNOWN
		return st
	}
	if !sub.Allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	p := sub.Primary(checks)
	if p < 0 {
		return st
	}
	r := &sub.Results[p]
	st.CurrentLimit = currentLimit(checks[p].Rule, r)
	// A denied descriptor has no room for a call of its cost, whatever
	// is left of its limit for a smaller one: 0, as its headers say r=0.
	if st.Code == rlsv3.RateLimitResponse_OK {
		st.LimitRemaining = uint32(min(max(r.Remaining, 0), math.MaxUint32))
	}
	st.DurationUntilReset = durationpb.New(max(r.ResetAfter, 0))
	return st
}

// units are Envoy's units of time that a window may be a whole number of,
// longest first.
var units = []struct {
	d    time.Duration
	unit rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
}

// calendarUnits are Envoy's units of a calendar rule's windows.
var calendarUnits = map[policy.CalendarUnit]rlsv3.RateLimitResponse_RateLimit_Unit{
	policy.Day:   rlsv3.RateLimitResponse_RateLimit_DAY,
	policy.Week:  rlsv3.RateLimitResponse_RateLimit_WEEK,
	policy.Month: rlsv3.RateLimitResponse_RateLimit_MONTH,
}

// currentLimit describes the limit res was decided under (by rule, whose
// name is the limit's name) in Envoy's terms: requests per unit. A key
// counted by a calendar has its unit (DAY, WEEK, MONTH: a month is not a
// number of hours); any other window, the longest unit it is a whole
// number of, with that number as the unit multiplier when it is not 1
// (15m is 15 MINUTE).
func currentLimit(rule *policy.Rule, res *limiter.Result) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: rule.Name, RequestsPerUnit: uint32(min(max(res.Limit, 0), math.MaxUint32))}
	if cal, ok := proxy.CalendarOf(rule, *res); ok {
		rl.Unit = calendarUnits[cal]
		return rl
	}
	window := res.Window
	for _, u := range units {
		if window >= u.d && window%u.d == 0 {
			rl.Unit = u.unit
			if n := window / u.d; n != 1 {
				rl.UnitMultiplier = wrapperspb.UInt32(uint32(min(int64(n), math.MaxUint32)))
			}
			break
		}
	}
	return rl
}

// headerValues turns the headers sluice would send into Envoy's, with
// lower-case names (as HTTP/2 sends them), in a stable order.
func headerValues(h http.Header) []*corev3.HeaderValue {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []*corev3.HeaderValue
	for _, name := range names {
		for _, v := range h[name] {
			out = append(out, &corev3.HeaderValue{Key: strings.ToLower(name), Value: v})
		}
	}
	return out
}
