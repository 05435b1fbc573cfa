package gateway

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/proctest"
	"github.com/sluicehq/sluice/proxy"
)

// otlpReceiver is an OTLP/HTTP collector in the test: it accepts
// protobuf exports at /v1/traces and keeps them.
type otlpReceiver struct {
	*httptest.Server
	mu      sync.Mutex
	exports []*coltrace.ExportTraceServiceRequest
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
			t.Errorf("OTLP receiver: %s %s (%s): %v", req.Method, req.URL.Path, req.Header.Get("Content-Type"), err)
			http.Error(w, "unexpected", http.StatusBadRequest)
			return
		}
		var exp coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &exp); err != nil {
			t.Errorf("OTLP receiver: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.exports = append(r.exports, &exp)
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

// spans returns every span received, and the JSON of every export (its
// resources, spans, attributes, events and statuses) to search.
func (r *otlpReceiver) spans() ([]*tracepb.Span, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var spans []*tracepb.Span
	var all strings.Builder
	for _, exp := range r.exports {
		for _, rs := range exp.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				spans = append(spans, ss.GetSpans()...)
			}
		}
		all.WriteString(protojson.Format(exp))
	}
	return spans, all.String()
}

func attr(s *tracepb.Span, key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			if a := kv.GetValue().GetArrayValue(); a != nil {
				var vs []string
				for _, v := range a.GetValues() {
					vs = append(vs, v.GetStringValue())
				}
				return strings.Join(vs, ",")
			}
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// TestTracing: with OTEL_EXPORTER_OTLP_ENDPOINT set, a gateway sends its
// spans to the collector: the trace of an incoming traceparent continues
// through sluice to the upstream, which receives a traceparent of the
// same trace; the request's server span has the decision's span as a
// child, which has the store call's; and no raw identifier (the client's
// IP, as its socket and as X-Forwarded-For, an e-mail address in a body
// and in a query, a tenant, a header value, a bearer token, the user
// agent) appears anywhere in what the collector receives.
func TestTracing(t *testing.T) {
	recv := newOTLPReceiver(t)
	var mu sync.Mutex
	var upstreamSaw []string // traceparent of each upstream request
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upstreamSaw = append(upstreamSaw, r.Header.Get("Traceparent"))
		mu.Unlock()
	}))
	defer up.Close()
	g, run := serveGateway(t, map[string]string{
		"SLUICE_UPSTREAM": up.URL,
		"SLUICE_RULES": "login: POST /api/login by ip 100/1h\n" +
			"reset: POST /api/reset by email 100/1h\n" +
			"query: GET /api/q by tenant 100/1h\n" +
			"keyed: GET /api/k by header(X-Api-Key) 100/1h\n" +
			"agent: GET /api/k by header(User-Agent) 100/1h\n" +
			"tiny: GET /api/tiny by ip 1/1h",
		"SLUICE_TRUSTED_PROXIES":      "127.0.0.0/8",
		"OTEL_EXPORTER_OTLP_ENDPOINT": recv.URL,
		"OTEL_SERVICE_NAME":           "sluice-under-test",
	}, Options{Logger: zap.NewNop()})
	if g.tracing == nil {
		t.Fatal("tracing is off")
	}

	// The client connects from 127.0.0.9, an address found nowhere else.
	client := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")},
	}).DialContext}}
	secrets := []string{
		"127.0.0.9", "203.0.113.77", "victim.distinct", "tenant-distinct-acme",
		"apikey-distinct-9", "tok-distinct-secret", "agent-distinct-7",
	}
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	send := func(method, path, body string) int {
		req, _ := http.NewRequest(method, run.url+path, strings.NewReader(body))
		req.Header.Set("Traceparent", "00-"+traceID+"-"+parentID+"-01")
		req.Header.Set("X-Forwarded-For", "203.0.113.77")
		req.Header.Set("User-Agent", "agent-distinct-7")
		req.Header.Set("Authorization", "Bearer tok-distinct-secret")
		req.Header.Set("X-Tenant-ID", "tenant-distinct-acme")
		req.Header.Set("X-Api-Key", "apikey-distinct-9")
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	pgtest.ClearOf(t, time.Hour, 10*time.Second)
	for _, r := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/api/login", "", 200},
		{"POST", "/api/reset", `{"email":"victim.distinct@example.com"}`, 200},
		{"POST", "/api/reset?email=victim.distinct%40example.com", "", 200},
		{"GET", "/api/q?tenant=tenant-distinct-acme", "", 200},
		{"GET", "/api/k", "", 200},
		{"GET", "/api/tiny", "", 200},
		{"GET", "/api/tiny", "", 429}, // the store denies
		{"GET", "/api/tiny", "", 429}, // the fast path denies
	} {
		if code := send(r.method, r.path, r.body); code != r.want {
			t.Fatalf("%s %s: %d, want %d", r.method, r.path, code, r.want)
		}
	}
	if err := run.stop(); err != nil { // sends the spans not yet sent
		t.Fatal(err)
	}

	spans, all := recv.spans()
	byID := map[string]*tracepb.Span{}
	for _, s := range spans {
		byID[hex.EncodeToString(s.GetSpanId())] = s
	}
	parentOf := func(s *tracepb.Span) *tracepb.Span { return byID[hex.EncodeToString(s.GetParentSpanId())] }
	var servers, decisions, stores, clients int
	for _, s := range spans {
		if got := hex.EncodeToString(s.GetTraceId()); got != traceID {
			t.Errorf("span %s of trace %s, want the incoming %s", s.GetName(), got, traceID)
		}
		switch {
		case s.GetKind() == tracepb.Span_SPAN_KIND_SERVER:
			servers++
			if hex.EncodeToString(s.GetParentSpanId()) != parentID {
				t.Errorf("server span's parent %x, want the incoming %s", s.GetParentSpanId(), parentID)
			}
		case s.GetName() == "sluice.decide":
			decisions++
			if p := parentOf(s); p == nil || p.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("decision span's parent is %v, want the request's server span", p.GetName())
			}
			if attr(s, "sluice.rules") == "" || attr(s, "sluice.outcome") == "" {
				t.Errorf("decision span without rules or outcome: %v", s.GetAttributes())
			}
		case s.GetName() == "sluice.store":
			stores++
			if p := parentOf(s); p == nil || p.GetName() != "sluice.decide" {
				t.Errorf("store span's parent is %v, want the decision's span", p.GetName())
			}
		case s.GetKind() == tracepb.Span_SPAN_KIND_CLIENT:
			clients++
			if p := parentOf(s); p == nil || p.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("upstream span's parent is %v, want the request's server span", p.GetName())
			}
			if attr(s, "server.address") != "127.0.0.1" {
				t.Errorf("upstream span without the upstream's address: %v", s.GetAttributes())
			}
		}
	}
	// 8 requests, each decided; the third /api/tiny from the fast path,
	// with no store call; 6 forwarded.
	if servers != 8 || decisions != 8 || stores != 7 || clients != 6 {
		t.Errorf("got %d server, %d decision, %d store and %d upstream spans, want 8, 8, 7 and 6", servers, decisions, stores, clients)
	}
	limited := 0
	for _, s := range spans {
		if s.GetName() == "sluice.decide" && attr(s, "sluice.outcome") == "limited" && attr(s, "sluice.rules") == "tiny" {
			limited++
		}
	}
	if limited != 2 {
		t.Errorf("%d limited decisions of tiny, want 2", limited)
	}
	// The upstream received sluice's client span as the parent, in the
	// incoming trace.
	mu.Lock()
	for _, tp := range upstreamSaw {
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || parts[1] != traceID {
			t.Errorf("upstream got traceparent %q, want one of trace %s", tp, traceID)
			continue
		}
		if s := byID[parts[2]]; s == nil || s.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
			t.Errorf("upstream's parent span %s is not sluice's upstream span", parts[2])
		}
	}
	mu.Unlock()
	if !strings.Contains(all, "sluice-under-test") {
		t.Error("the resource does not name the service")
	}
	for _, secret := range secrets {
		if strings.Contains(all, secret) {
			i := strings.Index(all, secret)
			t.Errorf("the collector received %q: …%s…", secret, all[max(0, i-200):min(len(all), i+100)])
		}
	}
}

// TestTracingOff: without an OTLP endpoint (or with tracing turned off)
// no tracing is set up and nothing is wrapped: the public listener serves
// the proxy itself (the upstream transport and the limiter's tracer are
// set in the same branch as this wrapping), so a request costs what it
// did before tracing existed.
func TestTracingOff(t *testing.T) {
	for _, env := range []map[string]string{
		base(),
		{"SLUICE_UPSTREAM": "http://127.0.0.1:3000", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"},
		{"SLUICE_UPSTREAM": "http://127.0.0.1:3000", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"},
	} {
		g, err := New(env, Options{Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		if g.tracing != nil {
			t.Errorf("%v: tracing is on", env)
		}
		if _, ok := g.public.Handler.(*proxy.Proxy); !ok {
			t.Errorf("%v: the public handler is %T, not the proxy itself", env, g.public.Handler)
		}
		g.backend.close()
	}
}

// TestTracingKeepsStreams: with tracing on, otelhttp's wrapping of the
// response keeps what the proxy needs of it: a server-sent event reaches
// the client while the upstream is still sending (flushes pass through),
// and a WebSocket upgrade gets its 101 and a two-way connection (the
// hijack passes through).
func TestTracingKeepsStreams(t *testing.T) {
	recv := newOTLPReceiver(t)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "websocket" {
			conn, brw := proctest.AcceptWebSocket(t, w)
			if conn == nil {
				return
			}
			defer conn.Close()
			line, _ := brw.ReadString('\n')
			brw.WriteString("echo " + line)
			brw.Flush()
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: first\n\n"))
		w.(http.Flusher).Flush()
		<-release
		w.Write([]byte("data: end\n\n"))
	}))
	defer up.Close()
	defer close(release)
	g := start(t, map[string]string{
		"SLUICE_UPSTREAM":             up.URL,
		"SLUICE_RULES":                "all: GET /* by ip 100/1m",
		"OTEL_EXPORTER_OTLP_ENDPOINT": recv.URL,
	})

	res, err := http.Get(g.url + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	first := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(res.Body).ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if line != "data: first\n" {
			t.Fatalf("first line %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first event did not arrive while the upstream was still sending: the stream is buffered")
	}

	conn, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(conn, "GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	br := bufio.NewReader(conn)
	status, _ := br.ReadString('\n')
	if !strings.HasPrefix(status, "HTTP/1.1 101") {
		t.Fatalf("upgrade answered %q", status)
	}
	for line, _ := br.ReadString('\n'); line != "\r\n" && line != ""; line, _ = br.ReadString('\n') {
	}
	fmt.Fprint(conn, "hello\n")
	if got, _ := br.ReadString('\n'); got != "echo hello\n" {
		t.Fatalf("through the upgraded connection: %q", got)
	}
}
