package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// Route sends requests under a path prefix to their own upstream.
type Route struct {
	// Prefix is in policy.MatchPath form, so route selection sees the same
	// path that rule matching sees.
	Prefix   string
	Upstream *url.URL
}

// ParseUpstream parses an upstream base URL: http or https, with a host, no
// query, fragment or user info. Its errors quote s with any user info,
// query and fragment masked (see RedactURL), since a password there must
// not reach a log or a terminal.
func ParseUpstream(s string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("not a URL: %q", RedactURL(s))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("expected an http:// or https:// URL, got %q", RedactURL(s))
	}
	if u.Host == "" {
		return nil, fmt.Errorf("expected a host in %q", RedactURL(s))
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("expected no query, fragment or user info in %q", RedactURL(s))
	}
	return u, nil
}

// RedactURL returns s, a URL or something meant as one, for a message:
// everything before the last '@' (after a "scheme://") is replaced by
// "xxxxx", as are a query and a fragment, so that no password or token in
// it is repeated. It works on strings that do not parse as URLs too, where
// a password is as likely to be.
func RedactURL(s string) string {
	prefix, rest := "", s
	if i := strings.Index(s, "://"); i >= 0 {
		prefix, rest = s[:i+3], s[i+3:]
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		rest = "xxxxx@" + rest[at+1:]
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i+1] + "xxxxx"
	}
	return prefix + rest
}

// ParseRoutes parses SLUICE_ROUTES: comma-separated prefix=URL pairs such as
// "/billing/=http://billing:8080,/search/=http://search:9200". Every bad
// entry is reported. Routes are returned longest prefix first, so the first
// that matches is the longest.
func ParseRoutes(s string) ([]Route, error) {
	var routes []Route
	var errs []error
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		prefix, target, ok := strings.Cut(entry, "=")
		if !ok || !strings.HasPrefix(prefix, "/") {
			errs = append(errs, fmt.Errorf("expected /prefix/=http://host:port, got %q", RedactURL(entry)))
			continue
		}
		u, err := ParseUpstream(target)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %q: %w", prefix, err))
			continue
		}
		canonical, err := policy.CanonicalPath(prefix)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %q: %w", prefix, err))
			continue
		}
		routes = append(routes, Route{Prefix: policy.MatchPath(canonical), Upstream: u})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	slices.SortStableFunc(routes, func(a, b Route) int { return len(b.Prefix) - len(a.Prefix) })
	for i := 1; i < len(routes); i++ {
		if routes[i].Prefix == routes[i-1].Prefix {
			return nil, fmt.Errorf("prefix %q given twice", routes[i].Prefix)
		}
	}
	return routes, nil
}

// under reports whether the match-form path p is at or below prefix, on
// segment boundaries: "/billing" is under "/billing/" but "/billingx" is not.
func under(p, prefix string) bool {
	prefix = strings.TrimSuffix(prefix, "/")
	if prefix == "" {
		return true
	}
	return p == prefix || (strings.HasPrefix(p, prefix) && p[len(prefix)] == '/')
}

// Timeouts bound what a slow or idle client, or a slow upstream, can hold.
// A zero Write means no limit; the others must be positive.
type Timeouts struct {
	// ReadHeader is the longest a client may take to send a request's
	// headers (SLUICE_READ_HEADER_TIMEOUT): the slowloris bound.
	ReadHeader time.Duration
	// Read is the longest a client may take to send a whole request,
	// body included (SLUICE_READ_TIMEOUT). It does not limit a response:
	// net/http clears the read deadline once the request is read.
	Read time.Duration
	// Idle is how long a keep-alive connection may wait for its next
	// request (SLUICE_IDLE_TIMEOUT).
	Idle time.Duration
	// Write is the longest a response may take, from the end of the
	// request's headers (SLUICE_WRITE_TIMEOUT); 0 never cuts one, so that
	// server-sent events, long downloads and WebSockets last as long as
	// their upstream keeps them open.
	Write time.Duration
	// Upstream is the longest wait for an upstream's response headers
	// (SLUICE_UPSTREAM_TIMEOUT); the body then streams for as long as it
	// takes.
	Upstream time.Duration
}

// DefaultTimeouts are the defaults of the SLUICE_*_TIMEOUT settings.
func DefaultTimeouts() Timeouts {
	return Timeouts{
		ReadHeader: 5 * time.Second,
		Read:       60 * time.Second,
		Idle:       120 * time.Second,
		Write:      0,
		Upstream:   60 * time.Second,
	}
}

// NewTransport returns the transport sluice uses towards upstreams: bounded
// dial and handshake times, a bounded wait for the response headers
// (upstream, the Upstream of Timeouts), and enough idle connections per
// host that a busy gateway reuses connections instead of exhausting
// ephemeral ports.
func NewTransport(upstream time.Duration) *http.Transport {
	return &http.Transport{
		Proxy: nil, // never route upstream traffic through an environment proxy
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
		ResponseHeaderTimeout: upstream,
	}
}

// NewServer returns an http.Server for h with the client-side timeouts of
// t (its Upstream is the transport's) and a 64 KiB bound on request
// headers.
func NewServer(h http.Handler, t Timeouts) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.ReadHeader,
		ReadTimeout:       t.Read,
		WriteTimeout:      t.Write,
		IdleTimeout:       t.Idle,
		MaxHeaderBytes:    64 << 10,
	}
}
