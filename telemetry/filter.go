package telemetry

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// The filter: every span sluice makes, its own and otelhttp's, passes
// through a tracer provider that keeps only the attributes listed here,
// on the span, its events and its links, whenever they are set. A list
// of what is kept, rather than of what is dropped, means an attribute that
// a later otelhttp adds stays out until someone has looked at it.
//
// otelhttp v0.72 sets, among others, client.address (from X-Forwarded-For
// or the peer), network.peer.address and .port (the client's socket),
// user_agent.original (a header, which a header(User-Agent) rule counts),
// url.path (which may hold an e-mail address), server.address on a server
// span (the client's Host header) and url.full on a client span (the
// query, which may hold an e-mail address): all are dropped. An error's
// message may quote a URL, so a recorded error keeps only its Go type,
// and a status only its code.

// kept are the attributes kept on every span.
var kept = map[attribute.Key]bool{
	"http.request.method":       true,
	"http.response.status_code": true,
	"http.request.body.size":    true,
	"http.response.body.size":   true,
	"url.scheme":                true,
	"network.protocol.name":     true,
	"network.protocol.version":  true,
	"error.type":                true,
	"exception.type":            true,
}

// keptOnClient are also kept on client spans: the upstream's address,
// from sluice's configuration.
var keptOnClient = map[attribute.Key]bool{
	"server.address": true,
	"server.port":    true,
}

// ownPrefix starts the attributes of sluice's own spans, which hold rule
// names, outcomes and hashed keys only.
const ownPrefix = "sluice."

func keep(kind trace.SpanKind, kvs []attribute.KeyValue) []attribute.KeyValue {
	out := kvs[:0:0]
	for _, kv := range kvs {
		if kept[kv.Key] || kind == trace.SpanKindClient && keptOnClient[kv.Key] || strings.HasPrefix(string(kv.Key), ownPrefix) {
			out = append(out, kv)
		}
	}
	return out
}

// filtered returns tp behind the filter.
func filtered(tp trace.TracerProvider) trace.TracerProvider {
	return filterProvider{tp: tp}
}

type filterProvider struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

func (p filterProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return filterTracer{t: p.tp.Tracer(name, opts...), p: p}
}

type filterTracer struct {
	embedded.Tracer
	t trace.Tracer
	p filterProvider
}

func (t filterTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	kind := cfg.SpanKind()
	clean := []trace.SpanStartOption{trace.WithSpanKind(kind), trace.WithAttributes(keep(kind, cfg.Attributes())...)}
	if cfg.NewRoot() {
		clean = append(clean, trace.WithNewRoot())
	}
	if ts := cfg.Timestamp(); !ts.IsZero() {
		clean = append(clean, trace.WithTimestamp(ts))
	}
	for _, l := range cfg.Links() {
		l.Attributes = keep(kind, l.Attributes)
		clean = append(clean, trace.WithLinks(l))
	}
	ctx, s := t.t.Start(ctx, name, clean...)
	span := filterSpan{Span: s, kind: kind, p: t.p}
	// Code that finds the span in the context must find the filtered one.
	return trace.ContextWithSpan(ctx, span), span
}

// filterSpan is a span whose attributes, events, links and status pass
// through the filter.
type filterSpan struct {
	trace.Span
	kind trace.SpanKind
	p    filterProvider
}

func (s filterSpan) SetAttributes(kvs ...attribute.KeyValue) {
	s.Span.SetAttributes(keep(s.kind, kvs)...)
}

func (s filterSpan) AddEvent(name string, opts ...trace.EventOption) {
	cfg := trace.NewEventConfig(opts...)
	clean := []trace.EventOption{trace.WithAttributes(keep(s.kind, cfg.Attributes())...)}
	if ts := cfg.Timestamp(); !ts.IsZero() {
		clean = append(clean, trace.WithTimestamp(ts))
	}
	s.Span.AddEvent(name, clean...)
}

func (s filterSpan) AddLink(l trace.Link) {
	l.Attributes = keep(s.kind, l.Attributes)
	s.Span.AddLink(l)
}

// RecordError records an exception event with err's type only: an
// error's message may quote the URL of the request.
func (s filterSpan) RecordError(err error, _ ...trace.EventOption) {
	if err == nil {
		return
	}
	s.Span.AddEvent("exception", trace.WithAttributes(attribute.String("exception.type", fmt.Sprintf("%T", err))))
}

// SetStatus keeps the code; a description may quote an error's message.
func (s filterSpan) SetStatus(code codes.Code, _ string) {
	s.Span.SetStatus(code, "")
}

func (s filterSpan) TracerProvider() trace.TracerProvider { return s.p }
