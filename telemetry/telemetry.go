// Package telemetry sets up OpenTelemetry tracing from the standard OTEL_*
// variables: an OTLP exporter (HTTP/protobuf or gRPC), a sampler and a
// resource, and the instrumentation of the public listener (a server span
// per request) and of the upstream transport (a client span, with the W3C
// traceparent sent upstream). The limiter's own spans (the decision and
// the store call) use its Tracer.
//
// Without an OTLP endpoint tracing is off: New returns nil, and the
// gateway wraps nothing, so a request costs what it cost without this
// package. Every span passes through a filter (filter.go) that keeps only
// attributes known to carry no identifier: never the client's address,
// its user agent or any header value, the query or the path.
//
// It imports none of sluice's packages; gateway sets it up at start and
// shuts it down at exit.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config is what sluice reads of the standard OTEL_* variables itself;
// the exporter and the SDK read the others (OTEL_EXPORTER_OTLP_HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_BSP_*) from the process environment, as the OpenTelemetry
// specification describes them.
type Config struct {
	// Endpoint is OTEL_EXPORTER_OTLP_ENDPOINT: the collector's base URL,
	// to which /v1/traces is added for HTTP.
	Endpoint string
	// TracesEndpoint is OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: the URL of
	// traces itself, used as given; it wins over Endpoint.
	TracesEndpoint string
	// Protocol and TracesProtocol are OTEL_EXPORTER_OTLP_PROTOCOL and
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: http/protobuf (the default) or
	// grpc; the second wins.
	Protocol, TracesProtocol string
	// Sampler and SamplerArg are OTEL_TRACES_SAMPLER and
	// OTEL_TRACES_SAMPLER_ARG; the default is parentbased_always_on.
	Sampler, SamplerArg string
	// ServiceName is OTEL_SERVICE_NAME; empty means "sluice".
	ServiceName string
	// Disabled is OTEL_SDK_DISABLED.
	Disabled bool
	// Exporter is OTEL_TRACES_EXPORTER: otlp (the default) or none.
	Exporter string
}

// On reports whether c asks for tracing: an endpoint is set, and neither
// OTEL_SDK_DISABLED nor OTEL_TRACES_EXPORTER=none turns it off.
func (c Config) On() bool {
	return (c.Endpoint != "" || c.TracesEndpoint != "") && !c.Disabled && c.Exporter != "none"
}

func (c Config) protocol() string {
	if c.TracesProtocol != "" {
		return c.TracesProtocol
	}
	if c.Protocol != "" {
		return c.Protocol
	}
	return "http/protobuf"
}

// Problems returns one message for each invalid variable. An endpoint's
// value is never quoted: it may hold a password.
func (c Config) Problems() []string {
	var ps []string
	for _, e := range []struct{ name, v string }{
		{"OTEL_EXPORTER_OTLP_ENDPOINT", c.Endpoint},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", c.TracesEndpoint},
	} {
		if e.v == "" {
			continue
		}
		if u, err := url.Parse(e.v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			ps = append(ps, e.name+": expected a URL such as http://collector:4318")
		}
	}
	for _, p := range []struct{ name, v string }{
		{"OTEL_EXPORTER_OTLP_PROTOCOL", c.Protocol},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", c.TracesProtocol},
	} {
		switch p.v {
		case "", "http/protobuf", "grpc":
		case "http/json":
			ps = append(ps, p.name+": http/json is not supported by the OpenTelemetry Go exporter: use http/protobuf or grpc")
		default:
			ps = append(ps, fmt.Sprintf("%s: expected http/protobuf or grpc, got %q", p.name, p.v))
		}
	}
	if _, err := c.sampler(); err != nil {
		ps = append(ps, err.Error())
	}
	switch c.Exporter {
	case "", "otlp", "none":
	default:
		ps = append(ps, fmt.Sprintf("OTEL_TRACES_EXPORTER: expected otlp or none, got %q", c.Exporter))
	}
	return ps
}

// sampler is the sampler OTEL_TRACES_SAMPLER names, as the specification
// defines them.
func (c Config) sampler() (sdktrace.Sampler, error) {
	ratio := 1.0
	if strings.HasSuffix(c.Sampler, "traceidratio") && c.SamplerArg != "" {
		r, err := strconv.ParseFloat(c.SamplerArg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: expected a ratio from 0 to 1, got %q", c.SamplerArg)
		}
		ratio = r
	}
	switch c.Sampler {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	}
	return nil, fmt.Errorf("OTEL_TRACES_SAMPLER: expected always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio, got %q", c.Sampler)
}

// Describe names what c sets up, for the start-up log line: the protocol,
// the sampler and the service, never the endpoint (it may hold a
// password).
func (c Config) Describe() string {
	return fmt.Sprintf("OTLP %s, sampler %s, service %s", c.protocol(), cmpOr(c.Sampler, "parentbased_always_on"), cmpOr(c.ServiceName, "sluice"))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Tracing is tracing set up: a tracer provider exporting over OTLP,
// behind the attribute filter.
type Tracing struct {
	sdk      *sdktrace.TracerProvider
	provider trace.TracerProvider // sdk, filtered
	prop     propagation.TextMapPropagator
}

// New sets tracing up as c asks, with version as service.version; nil
// when c does not ask for it. Nothing is sent until spans end; Shutdown
// sends what is left.
func New(ctx context.Context, c Config, version string) (*Tracing, error) {
	if !c.On() {
		return nil, nil
	}
	if ps := c.Problems(); len(ps) > 0 {
		return nil, errors.New(strings.Join(ps, "; "))
	}
	sampler, _ := c.sampler()
	var exp sdktrace.SpanExporter
	var err error
	switch c.protocol() {
	case "grpc":
		endpoint := cmpOr(c.TracesEndpoint, c.Endpoint)
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(endpoint))
	default:
		endpoint := c.TracesEndpoint
		if endpoint == "" {
			endpoint = strings.TrimSuffix(c.Endpoint, "/") + "/v1/traces"
		}
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint))
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// The resource says which service sent the spans: OTEL_RESOURCE_ATTRIBUTES
	// first, then the SDK's, then the service's name and version. No
	// detector of the host or the process runs.
	res, err := resource.New(ctx,
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
		resource.WithAttributes(
			attribute.String("service.name", cmpOr(c.ServiceName, "sluice")),
			attribute.String("service.version", version),
		),
	)
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	sdk := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sampler),
		sdktrace.WithResource(res),
	)
	return &Tracing{sdk: sdk, provider: filtered(sdk), prop: propagation.TraceContext{}}, nil
}

// Tracer is the tracer of sluice's own spans (the limiter's decision and
// store call), behind the filter.
func (t *Tracing) Tracer() trace.Tracer {
	return t.provider.Tracer("github.com/sluicehq/sluice")
}

// Handler wraps the public listener's handler: a server span per request,
// continuing the trace of an incoming W3C traceparent.
func (t *Tracing) Handler(h http.Handler) http.Handler {
	return otelhttp.NewHandler(h, "sluice", t.options()...)
}

// Transport wraps the upstream transport: a client span per upstream
// request, whose W3C traceparent the upstream receives.
func (t *Tracing) Transport(rt http.RoundTripper) http.RoundTripper {
	return otelhttp.NewTransport(rt, t.options()...)
}

// options are otelhttp's: sluice's provider and propagator, never the
// global ones, and no metrics (sluice has its own).
func (t *Tracing) options() []otelhttp.Option {
	return []otelhttp.Option{
		otelhttp.WithTracerProvider(t.provider),
		otelhttp.WithPropagators(t.prop),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
	}
}

// Shutdown sends the spans not yet sent and stops the exporter, within
// ctx's deadline.
func (t *Tracing) Shutdown(ctx context.Context) error {
	return t.sdk.Shutdown(ctx)
}

// HandleErrors sends the OpenTelemetry SDK's errors (an export that
// failed: the collector is down or refuses) to f instead of the standard
// library's log. The SDK has one handler per process, so only a program's
// main command calls this, once.
func HandleErrors(f func(error)) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(f))
}

// ShutdownTimeout is how long a gateway gives Shutdown at exit.
const ShutdownTimeout = 5 * time.Second
