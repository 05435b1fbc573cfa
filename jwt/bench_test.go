package jwt

import "testing"

// BenchmarkVerify measures one verification of a token of each kind: a
// token seen before (remembered by the cache), and a new one each time
// (the cache off).
func BenchmarkVerify(b *testing.B) {
	m := mintAll(b)
	for _, cache := range []struct {
		name string
		size int
	}{{"seen", 0}, {"new", Off}} {
		v, _ := served(b, m, newClock(), Config{Secret: []byte(secret), CacheSize: cache.size}, issuerKeys...)
		for _, name := range []string{"HS256", "RS256", "ES256", "EdDSA"} {
			b.Run(cache.name+"/"+name, func(b *testing.B) {
				tok := m.Token(b, name)
				b.ReportAllocs()
				for b.Loop() {
					if _, res := v.Verify(tok); res != Valid {
						b.Fatal(res)
					}
				}
			})
		}
	}
}
