package identity

import (
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// TrustedProxies is the set of proxies (SLUICE_TRUSTED_PROXIES) whose
// X-Forwarded-For sluice believes. The zero value trusts nobody. A
// TrustedProxies is read-only once parsed and safe for simultaneous use.
type TrustedProxies struct {
	prefixes []netip.Prefix
}

// ParseTrustedProxies parses a comma-separated list of CIDR prefixes
// ("10.0.0.0/8") and bare addresses ("192.0.2.7", "2001:db8::1"), with
// whitespace around entries tolerated and empty entries ignored. A prefix
// with host bits set ("10.1.2.3/8") is accepted as its masked form. An
// IPv4-mapped IPv6 prefix of length 96 or more is stored as the IPv4 prefix
// it denotes, because ClientIP unmaps addresses before matching; a shorter
// IPv6 prefix such as ::/0 does not cover IPv4 clients. Zones are dropped.
// The error lists every invalid entry, not just the first.
func ParseTrustedProxies(s string) (TrustedProxies, error) {
	var (
		tp  TrustedProxies
		bad []string
	)
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		p, ok := parseTrusted(entry)
		if !ok {
			bad = append(bad, `"`+entry+`"`)
			continue
		}
		tp.prefixes = append(tp.prefixes, p)
	}
	if len(bad) > 0 {
		return TrustedProxies{}, errors.New("not an IP address or CIDR prefix: " + strings.Join(bad, ", "))
	}
	return tp, nil
}

// parseTrusted parses one SLUICE_TRUSTED_PROXIES entry.
func parseTrusted(entry string) (netip.Prefix, bool) {
	var p netip.Prefix
	if strings.Contains(entry, "/") {
		var err error
		if p, err = netip.ParsePrefix(entry); err != nil {
			return netip.Prefix{}, false
		}
	} else {
		a, err := netip.ParseAddr(entry)
		if err != nil {
			return netip.Prefix{}, false
		}
		a = a.WithZone("")
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), true
}

// Contains reports whether a is a trusted proxy. An IPv4-mapped IPv6
// address is matched as the IPv4 address it carries; a zone is ignored.
func (tp TrustedProxies) Contains(a netip.Addr) bool {
	if len(tp.prefixes) == 0 || !a.IsValid() {
		return false
	}
	a = a.Unmap().WithZone("")
	for _, p := range tp.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// String returns the prefixes in canonical form, comma-separated, for
// check-config and logs (they are configuration, not client identifiers).
func (tp TrustedProxies) String() string {
	parts := make([]string, len(tp.prefixes))
	for i, p := range tp.prefixes {
		parts[i] = p.String()
	}
	return strings.Join(parts, ",")
}

// ClientIP returns the address of the client that sent a request.
// remoteAddr is http.Request.RemoteAddr ("ip:port", "[v6]:port"; a bare
// address is accepted too).
//
// It is the TCP peer, unless the peer is a trusted proxy. Then it is the
// rightmost address, across every X-Forwarded-For line of h in order, that
// is not itself trusted: each proxy appends the address it received the
// request from, so everything right of that entry was written by proxies we
// trust, and everything left of it may have been written by the client.
// Entries are comma-separated and trimmed; the forms "ip", "ip:port",
// "[v6]" and "[v6]:port" are accepted, empty entries are skipped. If every
// entry is trusted (a request from inside the proxy chain), the leftmost
// one is the client. If there are no entries, the peer is the client.
//
// If the rightmost untrusted entry cannot be parsed ("unknown", garbage),
// the peer is returned: a value that the client may have chosen must never
// pick a fresh key, and grouping such requests under the proxy's address
// errs towards limiting more, not less.
//
// X-Real-IP, True-Client-IP, Forwarded, CF-Connecting-IP and every other
// client-supplied header are never consulted. The result is always a valid
// address, unmapped and without zone; a remoteAddr that cannot be parsed
// (not a TCP connection) gives 0.0.0.0, so such requests share one key.
//
// ClientIP allocates nothing unless an entry is unparseable or carries a
// zone.
func (tp TrustedProxies) ClientIP(remoteAddr string, h http.Header) netip.Addr {
	peer, ok := parseHost(remoteAddr)
	if !ok {
		return netip.IPv4Unspecified()
	}
	if !tp.Contains(peer) {
		return peer
	}
	lines := h["X-Forwarded-For"]
	leftmost := peer
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for line != "" {
			var entry string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				entry, line = line[j+1:], line[:j]
			} else {
				entry, line = line, ""
			}
			entry = strings.Trim(entry, " \t")
			if entry == "" {
				continue
			}
			a, ok := parseHost(entry)
			if !ok {
				return peer
			}
			if !tp.Contains(a) {
				return a
			}
			leftmost = a
		}
	}
	return leftmost
}

// parseHost parses "ip", "ip:port", "[v6]" or "[v6]:port", returning the
// address unmapped and without zone.
func parseHost(s string) (netip.Addr, bool) {
	host := s
	if strings.HasPrefix(s, "[") {
		// The last bracket, as net/netip reads it: a zone may hold one.
		end := strings.LastIndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		host = s[1:end]
		if rest := s[end+1:]; rest != "" && !validPort(rest) {
			return netip.Addr{}, false
		}
	} else if i := strings.IndexByte(s, ':'); i >= 0 && strings.IndexByte(s[i+1:], ':') < 0 {
		// Exactly one colon: IPv4 with a port (IPv6 has at least two).
		host = s[:i]
		if !validPort(s[i:]) {
			return netip.Addr{}, false
		}
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// validPort reports whether s is ":" followed by a decimal port number, as
// net/netip reads one: leading zeros allowed.
func validPort(s string) bool {
	if len(s) < 2 || s[0] != ':' {
		return false
	}
	_, err := strconv.ParseUint(s[1:], 10, 16)
	return err == nil
}
