package proxy

import (
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"
)

// Outcomes of a request as the access log names them.
const (
	outcomeAllowed     = "allowed"     // decided and forwarded
	outcomeLimited     = "limited"     // 429
	outcomeUnavailable = "unavailable" // 503: a fail=closed rule could not be decided
	outcomeNoRule      = "no_rule"     // no rule matched; forwarded
	outcomeRejected    = "rejected"    // 400 or 413 before any decision
)

// keyPrefixLen is how much of a hashed key the access log shows: enough
// to tell keys apart and follow one across lines, and, being a prefix of
// an HMAC, nothing about the identifier without SLUICE_HASH_KEY.
const keyPrefixLen = 12

// statusWriter records the status of the response it writes. It unwraps
// for http.ResponseController, through which ReverseProxy flushes and
// hijacks.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && code >= 200 { // 1xx responses are not the answer
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// observing reports whether requests are followed to their end: for the
// responses metric or the access log.
func (p *Proxy) observing() bool { return p.cfg.Metrics != nil || p.cfg.AccessLog != nil }

// finish counts the response of a request and writes its access log line.
// began is when ServeHTTP started; st holds what it found out.
func (p *Proxy) finish(r *http.Request, st *requestState, began time.Time) {
	code := st.w.code
	if code == 0 { // a handler that wrote nothing sent 200
		code = http.StatusOK
	}
	if p.cfg.Metrics != nil {
		p.cfg.Metrics.CountResponse(code)
	}
	if p.cfg.AccessLog == nil {
		return
	}
	rules := make([]string, len(st.checks))
	keys := make([]string, len(st.checks))
	for i, c := range st.checks {
		rules[i] = c.Rule.Name
		keys[i] = c.Key[:min(len(c.Key), keyPrefixLen)]
	}
	if len(st.checks) == 0 { // rejected before its keys were worked out
		for _, rule := range st.rules {
			rules = append(rules, rule.Name)
		}
	}
	fields := make([]zap.Field, 0, 8)
	fields = append(fields,
		zap.String("method", r.Method),
		zap.String("path", st.path),
		zap.Strings("rules", rules),
		zap.Strings("keys", keys),
		zap.String("outcome", st.verdict),
		zap.Int("status", code),
		zap.Float64("duration_ms", float64(time.Since(began).Microseconds())/1000),
	)
	if st.upstream > 0 {
		fields = append(fields, zap.Float64("upstream_ms", float64(st.upstream.Microseconds())/1000))
	}
	p.cfg.AccessLog.Info("request", fields...)
}

// CountResponse counts one response of the public listener by status:
// sluice_http_responses_total{code}. The listener's own answers to
// requests net/http refused (see ProblemListener) are counted through it
// too.
func (m *Metrics) CountResponse(code int) {
	label := ""
	if code >= 100 && code < 600 {
		label = statusLabels[code-100]
	} else {
		label = strconv.Itoa(code)
	}
	m.responses.WithLabelValues(label).Inc()
}

// statusLabels are the code labels of statuses 100 to 599, made once so
// that counting a response allocates nothing. Never written after init.
var statusLabels = func() (l [500]string) {
	for i := range l {
		l[i] = strconv.Itoa(100 + i)
	}
	return l
}()
