package telemetry

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkTracing is one request through an instrumented server that
// makes two spans of its own (as the limiter does) and one upstream
// request, with tracing off (nothing wrapped) and on at 100% sampling,
// exporting over OTLP/HTTP to a collector that throws the spans away:
// what tracing adds to a request, in time and allocations, on one
// machine with the collector's work included; and on with a sampler that
// samples nothing (the requests a ratio sampler leaves out).
func BenchmarkTracing(b *testing.B) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck // a sink
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer sink.Close()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()

	for _, tc := range []struct{ name, sampler string }{{"off", ""}, {"on", "always_on"}, {"unsampled", "always_off"}} {
		b.Run(tc.name, func(b *testing.B) {
			var tr *Tracing
			if tc.sampler != "" {
				var err error
				tr, err = New(context.Background(), Config{Endpoint: sink.URL, Sampler: tc.sampler}, "bench")
				if err != nil {
					b.Fatal(err)
				}
				defer tr.Shutdown(context.Background()) //nolint:errcheck // a benchmark
			}
			var transport http.RoundTripper = &http.Transport{MaxIdleConnsPerHost: 64}
			if tr != nil {
				transport = tr.Transport(transport)
			}
			client := &http.Client{Transport: transport}
			var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx := r.Context()
				if tr != nil {
					var end func()
					ctx, end = spans(ctx, tr)
					defer end()
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", up.URL+"/x", nil)
				res, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, res.Body) //nolint:errcheck // a benchmark
				res.Body.Close()
			})
			if tr != nil {
				h = tr.Handler(h)
			}
			front := httptest.NewServer(h)
			defer front.Close()
			fc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := fc.Get(front.URL + "/api/login")
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, res.Body) //nolint:errcheck // a benchmark
					res.Body.Close()
				}
			})
		})
	}
}

// spans makes the two spans of a decision, as the limiter does.
func spans(ctx context.Context, tr *Tracing) (context.Context, func()) {
	t := tr.Tracer()
	ctx, decide := t.Start(ctx, "sluice.decide")
	_, store := t.Start(ctx, "sluice.store")
	store.End()
	return ctx, func() { decide.End() }
}
