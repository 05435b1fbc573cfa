//go:build !race

package hashing

import "testing"

// TestKeyAllocs: a key costs one allocation, its result, whatever its
// kind: JWTKey builds its domain in the pooled buffer. The race detector
// makes sync.Pool drop items on purpose, hence the build tag.
func TestKeyAllocs(t *testing.T) {
	h, _ := New([]byte("test-key"))
	if n := testing.AllocsPerRun(100, func() { h.Key("ip", "192.0.2.1") }); n > 1 {
		t.Errorf("Key allocates %v times, want only its result", n)
	}
	if n := testing.AllocsPerRun(100, func() { h.JWTKey("https://issuer.example/", "sub", "user-1") }); n > 1 {
		t.Errorf("JWTKey allocates %v times, want only its result", n)
	}
}
