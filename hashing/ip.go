package hashing

import "net/netip"

// IPGroup returns the client group that addr counts under, in canonical
// text form, ready for Hasher.Key.
//
// An IPv4 address (including an IPv4-mapped IPv6 address, which is unmapped
// first, so ::ffff:192.0.2.1 and 192.0.2.1 are one client) is its own group.
// An IPv6 address is grouped by its /64 prefix ("2001:db8:1:2::/64"),
// because a single subscriber is routinely delegated a whole /64 and can
// pick a fresh address from it for every request. Zones are dropped: they
// name a local interface, not a client. The invalid zero Addr gives "".
func IPGroup(addr netip.Addr) string {
	if !addr.IsValid() {
		return ""
	}
	// Formatting into a stack buffer leaves the result string as the only
	// allocation.
	var buf [64]byte
	addr = addr.Unmap()
	if addr.Is4() {
		return string(addr.AppendTo(buf[:0]))
	}
	// Prefix zeroes the host bits, so every address of the /64 yields the
	// same string. It cannot fail for a valid IPv6 address and 64 bits.
	p, _ := addr.WithZone("").Prefix(64)
	return string(p.AppendTo(buf[:0]))
}
