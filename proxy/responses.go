package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HeaderFamilies selects the rate-limit headers sluice sends.
type HeaderFamilies struct {
	IETF bool // RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers-10)
	X    bool // X-RateLimit-Limit, -Remaining, -Reset
}

// ParseHeaderFamilies parses SLUICE_HEADERS: "ietf", "x", "ietf,x" or "none".
func ParseHeaderFamilies(s string) (HeaderFamilies, error) {
	var h HeaderFamilies
	for f := range strings.SplitSeq(s, ",") {
		switch strings.TrimSpace(f) {
		case "ietf":
			h.IETF = true
		case "x":
			h.X = true
		case "none":
			if strings.TrimSpace(s) != "none" {
				return h, fmt.Errorf("none cannot be combined with other families, got %q", s)
			}
		default:
			return h, fmt.Errorf("expected ietf, x, ietf,x or none, got %q", s)
		}
	}
	return h, nil
}

// quota is what the rate-limit headers say about one rule.
type quota struct {
	rule      string
	limit     int64
	window    time.Duration
	remaining int64
	resetIn   int64 // whole seconds until reset, rounded up
	resetAt   int64 // Unix seconds of the reset, on the store's clock
}

// set writes the selected header families for q. Every value is a
// substring of one string built at once, and the values share one backing
// slice: two allocations per response rather than one per number and
// header, on the path every proxied request takes.
func (h HeaderFamilies) set(hdr http.Header, q quota) {
	var (
		scratch [192]byte
		ends    [5]int
		n       int
	)
	b := scratch[:0]
	end := func() { ends[n] = len(b); n++ }
	if h.IETF {
		b = append(b, '"')
		b = append(b, q.rule...)
		b = append(b, `";q=`...)
		b = strconv.AppendInt(b, q.limit, 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, int64(q.window/time.Second), 10)
		end()
		b = append(b, '"')
		b = append(b, q.rule...)
		b = append(b, `";r=`...)
		b = strconv.AppendInt(b, q.remaining, 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, q.resetIn, 10)
		end()
	}
	if h.X {
		b = strconv.AppendInt(b, q.limit, 10)
		end()
		b = strconv.AppendInt(b, q.remaining, 10)
		end()
		b = strconv.AppendInt(b, q.resetAt, 10)
		end()
	}
	if n == 0 {
		return
	}
	all := string(b)
	vals := make([]string, n)
	start := 0
	for i := range n {
		vals[i] = all[start:ends[i]]
		start = ends[i]
	}
	i := 0
	if h.IETF {
		hdr["Ratelimit-Policy"] = vals[0:1:1]
		hdr["Ratelimit"] = vals[1:2:2]
		i = 2
	}
	if h.X {
		hdr["X-Ratelimit-Limit"] = vals[i : i+1 : i+1]
		hdr["X-Ratelimit-Remaining"] = vals[i+1 : i+2 : i+2]
		hdr["X-Ratelimit-Reset"] = vals[i+2 : i+3 : i+3]
	}
}

// rateLimitHeaders are the headers sluice owns; an upstream's own values are
// dropped so a client never sees two answers.
var rateLimitHeaders = []string{"Ratelimit-Policy", "Ratelimit", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"}

// CeilSeconds is d in whole seconds, rounded up: how every response of
// sluice's (the rate-limit headers, Retry-After, problem bodies, the admin
// API) shows a time to wait, so that a client that waits that long is never
// early.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// CeilUnix is t in Unix seconds, rounded up, as CeilSeconds rounds a
// duration.
func CeilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// Problem is an RFC 9457 problem details body: every error sluice sends,
// on any listener, is one.
type Problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	RetryAfter       int64    `json:"retry_after,omitempty"`
	// Challenge is the WWW-Authenticate header of a 401 (RFC 9110 section
	// 11.6.1), not part of the body; "" sends none.
	Challenge string `json:"-"`
}

const quotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// WriteProblem writes p as application/problem+json with p.Status, never
// to be stored by a cache. An empty Type is about:blank and an empty Title
// the status's name (RFC 9110's, where Go's differs). It is the one way
// sluice's handlers, on the public listener and the admin listener, answer
// an error.
func WriteProblem(w http.ResponseWriter, p Problem) {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = statusTitle(p.Status)
	}
	body, err := json.Marshal(p)
	if err != nil { // a problem built from strings and ints always marshals
		panic(err)
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/problem+json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	h["Cache-Control"] = []string{"no-store"}
	if p.Challenge != "" {
		h["Www-Authenticate"] = []string{p.Challenge}
	}
	w.WriteHeader(p.Status)
	w.Write(body) //nolint:errcheck // the client may be gone; nothing to do
}

// statusTitle uses RFC 9110's names where Go's differ.
func statusTitle(code int) string {
	if code == http.StatusRequestEntityTooLarge {
		return "Content Too Large"
	}
	return http.StatusText(code)
}
