package hashing

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/text/unicode/norm"
)

func TestNewRejectsEmptyKey(t *testing.T) {
	for _, key := range [][]byte{nil, {}} {
		if h, err := New(key); err == nil || h != nil {
			t.Errorf("New(%v) = %v, %v; want nil, error", key, h, err)
		}
	}
}

func TestKeyMatchesReferenceHMAC(t *testing.T) {
	key := []byte("test-key")
	h, err := New(key)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		kind  string
		value string
	}{
		{"ip", "192.0.2.1"},
		{"ip", "2001:db8::/64"},
		{"email", "victim@example.com"},
		{"tenant", "acme"},
		{"header", ""},
		{"global", ""},
		{"email", strings.Repeat("x", 10000)},
	}
	for _, tt := range tests {
		m := hmac.New(sha256.New, key)
		m.Write([]byte(tt.kind + "\x00" + tt.value))
		want := base64.RawURLEncoding.EncodeToString(m.Sum(nil))
		// Twice, so that a pooled state that was not reset would show.
		for i := 0; i < 2; i++ {
			got := h.Key(tt.kind, tt.value)
			if got != want {
				t.Errorf("Key(%v, %.20q) = %q, want %q", tt.kind, tt.value, got, want)
			}
			if len(got) != KeyLen {
				t.Errorf("len(Key) = %d, want %d", len(got), KeyLen)
			}
		}
	}
}

// distinct returns add, which records the key k under name and fails t
// when another name recorded k before.
func distinct(t *testing.T) (add func(name, k string)) {
	seen := map[string]string{}
	return func(name, k string) {
		t.Helper()
		if prev, ok := seen[k]; ok {
			t.Errorf("%s collides with %s", name, prev)
		}
		seen[k] = name
	}
}

func TestKeySeparatesDomainsAndKeys(t *testing.T) {
	h1, _ := New([]byte("key-one"))
	h2, _ := New([]byte("key-two"))
	add := distinct(t)
	for _, kind := range []string{"ip", "email", "tenant", "header", "global"} {
		add("h1 "+kind, h1.Key(kind, "acme"))
		add("h2 "+kind, h2.Key(kind, "acme"))
	}
	// The separator makes ("email", "x") and a kind/value split elsewhere
	// distinct even when the concatenations would otherwise agree.
	add("tenant/emailx", h1.Key("tenant", "emailx"))
}

// TestJWTKey: a claim's key is Key under JWTDomain, and the kind, the
// issuer and the claim all separate keys: a sub of "1.2.3.4" is not the
// IP 1.2.3.4, and no issuer and claim split differently collide.
func TestJWTKey(t *testing.T) {
	key := []byte("test-key")
	h, _ := New(key)
	for _, tt := range []struct{ issuer, claim, value, domain string }{
		{"", "sub", "user-1", "jwt:0::sub"},
		{"https://issuer.example/", "sub", "user-1", "jwt:23:https://issuer.example/:sub"},
		{"a:b", "c", "v", "jwt:3:a:b:c"},
		{"https://x.supabase.co/auth/v1", "app_metadata.tenant_id", "42", "jwt:29:https://x.supabase.co/auth/v1:app_metadata.tenant_id"},
	} {
		if got := JWTDomain(tt.issuer, tt.claim); got != tt.domain {
			t.Errorf("JWTDomain(%q, %q) = %q, want %q", tt.issuer, tt.claim, got, tt.domain)
		}
		m := hmac.New(sha256.New, key)
		m.Write([]byte(tt.domain + "\x00" + tt.value))
		want := base64.RawURLEncoding.EncodeToString(m.Sum(nil))
		for range 2 { // twice, so that a pooled state that was not reset would show
			if got := h.JWTKey(tt.issuer, tt.claim, tt.value); got != want {
				t.Errorf("JWTKey(%q, %q, %q) = %q, want %q", tt.issuer, tt.claim, tt.value, got, want)
			}
		}
		if got := h.Key(tt.domain, tt.value); got != want {
			t.Errorf("Key(%q, %q) = %q, want JWTKey's %q", tt.domain, tt.value, got, want)
		}
	}

	add := distinct(t)
	for _, kind := range []string{"ip", "email", "tenant", "header", "global"} {
		add(kind+" 1.2.3.4", h.Key(kind, "1.2.3.4"))
	}
	for _, p := range [][2]string{
		{"", "sub"}, {"iss", "sub"}, {"iss:", "sub"}, {"iss", ":sub"}, {"a:b", "c"}, {"a", "b:c"},
		{"", "ip"}, {"jwt", "sub"}, {"1", "sub"}, {"", "1:sub"}, {"iss", "tenant"},
	} {
		add("jwt "+p[0]+" "+p[1]+" 1.2.3.4", h.JWTKey(p[0], p[1], "1.2.3.4"))
	}
}

func TestKeyConcurrent(t *testing.T) {
	h, _ := New([]byte("k"))
	want := h.Key("email", "a@example.com")
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if got := h.Key("email", "a@example.com"); got != want {
					t.Errorf("concurrent Key = %q, want %q", got, want)
					return
				}
				h.Key("ip", strings.Repeat("y", i))
			}
		}()
	}
	wg.Wait()
}

func TestIPGroup(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"192.0.2.1", "192.0.2.1"},
		{"::ffff:192.0.2.1", "192.0.2.1"},
		{"0.0.0.0", "0.0.0.0"},
		{"2001:db8:1:2::1", "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"},
		{"2001:db8:1:3::1", "2001:db8:1:3::/64"},
		{"fe80::1%eth0", "fe80::/64"},
		{"::1", "::/64"},
		{"::", "::/64"},
	}
	for _, tt := range tests {
		got := IPGroup(netip.MustParseAddr(tt.in))
		if got != tt.want {
			t.Errorf("IPGroup(%s) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := IPGroup(netip.Addr{}); got != "" {
		t.Errorf("IPGroup(zero) = %q, want empty", got)
	}
}

func TestIPGroupSameSlash64(t *testing.T) {
	base := netip.MustParseAddr("2001:db8:aa:bb::").As16()
	want := IPGroup(netip.AddrFrom16(base))
	for i := 0; i < 256; i++ {
		a := base
		for j := 8; j < 16; j++ {
			a[j] = byte(i * (j + 7))
		}
		if got := IPGroup(netip.AddrFrom16(a)); got != want {
			t.Fatalf("IPGroup(%v) = %q, want %q", netip.AddrFrom16(a), got, want)
		}
	}
	other := base
	other[7] ^= 1
	if IPGroup(netip.AddrFrom16(other)) == want {
		t.Errorf("neighbouring /64 %v shares group %q", netip.AddrFrom16(other), want)
	}
}

func TestCanonicalEmail(t *testing.T) {
	const victim = "victim@example.com"
	tests := []struct {
		in   string
		want string
	}{
		{"Victim@Example.com", victim},
		{" victim@example.com ", victim},
		{"ｖｉｃｔｉｍ＠ｅｘａｍｐｌｅ．ｃｏｍ", victim},
		{"ＶＩＣＴＩＭ＠ＥＸＡＭＰＬＥ．ＣＯＭ", victim},
		{"VICTIM@EXAMPLE.COM", victim},
		{"\u00a0victim@example.com\t", victim},
		{"\t\u00a0 Victim@Example.com\u00a0\n", victim},
		{"\u3000victim@example.com\u2003", victim},
		{"\u200a\u00a0ＶICTIM@example.com\u0085", victim},
		{"\r\n\v\f\u1680\u2028\u2029\u202f\u205f" + victim + "\u0085\u2000\u200a", victim}, // every kind of White_Space
		{"victim@example.com", victim},
		// Aliases the upstream may keep apart are kept apart.
		{"Victim+promo@Example.com", "victim+promo@example.com"},
		{"v.i.c.t.i.m@gmail.com", "v.i.c.t.i.m@gmail.com"},
		// Inner whitespace is not ours to remove.
		{"vic tim@example.com", "vic tim@example.com"},
		{"vic\u00a0tim@example.com", "vic tim@example.com"}, // but NFKC makes NBSP a space
		// Kelvin sign and long s: NFKC / lower-casing fold them.
		{"\u212Aate@example.com", "kate@example.com"},
		{"ſam@example.com", "sam@example.com"}, // long s has a compatibility mapping to s
		{"ÉLODIE@example.com", "élodie@example.com"},
		// Letters that share an upper case are one letter, as in a
		// comparison that ignores case: final, lunate and plain sigma,
		// dotless and dotted i.
		{"ΟΔΥΣΣΕΥΣ@example.com", "οδυσσευσ@example.com"},
		{"οδυσσευς@example.com", "οδυσσευσ@example.com"},
		{"\u03f9@example.com", "σ@example.com"},
		{"\u03f2@example.com", "σ@example.com"},
		{"v\u0131ctim@example.com", victim},
		{"\u0130stanbul@example.com", "istanbul@example.com"},
		{"i\u0307stanbul@example.com", "istanbul@example.com"}, // İ lowered as Java does
		{"\u0130\u0330@example.com", "\u1e2d@example.com"},     // İ with a tilde below: ḭ
		{"E\u0301lodie@example.com", "élodie@example.com"},     // decomposed → composed
		{"\u00b4x@example.com", "\u0301x@example.com"},         // NFKC yields a leading space, then trimmed
		{"", ""},
		{" \t ", ""},
		{"\u00a0\u3000", ""},
	}
	for _, tt := range tests {
		got, err := CanonicalEmail(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("CanonicalEmail(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
		if again, err := CanonicalEmail(got); again != got || err != nil {
			t.Errorf("CanonicalEmail not stable on %q: %q then %q, %v", tt.in, got, again, err)
		}
	}
}

// TestCanonicalRefusals: every value that an upstream's trimming or
// decoding would turn back into the plain address is refused, at the ends
// and inside, by CanonicalEmail and CanonicalText alike.
func TestCanonicalRefusals(t *testing.T) {
	const victim = "victim@example.com"
	tests := []struct {
		name string
		in   string
		want error
	}{
		{"NUL before", "\x00" + victim, ErrControl},
		{"SOH before (Java trim)", "\x01" + victim, ErrControl},
		{"file separator after (Python strip)", victim + "\x1c", ErrControl},
		{"unit separator inside", "victim\x1f@example.com", ErrControl},
		{"DEL", victim + "\x7f", ErrControl},
		{"escape", "\x1b" + victim, ErrControl},
		{"tab inside", "victim\t@example.com", ErrControl},
		{"line feed inside", "victim@exa\nmple.com", ErrControl},
		{"C1 control", "\u0080" + victim, ErrControl},
		{"NEL inside", "victim\u0085@example.com", ErrControl},
		{"C1 last", victim + "\u009f", ErrControl},
		{"BOM before (JavaScript trim)", "\ufeff" + victim, ErrInvisible},
		{"BOM after", victim + "\ufeff", ErrInvisible},
		{"zero width space", "vic\u200btim@example.com", ErrInvisible},
		{"zero width space at the end", victim + "\u200b", ErrInvisible},
		{"zero width joiner", "victim\u200d@example.com", ErrInvisible},
		{"zero width non-joiner", "\u200c" + victim, ErrInvisible},
		{"word joiner", victim + "\u2060", ErrInvisible},
		{"soft hyphen", "vic\u00adtim@example.com", ErrInvisible},
		{"left-to-right mark", "\u200e" + victim, ErrInvisible},
		{"right-to-left override", victim + "\u202e", ErrInvisible},
		{"Mongolian vowel separator", "\u180e" + victim, ErrInvisible},
		{"Arabic letter mark", victim + "\u061c", ErrInvisible},
		{"tag character", victim + "\U000E0041", ErrInvisible},
		{"only a zero width space", "\u200b", ErrInvisible},
		{"invalid byte", "victim\xff@example.com", ErrInvalidUTF8},
		{"invalid byte at the end", victim + "\xc3", ErrInvalidUTF8},
		{"encoded surrogate", "\xed\xa0\x80" + victim, ErrInvalidUTF8},
	}
	for _, tt := range tests {
		if got, err := CanonicalEmail(tt.in); err != tt.want || got != "" {
			t.Errorf("%s: CanonicalEmail(%q) = %q, %v; want %v", tt.name, tt.in, got, err, tt.want)
		}
		if got, err := CanonicalText(tt.in); err != tt.want || got != "" {
			t.Errorf("%s: CanonicalText(%q) = %q, %v; want %v", tt.name, tt.in, got, err, tt.want)
		}
	}
}

func TestCanonicalText(t *testing.T) {
	tests := []struct{ in, want string }{
		{"acme", "acme"},
		{"  Acme\t", "Acme"},                   // case is kept
		{"\u00a0Acme Corp\u3000", "Acme Corp"}, // Unicode White_Space at the ends only
		{"ＡＣＭＥ", "ＡＣＭＥ"},                       // no NFKC: a tenant id is an opaque token
		{"", ""},
		{" \u2003 ", ""},
	}
	for _, tt := range tests {
		if got, err := CanonicalText(tt.in); got != tt.want || err != nil {
			t.Errorf("CanonicalText(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func FuzzCanonicalEmail(f *testing.F) {
	for _, s := range []string{
		"Victim@Example.com", " victim@example.com ", "ｖｉｃｔｉｍ＠ｅｘａｍｐｌｅ．ｃｏｍ",
		"\u00a0victim@example.com\t", "\u00b4x", "x\u00a8", "\u212A", "ſ", "İstanbul@example.com",
		"ß@example.com", "\u1e9e", "\ufb03", "a\xff", "\u0345\u0399", "\u3000", "", "\ufeffa", "a\x01",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := CanonicalEmail(s)
		if err != nil {
			if c != "" || (err != ErrInvalidUTF8 && err != ErrControl && err != ErrInvisible) {
				t.Fatalf("CanonicalEmail(%q) = %q, %v", s, c, err)
			}
			// A refused value is refused whatever case or padding it has.
			if _, err2 := CanonicalEmail(" " + asciiUpper(s) + "\u00a0"); err2 == nil {
				t.Fatalf("CanonicalEmail(%q) is refused (%v) but its padded upper-case spelling is not", s, err)
			}
			return
		}
		if c2, err := CanonicalEmail(c); c2 != c || err != nil {
			t.Fatalf("not stable: %q -> %q -> %q, %v", s, c, c2, err)
		}
		if strings.TrimSpace(c) != c {
			t.Fatalf("%q -> %q has surrounding whitespace", s, c)
		}
		// Spellings that an upstream reads as the same address share the
		// canonical form: other case, padding with White_Space, and the
		// NFKC and NFD forms. (Upper-casing the raw value with Unicode is
		// not one of them: U+0345, a combining mark, upper-cases to U+0399,
		// a letter, so the marks around it no longer reorder as they did;
		// "\u0345\u0359" and its canonical equivalent "\u0359\u0345"
		// upper-case to two different strings.)
		for _, v := range []string{asciiUpper(s), strings.ToLower(s), "\t\u3000" + s + " \u00a0\n", norm.NFKC.String(s), norm.NFD.String(s)} {
			if cv, err := CanonicalEmail(v); err == nil && cv != c {
				t.Fatalf("CanonicalEmail(%q) = %q but CanonicalEmail(%q) = %q", s, c, v, cv)
			}
		}
	})
}

// asciiUpper upper-cases the ASCII letters of s and leaves every other
// byte alone, invalid UTF-8 included.
func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - ('a' - 'A')
		}
	}
	return string(b)
}

func BenchmarkKey(b *testing.B) {
	h, _ := New([]byte("0123456789abcdef0123456789abcdef"))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = h.Key("email", "victim@example.com")
		}
	})
}

func BenchmarkIPGroup(b *testing.B) {
	v4 := netip.MustParseAddr("192.0.2.1")
	v6 := netip.MustParseAddr("2001:db8:1:2:3:4:5:6")
	b.ReportAllocs()
	for b.Loop() {
		_ = IPGroup(v4)
		_ = IPGroup(v6)
	}
}

func BenchmarkCanonicalEmail(b *testing.B) {
	for _, in := range []string{" Victim@Example.com ", "ｖｉｃｔｉｍ＠ｅｘａｍｐｌｅ．ｃｏｍ"} {
		b.Run(in, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = CanonicalEmail(in)
			}
		})
	}
}

// TestCanonicalEmailStableEveryRune checks stability exhaustively for every
// code point alone and between letters, where the fuzzer would only sample.
func TestCanonicalEmailStableEveryRune(t *testing.T) {
	if testing.Short() {
		t.Skip("exhaustive")
	}
	for r := rune(0); r <= 0x10FFFF; r++ {
		if r >= 0xD800 && r <= 0xDFFF {
			continue
		}
		for _, s := range []string{string(r), " " + string(r) + "A", "A" + string(r) + " "} {
			c, err := CanonicalEmail(s)
			if err != nil {
				continue
			}
			if c2, err := CanonicalEmail(c); c2 != c || err != nil {
				t.Fatalf("not stable for %U in %q: %q then %q, %v", r, s, c, c2, err)
			}
		}
	}
}

// TestJoinValues: distinct lists of values never encode alike, whatever
// separators or digits they hold.
func TestJoinValues(t *testing.T) {
	lists := [][]string{
		nil, {""}, {"", ""}, {"a"}, {"a", "b"}, {"a,b"}, {"ab"}, {"a", ""}, {"", "a"},
		{"1:a"}, {"1", "a"}, {"1:a", ""}, {"a\x00b"}, {"a", "\x00b"}, {"10.0.0.1"}, {"login", "10.0.0.1"},
	}
	seen := map[string][]string{}
	for _, l := range lists {
		j := JoinValues(l)
		if prev, dup := seen[j]; dup {
			t.Errorf("JoinValues(%q) = JoinValues(%q) = %q", l, prev, j)
		}
		seen[j] = l
	}
	if got := JoinValues([]string{"login", "10.0.0.1"}); got != "5:login8:10.0.0.1" {
		t.Errorf("JoinValues = %q", got)
	}
}
