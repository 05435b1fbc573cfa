package main

import (
	"bytes"
	"net/http"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestOTLPSink: the sink counts the spans of an export, across resources
// and scopes, and answers as a collector does.
func TestOTLPSink(t *testing.T) {
	attr := []*commonpb.KeyValue{{Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "x"}}}}
	spans := func(n int) []*tracepb.Span {
		var s []*tracepb.Span
		for range n {
			s = append(s, &tracepb.Span{Name: "sluice.decide", TraceId: make([]byte, 16), SpanId: make([]byte, 8), Attributes: attr})
		}
		return s
	}
	exp := &coltrace.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
		{Resource: &resourcepb.Resource{Attributes: attr}, ScopeSpans: []*tracepb.ScopeSpans{
			{Scope: &commonpb.InstrumentationScope{Name: "a"}, Spans: spans(3)},
			{Scope: &commonpb.InstrumentationScope{Name: "b"}, Spans: spans(2)},
		}},
		{ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans(4)}}},
	}}
	body, err := proto.Marshal(exp)
	if err != nil {
		t.Fatal(err)
	}
	s, err := startOTLPSink()
	if err != nil {
		t.Fatal(err)
	}
	defer s.stop()
	res, err := http.Post(s.url+"/v1/traces", "application/x-protobuf", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || s.spans.Load() != 9 || s.exports.Load() != 1 {
		t.Fatalf("%d: %d spans in %d exports, want 9 in 1", res.StatusCode, s.spans.Load(), s.exports.Load())
	}
	if _, err := countSpans([]byte{0x0a, 0x05, 0x01}); err == nil {
		t.Fatal("a truncated message: no error")
	}
}
