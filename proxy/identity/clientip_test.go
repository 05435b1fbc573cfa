package identity

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

func TestParseTrustedProxies(t *testing.T) {
	tests := []struct {
		in      string
		want    string // String() of the result
		wantErr string // substring of the error; every bad entry must be named
	}{
		{in: "", want: ""},
		{in: " , ,", want: ""},
		{in: "10.0.0.0/8", want: "10.0.0.0/8"},
		{in: " 10.0.0.0/8 ,\t192.168.1.1 , 2001:db8::/32,", want: "10.0.0.0/8,192.168.1.1/32,2001:db8::/32"},
		{in: "10.1.2.3/8", want: "10.0.0.0/8"},
		{in: "::1", want: "::1/128"},
		{in: "::ffff:10.0.0.0/104", want: "10.0.0.0/8"},
		{in: "::ffff:10.0.0.1", want: "10.0.0.1/32"},
		{in: "fe80::1%eth0", want: "fe80::1/128"},
		{in: "foo", wantErr: `"foo"`},
		{in: "10.0.0.0/33, bar ,1.2.3.4, 1.2.3/24", wantErr: `"10.0.0.0/33", "bar", "1.2.3/24"`},
		{in: "10.0.0.0/8/8", wantErr: `"10.0.0.0/8/8"`},
		{in: "1.2.3.4:80", wantErr: `"1.2.3.4:80"`},
	}
	for _, tt := range tests {
		tp, err := ParseTrustedProxies(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseTrustedProxies(%q) error = %v, want it to contain %s", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseTrustedProxies(%q): %v", tt.in, err)
			continue
		}
		if got := tp.String(); got != tt.want {
			t.Errorf("ParseTrustedProxies(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// mustTrusted is ParseTrustedProxies of a list the test knows to be valid.
func mustTrusted(t testing.TB, s string) TrustedProxies {
	t.Helper()
	tp, err := ParseTrustedProxies(s)
	if err != nil {
		t.Fatalf("ParseTrustedProxies(%q): %v", s, err)
	}
	return tp
}

func TestTrustedProxiesContains(t *testing.T) {
	tp := mustTrusted(t, "10.0.0.0/8, 2001:db8::/32, 192.0.2.7")
	tests := []struct {
		addr string
		want bool
	}{
		{"10.1.2.3", true},
		{"::ffff:10.1.2.3", true},
		{"11.0.0.1", false},
		{"192.0.2.7", true},
		{"192.0.2.8", false},
		{"2001:db8:ffff::1", true},
		{"2001:db8::1%eth0", true},
		{"2001:db9::1", false},
	}
	for _, tt := range tests {
		if got := tp.Contains(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("Contains(%s) = %v, want %v", tt.addr, got, tt.want)
		}
	}
	if tp.Contains(netip.Addr{}) {
		t.Error("Contains(zero Addr) = true")
	}
	var none TrustedProxies
	if none.Contains(netip.MustParseAddr("10.0.0.1")) {
		t.Error("zero TrustedProxies trusts 10.0.0.1")
	}
}

// testHeader builds a header holding the given lines for each name.
func testHeader(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestClientIP(t *testing.T) {
	trusted := mustTrusted(t, "10.0.0.0/8, fd00::/8")
	const xff = "X-Forwarded-For"
	tests := []struct {
		name   string
		tp     TrustedProxies
		remote string
		h      http.Header
		want   string
	}{
		{name: "peer, no headers", remote: "203.0.113.5:4711", want: "203.0.113.5"},
		{name: "peer IPv6 with port", remote: "[2001:db8::5]:443", want: "2001:db8::5"},
		{name: "peer IPv6 with zone", remote: "[fe80::1%eth0]:443", want: "fe80::1"},
		{name: "peer IPv4-mapped", remote: "[::ffff:203.0.113.5]:80", want: "203.0.113.5"},
		{name: "peer without port", remote: "203.0.113.5", want: "203.0.113.5"},
		{name: "unparseable peer", remote: "@", want: "0.0.0.0"},
		{name: "empty peer", remote: "", want: "0.0.0.0"},
		{
			name: "spoofed XFF from untrusted peer ignored", remote: "203.0.113.5:1",
			h: testHeader(xff, "1.1.1.1"), want: "203.0.113.5",
		},
		{
			name: "spoofed XFF ignored without any trusted proxies", tp: TrustedProxies{}, remote: "10.0.0.1:1",
			h: testHeader(xff, "1.1.1.1"), want: "10.0.0.1",
		},
		{
			name: "X-Real-IP, Forwarded and friends never consulted", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader("X-Real-Ip", "1.1.1.1", "Forwarded", "for=2.2.2.2", "True-Client-Ip", "3.3.3.3",
				"Cf-Connecting-Ip", "4.4.4.4"),
			want: "10.0.0.1",
		},
		{
			name: "trusted peer, one entry", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "198.51.100.9"), want: "198.51.100.9",
		},
		{
			name: "client-prepended entries left of the real one ignored", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "6.6.6.6, 7.7.7.7, 198.51.100.9, 10.0.0.2"), want: "198.51.100.9",
		},
		{
			name: "several XFF lines read in order", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "6.6.6.6, 198.51.100.9", xff, "10.0.0.3", xff, "10.0.0.2 , "), want: "198.51.100.9",
		},
		{
			name: "last line untrusted wins over earlier lines", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "6.6.6.6", xff, "198.51.100.9"), want: "198.51.100.9",
		},
		{
			name: "all trusted: leftmost", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "10.9.9.9, 10.0.0.3", xff, "10.0.0.2"), want: "10.9.9.9",
		},
		{
			name: "trusted peer, no XFF", tp: trusted, remote: "10.0.0.1:1", want: "10.0.0.1",
		},
		{
			name: "trusted peer, empty XFF entries", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, " , ,"), want: "10.0.0.1",
		},
		{
			name: "garbage rightmost untrusted entry falls back to peer", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "198.51.100.9, unknown"), want: "10.0.0.1",
		},
		{
			name: "garbage left of the client entry is never reached", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "<script>, 198.51.100.9, 10.0.0.2"), want: "198.51.100.9",
		},
		{
			name: "garbage in an all-trusted chain falls back to peer", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "bogus, 10.0.0.2"), want: "10.0.0.1",
		},
		{
			name: "entries with ports", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "198.51.100.9:5555, 10.0.0.2:80"), want: "198.51.100.9",
		},
		{
			name: "bracketed IPv6 with port", tp: trusted, remote: "[fd00::1]:443",
			h: testHeader(xff, "[2001:db8::7]:5555, [fd00::2]"), want: "2001:db8::7",
		},
		{
			name: "bare IPv6 entry", tp: trusted, remote: "[fd00::1]:443",
			h: testHeader(xff, "2001:db8::7"), want: "2001:db8::7",
		},
		{
			name: "IPv4-mapped entry is unmapped", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "::ffff:198.51.100.9"), want: "198.51.100.9",
		},
		{
			name: "IPv4-mapped trusted peer", tp: trusted, remote: "[::ffff:10.0.0.1]:1",
			h: testHeader(xff, "198.51.100.9"), want: "198.51.100.9",
		},
		{
			name: "bad port falls back to peer", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "198.51.100.9:99999"), want: "10.0.0.1",
		},
		{
			name: "unterminated bracket falls back to peer", tp: trusted, remote: "10.0.0.1:1",
			h: testHeader(xff, "[2001:db8::7"), want: "10.0.0.1",
		},
		{
			name: "lower-case header key from a raw map is not read", tp: trusted, remote: "10.0.0.1:1",
			h: http.Header{"x-forwarded-for": {"198.51.100.9"}}, want: "10.0.0.1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.h
			if h == nil {
				h = http.Header{}
			}
			got := tt.tp.ClientIP(tt.remote, h)
			if want := netip.MustParseAddr(tt.want); got != want {
				t.Errorf("ClientIP(%q, %v) = %v, want %v", tt.remote, h, got, want)
			}
		})
	}
}

func FuzzClientIP(f *testing.F) {
	f.Add("203.0.113.5:4711", "1.1.1.1", "")
	f.Add("10.0.0.1:1", "6.6.6.6, 198.51.100.9, 10.0.0.2", "10.0.0.3")
	f.Add("[fd00::1]:443", "[2001:db8::7]:5555, [fd00::2]", "")
	f.Add("[::ffff:10.0.0.1]:1", "unknown", "::ffff:1.2.3.4")
	f.Add("[fe80::1%eth0]:443", "fe80::1%25lo, ,", "[")
	f.Add("10.0.0.1:1", "10.0.0.2", "10.0.0.3:65535")
	f.Add("@", "", "")
	trusted := mustTrusted(f, "10.0.0.0/8, fd00::/8, ::ffff:0:0/96")
	f.Fuzz(func(t *testing.T, remote, line1, line2 string) {
		h := http.Header{"X-Forwarded-For": {line1, line2}}
		got := trusted.ClientIP(remote, h)
		if !got.IsValid() || got.Zone() != "" || got.Is4In6() {
			t.Fatalf("ClientIP(%q, %q) = %v: not a valid, unmapped, zone-less address", remote, h, got)
		}
		var none TrustedProxies
		peer := none.ClientIP(remote, h)
		if want := none.ClientIP(remote, nil); peer != want {
			t.Fatalf("with no trusted proxies ClientIP(%q) depends on X-Forwarded-For: %v vs %v", remote, peer, want)
		}
		if ap, err := netip.ParseAddrPort(remote); err == nil && peer != ap.Addr().Unmap().WithZone("") {
			t.Fatalf("with no trusted proxies ClientIP(%q) = %v, want the peer", remote, peer)
		}
		if !trusted.Contains(peer) && got != peer {
			t.Fatalf("untrusted peer %v but ClientIP = %v", peer, got)
		}
	})
}

func BenchmarkClientIP(b *testing.B) {
	trusted := mustTrusted(b, "10.0.0.0/8, 172.16.0.0/12, fd00::/8")
	cases := []struct {
		name   string
		remote string
		h      http.Header
	}{
		{"untrusted-peer", "203.0.113.5:4711", http.Header{"X-Forwarded-For": {"1.1.1.1"}}},
		{"trusted-chain", "10.0.0.1:4711", http.Header{"X-Forwarded-For": {"6.6.6.6, 198.51.100.9, 10.0.0.2", "10.0.0.3"}}},
		{"ipv6-chain", "[fd00::1]:443", http.Header{"X-Forwarded-For": {"[2001:db8::7]:5555, fd00::2"}}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = trusted.ClientIP(c.remote, c.h)
			}
		})
	}
}
