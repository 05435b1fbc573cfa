package jwt

import "testing"

// BenchmarkVerify measures one verification of a token of each kind.
func BenchmarkVerify(b *testing.B) {
	m := mintAll(b)
	v, _ := served(b, m, newClock(), Config{Secret: []byte(secret)}, issuerKeys...)
	for _, name := range []string{"HS256", "RS256", "ES256", "EdDSA"} {
		b.Run(name, func(b *testing.B) {
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
