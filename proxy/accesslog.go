package proxy

import (
	"net/http"
	"strconv"
	"time"
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
func (p *Proxy) observing() bool { return p.dec.observing() }

// finish counts the response of a request and writes its access log line.
// began is when ServeHTTP started; st holds what it found out.
func (p *Proxy) finish(r *http.Request, st *requestState, began time.Time) {
	code := st.w.code
	if code == 0 { // a handler that wrote nothing sent 200
		code = http.StatusOK
	}
	if m := p.dec.cfg.Metrics; m != nil {
		m.CountResponse(code)
	}
	p.dec.Finish(ListenerPublic, r.Method, &st.Decision, code, time.Since(began), st.upstream)
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
