package limiter

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Spans of a decision, when Config.Tracer is set: sluice.decide around
// the whole decision (fast path, store call and fail modes), a child of
// the caller's span, and sluice.store around the call into the Store, a
// child of sluice.decide. Their attributes are rule names, outcomes and
// the first characters of hashed keys, never an identifier.

// keyPrefix is how much of a hashed key a span shows: enough to tell keys
// apart and follow one, as the access log does.
const keyPrefix = 12

// traceDecision starts the span of a decision on checks and returns its
// context and the func that ends it once o is decided.
func (l *Limiter) traceDecision(ctx context.Context, checks []Check, o *Outcome) (context.Context, func()) {
	rules := make([]string, len(checks))
	keys := make([]string, len(checks))
	for i, c := range checks {
		rules[i] = c.Rule.Name
		keys[i] = c.Key[:min(len(c.Key), keyPrefix)]
	}
	ctx, span := l.tracer.Start(ctx, "sluice.decide", trace.WithAttributes(
		attribute.StringSlice("sluice.rules", rules),
		attribute.StringSlice("sluice.keys", keys),
	))
	return ctx, func() {
		outcome := "allowed"
		switch {
		case o.Unavailable:
			outcome = "unavailable"
			span.SetStatus(codes.Error, "")
		case !o.Allowed:
			outcome = "limited"
		}
		sources := make([]string, len(o.Sources))
		for i, s := range o.Sources {
			sources[i] = s.String()
		}
		span.SetAttributes(
			attribute.String("sluice.outcome", outcome),
			attribute.StringSlice("sluice.sources", sources),
			attribute.Int64("sluice.retry_after_ms", o.RetryAfter.Milliseconds()),
		)
		if o.Err != nil {
			span.SetAttributes(attribute.String("sluice.store.error", ErrorKind(o.Err)))
		}
		span.End()
	}
}

// traceStore starts the span of a store call and returns its context and
// the func that ends it with the call's error.
func (l *Limiter) traceStore(ctx context.Context, n int) (context.Context, func(error)) {
	ctx, span := l.tracer.Start(ctx, "sluice.store", trace.WithAttributes(attribute.Int("sluice.checks", n)))
	return ctx, func(err error) {
		if err != nil {
			span.SetStatus(codes.Error, "")
			span.SetAttributes(attribute.String("sluice.store.error", ErrorKind(err)))
		}
		span.End()
	}
}
