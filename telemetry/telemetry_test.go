package telemetry

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestOn(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want bool
	}{
		{Config{}, false},
		{Config{Sampler: "always_on", ServiceName: "x"}, false}, // no endpoint: nothing to send to
		{Config{Endpoint: "http://c:4318"}, true},
		{Config{TracesEndpoint: "http://c:4318/v1/traces"}, true},
		{Config{Endpoint: "http://c:4318", Disabled: true}, false},
		{Config{Endpoint: "http://c:4318", Exporter: "none"}, false},
	} {
		if got := tc.c.On(); got != tc.want {
			t.Errorf("%+v: On() = %v", tc.c, got)
		}
	}
	tr, err := New(context.Background(), Config{}, "v")
	if tr != nil || err != nil {
		t.Fatalf("off: New = %v, %v; want nil, nil", tr, err)
	}
}

func TestSampler(t *testing.T) {
	for _, tc := range []struct{ name, arg, want string }{
		{"", "", "ParentBased{root:AlwaysOnSampler"},
		{"always_on", "", "AlwaysOnSampler"},
		{"always_off", "", "AlwaysOffSampler"},
		{"traceidratio", "0.25", "TraceIDRatioBased{0.25}"},
		{"traceidratio", "", "TraceIDRatioBased{1}"}, // the default ratio is 1
		{"parentbased_traceidratio", "0.5", "ParentBased{root:TraceIDRatioBased{0.5}"},
		{"parentbased_always_off", "", "ParentBased{root:AlwaysOffSampler"},
	} {
		s, err := Config{Sampler: tc.name, SamplerArg: tc.arg}.sampler()
		if err != nil || !strings.HasPrefix(s.Description(), tc.want) {
			t.Errorf("%s %s: %v %v, want %s", tc.name, tc.arg, s, err, tc.want)
		}
	}
}

// recorded returns a filtered tracer provider and what it records.
func recorded() (trace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	return filtered(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))), rec
}

// TestFilterDirect: attributes not on the list are dropped however they
// are set (at the start, later, on an event or a link), sluice's own are
// kept, an error keeps only its type and a status only its code, and a
// span found in the context or asked for its provider stays filtered.
func TestFilterDirect(t *testing.T) {
	tp, rec := recorded()
	tr := tp.Tracer("t")
	ctx, span := tr.Start(context.Background(), "s", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("client.address", "198.51.100.1"),
		attribute.String("http.request.method", "GET"),
		attribute.String("server.address", "host-from-client"),
	))
	span.SetAttributes(attribute.String("user_agent.original", "ua"), attribute.String("sluice.outcome", "limited"))
	span.AddEvent("e", trace.WithAttributes(attribute.String("url.full", "http://x/?email=a@b.c")))
	span.RecordError(errors.New("GET http://x/?email=a@b.c: refused"))
	span.SetStatus(codes.Error, "GET http://x/?email=a@b.c: refused")
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("network.peer.address", "198.51.100.1"))
	_, child := span.TracerProvider().Tracer("t").Start(ctx, "c", trace.WithAttributes(attribute.String("url.query", "email=a@b.c")))
	child.End()
	span.End()

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	var all strings.Builder
	for _, s := range spans {
		for _, kv := range s.Attributes() {
			all.WriteString(string(kv.Key) + "=" + kv.Value.String() + " ")
		}
		for _, e := range s.Events() {
			for _, kv := range e.Attributes {
				all.WriteString(e.Name + ":" + string(kv.Key) + "=" + kv.Value.String() + " ")
			}
		}
		all.WriteString("status:" + s.Status().Description + " ")
	}
	got := all.String()
	for _, bad := range []string{"198.51.100.1", "host-from-client", "ua", "a@b.c"} {
		if strings.Contains(got, bad) {
			t.Errorf("%q kept: %s", bad, got)
		}
	}
	for _, want := range []string{"http.request.method=GET", "sluice.outcome=limited", "exception:exception.type=*errors.errorString"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q dropped: %s", want, got)
		}
	}
	if spans[1].Status().Code != codes.Error {
		t.Error("the status code was lost")
	}
}

// TestFilterOtelhttp: the server and client spans of otelhttp, through
// the filter, hold neither the client's address nor its user agent, the
// Host it sent, the path or the query; the upstream keeps its address.
func TestFilterOtelhttp(t *testing.T) {
	tp, rec := recorded()
	opts := []otelhttp.Option{otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{})}
	var gotParent string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { gotParent = r.Header.Get("Traceparent") }))
	defer up.Close()
	client := &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport, opts...)}
	front := httptest.NewServer(otelhttp.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), "GET", up.URL+r.URL.RequestURI(), nil)
		res, err := client.Do(req)
		if err == nil {
			res.Body.Close()
		}
	}), "sluice", opts...))
	defer front.Close()

	req, _ := http.NewRequest("GET", front.URL+"/users/victim@example.com?email=victim2@example.com", nil)
	req.Host = "host-from-client.example"
	req.Header.Set("User-Agent", "agent-secret")
	req.Header.Set("X-Forwarded-For", "198.51.100.7")
	req.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if !strings.HasPrefix(gotParent, "00-4bf92f3577b34da6a3ce929d0e0e4736-") {
		t.Errorf("upstream traceparent %q", gotParent)
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	for _, s := range spans {
		for _, kv := range s.Attributes() {
			v := kv.Value.String()
			for _, bad := range []string{"victim", "agent-secret", "198.51.100.7", "127.0.0.1:", "host-from-client"} {
				if strings.Contains(v, bad) {
					t.Errorf("%s span keeps %s=%s", s.SpanKind(), kv.Key, v)
				}
			}
			if kv.Key == "client.address" || kv.Key == "network.peer.address" {
				t.Errorf("%s span keeps %s", s.SpanKind(), kv.Key)
			}
		}
	}
	client0 := spans[0]
	if client0.SpanKind() != trace.SpanKindClient {
		client0 = spans[1]
	}
	found := false
	for _, kv := range client0.Attributes() {
		found = found || kv.Key == "server.address" && kv.Value.AsString() == "127.0.0.1"
	}
	if !found {
		t.Errorf("the upstream span lost the upstream's address: %v", client0.Attributes())
	}
}

// TestHandleErrors: the SDK's errors reach the function given, not the
// standard library's log.
func TestHandleErrors(t *testing.T) {
	var got []error
	HandleErrors(func(err error) { got = append(got, err) })
	otel.Handle(errors.New("export failed"))
	if len(got) != 1 || got[0].Error() != "export failed" {
		t.Fatalf("handled %v", got)
	}
}
