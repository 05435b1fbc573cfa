package proctest

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePort: ports come from below the kernel's ephemeral range, never
// twice, and can be bound.
func TestFreePort(t *testing.T) {
	lo, hi := portRange()
	if hi == 0 {
		t.Skip("no port range below the ephemeral one on this machine")
	}
	seen := map[int]bool{}
	for range 200 {
		p := FreePort(t)
		if p < lo || p >= hi {
			t.Fatalf("FreePort() = %d, want one in [%d, %d), below the ephemeral range", p, lo, hi)
		}
		if seen[p] {
			t.Fatalf("FreePort() returned %d twice", p)
		}
		seen[p] = true
	}
	for p := range seen {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d from FreePort cannot be bound: %v", p, err)
		}
		l.Close()
		break
	}
}
