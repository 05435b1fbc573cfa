package proxy

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluicehq/sluice/hashing"
	"github.com/sluicehq/sluice/jwt"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/memory"
	"github.com/sluicehq/sluice/policy"
)

// benchProxy returns a Proxy for rules on memory stores, in front of an
// upstream that reads every body, as a real one would, and answers "ok".
func benchProxy(b *testing.B, rules string, opts ...func(*DeciderConfig)) *Proxy {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}))
	b.Cleanup(up.Close)
	pol, err := policy.Parse(rules)
	if err != nil {
		b.Fatal(err)
	}
	lim, _ := limiter.New(limiter.Config{Store: memory.New(memory.Options{}), Local: memory.New(memory.Options{}), Timeout: time.Second, DefaultFail: policy.FailOpen, CacheSize: 1000})
	h, _ := hashing.New([]byte("bench-key-0123456789"))
	upURL, _ := url.Parse(up.URL)
	cfg := DeciderConfig{Policy: pol, Limiter: lim, Hasher: h, Headers: HeaderFamilies{IETF: true, X: true}}
	for _, o := range opts {
		o(&cfg)
	}
	dec, err := NewDecider(cfg)
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Config{Upstream: upURL, Decider: dec})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// withAccessLog gives the proxy its responses metric and, when on, an
// access log that zap's production encoder writes as JSON to a discarding
// writer, so that the cost of a log destination is left out.
func withAccessLog(on bool) func(*DeciderConfig) {
	return func(c *DeciderConfig) {
		c.Metrics = NewMetrics(prometheus.NewRegistry())
		if on {
			enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
			c.AccessLog = zap.New(zapcore.NewCore(enc, zapcore.AddSync(io.Discard), zapcore.InfoLevel)).Named("access")
		}
	}
}

// onOff names a benchmark's runs with and without what it measures.
func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// BenchmarkAccessLog measures what SLUICE_ACCESS_LOG costs per proxied
// request: without it (the responses metric only) and with it, encoded as
// JSON by zap's production encoder to a discarding writer, so the cost of
// a log destination is left out.
func BenchmarkAccessLog(b *testing.B) {
	for _, log := range []bool{false, true} {
		b.Run(onOff(log), func(b *testing.B) {
			p := benchProxy(b, "login: POST /api/login by ip 1000000000/1h", withAccessLog(log))
			benchLogin(b, p)
		})
	}
}

// benchLogin sends h POST /api/login from 192.0.2.1 in b's loop, and
// fails on any answer but 200.
func benchLogin(b *testing.B, h http.Handler) {
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest("POST", "/api/login", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatal(w.Code)
		}
	}
}

func BenchmarkProxy(b *testing.B) {
	benchLogin(b, benchProxy(b, "login: POST /api/login by ip 1000000000/1h"))
}

// BenchmarkProxyBody measures requests with bodies: an identifier read from
// a JSON body, and bodies on routes whose rules need none (matched by an IP
// rule, or matched by no rule at all), small and large.
func BenchmarkProxyBody(b *testing.B) {
	p := benchProxy(b, "reset: POST /api/reset by email 1000000000/1h; login: POST /api/login by ip 1000000000/1h")
	login := []byte(`{"email":"victim@example.com","password":"correct horse battery staple","remember_me":true,` +
		`"device":{"id":"3f1a9c2e-0b7d-4e11-9a6f-5c2d8e7b1a40","platform":"web"},"captcha":"03AGdBq25xYz"}`)
	blob := bytes.Repeat([]byte("0123456789abcdef"), 1024) // 16 KiB
	for _, bc := range []struct {
		name, path, ct string
		body           []byte
	}{
		{"email-json-200B", "/api/reset", "application/json", login},
		{"ip-json-200B", "/api/login", "application/json", login},
		{"ip-16KiB", "/api/login", "application/octet-stream", blob},
		{"unmatched-16KiB", "/upload", "application/octet-stream", blob},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest("POST", bc.path, bytes.NewReader(bc.body))
				req.Header.Set("Content-Type", bc.ct)
				req.RemoteAddr = "192.0.2.1:1234"
				w := httptest.NewRecorder()
				p.ServeHTTP(w, req)
				if w.Code != 200 || !strings.HasPrefix(w.Body.String(), "ok") {
					b.Fatal(w.Code, w.Body.String())
				}
			}
		})
	}
}

// BenchmarkAccessLogLine measures the access log's own step (finish) for
// a request decided by two rules, without the proxying around it.
func BenchmarkAccessLogLine(b *testing.B) {
	for _, log := range []bool{false, true} {
		b.Run(onOff(log), func(b *testing.B) {
			p := benchProxy(b, "login: POST /api/login by ip 10/1h; all: * /api/* by global 10/1h", withAccessLog(log))
			req := httptest.NewRequest("POST", "/api/login", nil)
			st := &requestState{Decision: Decision{Path: "/api/login", Verdict: OutcomeAllowed}, upstream: time.Millisecond}
			st.w.code = 200
			for _, r := range p.Policy().Rules() {
				st.Checks = append(st.Checks, limiter.Check{Rule: r, Key: "5opSrQ_Sz3pYk2Nq8LwR0vX1aB4cD6eF7gH9iJ0kL2m"})
			}
			began := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				p.finish(req, st, began)
			}
		})
	}
}

// BenchmarkProxyJWT measures a request counted by a verified claim: an
// HS256 token verified once per request, its sub keyed, and its plan
// claim choosing the limit.
func BenchmarkProxyJWT(b *testing.B) {
	secret := []byte("a-supabase-style-jwt-secret-of-40-bytes!")
	v, err := jwt.New(jwt.Config{Secret: secret, Issuer: "https://auth.example/"})
	if err != nil {
		b.Fatal(err)
	}
	p := benchProxy(b, "api: POST /api/login by jwt 1000000000/1h plans(app_metadata.plan)=pro:2000000000/1h", func(c *DeciderConfig) { c.JWT = v })
	enc := base64.RawURLEncoding.EncodeToString
	in := enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." +
		enc([]byte(`{"sub":"0b6f7a4e-8f3c-4a3e-9d7e-2f1c5b8a9e10","iss":"https://auth.example/","exp":4102444800,"iat":1767225600,"role":"authenticated","app_metadata":{"plan":"pro"}}`))
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(in))
	auth := "Bearer " + in + "." + enc(mac.Sum(nil))
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest("POST", "/api/login", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		req.Header.Set("Authorization", auth)
		w := httptest.NewRecorder()
		p.ServeHTTP(w, req)
		if w.Code != 200 || w.Header().Get("X-Ratelimit-Limit") != "2000000000" {
			b.Fatal(w.Code, w.Header())
		}
	}
}
