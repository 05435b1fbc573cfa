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

// set writes the selected header families for q.
func (h HeaderFamilies) set(hdr http.Header, q quota) {
	if h.IETF {
		hdr["Ratelimit-Policy"] = []string{`"` + q.rule + `";q=` + strconv.FormatInt(q.limit, 10) +
			";w=" + strconv.FormatInt(int64(q.window/time.Second), 10)}
		hdr["Ratelimit"] = []string{`"` + q.rule + `";r=` + strconv.FormatInt(q.remaining, 10) +
			";t=" + strconv.FormatInt(q.resetIn, 10)}
	}
	if h.X {
		hdr["X-Ratelimit-Limit"] = []string{strconv.FormatInt(q.limit, 10)}
		hdr["X-Ratelimit-Remaining"] = []string{strconv.FormatInt(q.remaining, 10)}
		hdr["X-Ratelimit-Reset"] = []string{strconv.FormatInt(q.resetAt, 10)}
	}
}

// rateLimitHeaders are the headers sluice owns; an upstream's own values are
// dropped so a client never sees two answers.
var rateLimitHeaders = []string{"Ratelimit-Policy", "Ratelimit", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// problem is an RFC 9457 problem details body.
type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	RetryAfter       int64    `json:"retry_after,omitempty"`
}

const quotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// writeProblem writes p as application/problem+json with p.Status.
func writeProblem(w http.ResponseWriter, p problem) {
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
