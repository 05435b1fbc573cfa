package admin

import (
	"crypto/subtle"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/sluicehq/sluice/internal/jsontext"
	"github.com/sluicehq/sluice/proxy"
)

// The rules every request to the admin listener meets before a handler
// reads it: its Host (without a token), its token, the form of its
// body, and the form of every error it gets.

// loopbackOnly answers, through h, only requests whose Host is a loopback
// address or localhost (see IsLoopbackHost); any other gets 421
// Misdirected Request. It guards an admin listener without a token: such
// a listener is on loopback (the gateway refuses to start otherwise), and
// only a browser can reach it there with another Host, on a page whose
// name an attacker pointed at 127.0.0.1 (DNS rebinding); that page is of
// the attacker's origin, so the browser would let it read every answer.
// 421 says what is wrong (this listener does not serve that name, RFC
// 9110 section 15.5.20) where 403 would say the client lacks a right,
// and it applies to every path, /healthz, /readyz and /metrics included:
// probes of a listener on loopback come from the same host, with a
// loopback Host.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !IsLoopbackHost(r.Host) {
			proxy.WriteProblem(w, proxy.Problem{
				Status: http.StatusMisdirectedRequest,
				Detail: "without SLUICE_ADMIN_TOKEN, the admin listener answers only a Host that is a loopback address or localhost",
			})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// IsLoopbackHost reports whether host, a Host header's value or a
// listener's host (with or without a port), names this host's loopback
// interface: an address in 127.0.0.0/8 or ::1 (an IPv6 one in brackets
// when a port follows, and without a zone), or the name localhost in any
// ASCII case, with or without the trailing dot of a fully qualified
// name. Nothing else is: no other spelling of an address (127.1,
// 2130706433), no name that merely starts or ends like localhost, and no
// case folding beyond ASCII ("localhoſt" is not localhost).
func IsLoopbackHost(host string) bool {
	name := host
	if h, port, err := net.SplitHostPort(host); err == nil {
		if strings.Trim(port, "0123456789") != "" {
			return false
		}
		name = h
	} else if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		name = host[1 : len(host)-1]
	}
	if asciiEqualFold(strings.TrimSuffix(name, "."), "localhost") {
		return true
	}
	a, err := netip.ParseAddr(name)
	return err == nil && a.Zone() == "" && a.Unmap().IsLoopback()
}

// asciiEqualFold reports whether a and b are equal when ASCII letters are
// compared ignoring case, and nothing else is folded.
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// hasToken reports whether r carries token as its bearer credentials:
// exactly one Authorization field whose value is the scheme Bearer, in
// any case (RFC 9110 section 11.1), one or more spaces, and then token,
// compared in constant time and in its own case.
func hasToken(r *http.Request, token string) bool {
	vs := r.Header.Values("Authorization")
	if len(vs) != 1 {
		return false
	}
	scheme, got, ok := strings.Cut(vs[0], " ")
	if !ok || !asciiEqualFold(scheme, "Bearer") {
		return false
	}
	got = strings.TrimLeft(got, " ")
	return subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// problems serves mux, answering what mux answers by itself for a path
// no pattern serves (404) or a method the path's patterns do not take
// (405, with its Allow header) with a problem, as every other error of
// the listener's; its redirects (to a cleaned path) stay as they are.
func problems(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		// Learn which error it is, and its Allow, from mux's own handler.
		rec := &statusRecorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusMethodNotAllowed:
			allow := rec.header.Get("Allow")
			w.Header().Set("Allow", allow)
			proxy.WriteProblem(w, proxy.Problem{Status: http.StatusMethodNotAllowed, Detail: "method " + r.Method + " is not allowed here; allowed: " + allow})
		default:
			proxy.WriteProblem(w, proxy.Problem{Status: http.StatusNotFound, Detail: "the admin listener serves nothing at this path"})
		}
	})
}

// asProblem serves h, turning an error it writes in another form than
// problem+json (promhttp's text/plain 500 when metrics cannot be
// gathered) into a problem of the same status, its text the detail.
func asProblem(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pw := &problemWriter{ResponseWriter: w}
		h.ServeHTTP(pw, r)
		pw.finish()
	})
}

// problemWriter passes a response on, unless its status is an error
// and its Content-Type not problem+json: that one it keeps (the first
// maxDetail bytes of its body) for finish to answer as a problem.
type problemWriter struct {
	http.ResponseWriter
	wrote  bool // the status went out
	status int  // an error being kept, 0 otherwise
	detail []byte
}

// maxDetail bounds the text of an error kept as a problem's detail.
const maxDetail = 512

func (p *problemWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }

func (p *problemWriter) WriteHeader(status int) {
	switch {
	case p.wrote || p.status != 0:
		return
	case status >= 400 && p.Header().Get("Content-Type") != "application/problem+json":
		p.status = status
		return
	case status >= 200:
		p.wrote = true
	}
	p.ResponseWriter.WriteHeader(status)
}

func (p *problemWriter) Write(b []byte) (int, error) {
	if !p.wrote && p.status == 0 {
		p.WriteHeader(http.StatusOK)
	}
	if p.status != 0 {
		p.detail = append(p.detail, b[:min(len(b), maxDetail-len(p.detail))]...)
		return len(b), nil
	}
	return p.ResponseWriter.Write(b)
}

// finish answers a kept error as a problem.
func (p *problemWriter) finish() {
	if p.status == 0 {
		return
	}
	h := p.Header()
	h.Del("Content-Encoding")
	detail := strings.Join(strings.Fields(string(p.detail)), " ")
	if detail == "" {
		detail = http.StatusText(p.status)
	}
	proxy.WriteProblem(p.ResponseWriter, proxy.Problem{Status: p.status, Detail: detail})
}

// statusRecorder keeps the header and status a handler writes, and
// drops its body.
type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header { return s.header }

func (s *statusRecorder) WriteHeader(status int) {
	if s.status == 0 {
		s.status = status
	}
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	return len(b), nil
}

// maxBody bounds the body of an admin write: a few members of short
// values.
const maxBody = 4 << 10

// readBody reads the JSON body of a write into v, a pointer to a struct,
// or returns the problem that answers it: 415 unless its one Content-Type
// is application/json (any parameters, such as a charset, allowed), 413
// over maxBody, and 400 unless it is one object of v's members, each
// given once and spelled exactly, with nothing after it but white space
// (jsontext.Decode). what describes the body expected, for the 400.
func readBody(w http.ResponseWriter, r *http.Request, v any, what string) *proxy.Problem {
	ct := r.Header.Values("Content-Type")
	if len(ct) != 1 {
		return &proxy.Problem{Status: http.StatusUnsupportedMediaType, Detail: "the body must be application/json: send one Content-Type: application/json"}
	}
	if mt, _, err := mime.ParseMediaType(ct[0]); err != nil || mt != "application/json" {
		return &proxy.Problem{Status: http.StatusUnsupportedMediaType, Detail: "the body must be application/json"}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return &proxy.Problem{Status: http.StatusRequestEntityTooLarge, Detail: "the body is over 4 KiB"}
		}
		return &proxy.Problem{Status: http.StatusBadRequest, Detail: "body: " + err.Error()}
	}
	if err := jsontext.Decode(body, v); err != nil {
		return &proxy.Problem{Status: http.StatusBadRequest, Detail: "body: expected " + what + ": " + err.Error()}
	}
	return nil
}
