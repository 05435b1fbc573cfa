package limiter_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/policy"
)

// attrs returns a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestTraceSpans: with a Tracer, a decision is a sluice.decide span, a
// child of the caller's, and its store call a sluice.store span, a child
// of the decision; they name the rules, the outcome and the keys' first
// characters only. A fast-path hit makes no store span; a store failure
// marks both.
func TestTraceSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tracer := tp.Tracer("test")
	f := newFixture(t, func(c *limiter.Config) { c.Tracer = tracer })
	a := rule("login", 1)
	key := "0123456789abcdefghijklmnopqrstuvwxyzABCDEFG" // 43 characters, as hashed keys

	ctx, parent := tracer.Start(context.Background(), "request")
	for range 3 { // allowed by the store, denied by the store, denied from the fast path
		f.limiter.Decide(ctx, []limiter.Check{chk(a, key)})
	}
	parent.End()
	spans := rec.Ended()
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	if want := []string{"sluice.store", "sluice.decide", "sluice.store", "sluice.decide", "sluice.decide", "request"}; !slices.Equal(names, want) {
		t.Fatalf("spans %v, want %v", names, want)
	}
	req := spans[5].SpanContext().SpanID()
	for i, want := range []struct{ outcome, source string }{{"allowed", "store"}, {"limited", "store"}} {
		store, decide := spans[2*i], spans[2*i+1]
		if decide.Parent().SpanID() != req || store.Parent().SpanID() != decide.SpanContext().SpanID() {
			t.Errorf("decision %d: the decision's parent is not the request's span, or the store's not the decision's", i)
		}
		da := attrs(decide)
		if got := da["sluice.rules"].AsStringSlice(); !slices.Equal(got, []string{"login"}) {
			t.Errorf("decision %d: rules %v", i, got)
		}
		if got := da["sluice.keys"].AsStringSlice(); !slices.Equal(got, []string{key[:12]}) {
			t.Errorf("decision %d: keys %v, want the first 12 characters", i, got)
		}
		if da["sluice.outcome"].AsString() != want.outcome || !slices.Equal(da["sluice.sources"].AsStringSlice(), []string{want.source}) {
			t.Errorf("decision %d: %v", i, da)
		}
	}
	if fast := attrs(spans[4]); fast["sluice.outcome"].AsString() != "limited" || fast["sluice.sources"].AsStringSlice()[0] != "fast_path" {
		t.Errorf("fast path decision: %v", fast)
	}

	// A store that fails: both spans say so, the decision with its kind.
	rec2 := tracetest.NewSpanRecorder()
	tracer2 := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec2)).Tracer("test")
	down := newFixture(t, func(c *limiter.Config) {
		c.Tracer = tracer2
		c.Store = errStore{errors.New("down")}
		c.DefaultFail = policy.FailClosed
	})
	down.decide(chk(a, key))
	spans = rec2.Ended()
	if len(spans) != 2 || spans[0].Status().Code != codes.Error || spans[1].Status().Code != codes.Error ||
		attrs(spans[1])["sluice.outcome"].AsString() != "unavailable" || attrs(spans[0])["sluice.store.error"].AsString() != "other" {
		t.Fatalf("failed store: %d spans, %v / %v", len(spans), attrs(spans[0]), attrs(spans[1]))
	}
}
