package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"

	"google.golang.org/protobuf/encoding/protowire"
)

// otlpSink is the collector of the traced target: an OTLP/HTTP endpoint
// on loopback that accepts every export and counts its spans, the least
// a collector can do, so that what the table shows is sluice's cost of
// tracing and not a collector's. It counts without decoding the spans
// (protowire walks the three levels of the message), so that it takes
// little of the machine sluice runs on.
type otlpSink struct {
	url     string
	exports atomic.Int64
	spans   atomic.Int64
	bytes   atomic.Int64
	stop    func()
}

// empty is the protobuf encoding of an ExportTraceServiceResponse
// without a partial success: no bytes at all.
var empty []byte

func startOTLPSink() (*otlpSink, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{url: "http://" + l.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		n, err := countSpans(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.exports.Add(1)
		s.spans.Add(int64(n))
		s.bytes.Add(int64(len(body)))
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(empty) //nolint:errcheck // the exporter may be gone
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l) //nolint:errcheck // ends with Close
	s.stop = func() { srv.Close() }
	return s, nil
}

// countSpans counts the spans of an ExportTraceServiceRequest:
// resource_spans (field 1) hold scope_spans (field 2), which hold spans
// (field 2).
func countSpans(b []byte) (int, error) {
	n := 0
	err := eachField(b, 1, func(rs []byte) error {
		return eachField(rs, 2, func(ss []byte) error {
			return eachField(ss, 2, func([]byte) error { n++; return nil })
		})
	})
	return n, err
}

// eachField calls f with every length-delimited field num of message b.
func eachField(b []byte, num protowire.Number, f func([]byte) error) error {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return errors.New("otlp sink: malformed tag")
		}
		b = b[l:]
		if n == num && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return errors.New("otlp sink: malformed field")
			}
			if err := f(v); err != nil {
				return err
			}
			b = b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return errors.New("otlp sink: malformed field")
		}
		b = b[l:]
	}
	return nil
}
