//go:build unix

package pgtest

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that records Fatalf and Skipf instead of
// stopping the test.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                        {}
func (r *recorder) Fatalf(format string, a ...any) { r.fatal = fmt.Sprintf(format, a...) }
func (r *recorder) Skipf(format string, a ...any)  { r.skip = fmt.Sprintf(format, a...) }

// TestToolMissing: a missing program skips a fault test locally and fails
// it under CI, never passing silently.
func TestToolMissing(t *testing.T) {
	const name = "sluice-no-such-program"
	t.Setenv("CI", "")
	r := &recorder{TB: t}
	if p := Tool(r, name); p != "" || r.fatal != "" || !strings.Contains(r.skip, name+" not found") {
		t.Errorf("without CI: path %q, fatal %q, skip %q; want a skip naming the program", p, r.fatal, r.skip)
	}
	t.Setenv("CI", "true")
	r = &recorder{TB: t}
	if p := Tool(r, name); p != "" || r.skip != "" || !strings.Contains(r.fatal, "CI is set") {
		t.Errorf("with CI: path %q, fatal %q, skip %q; want a failure", p, r.fatal, r.skip)
	}
}

func TestToolFound(t *testing.T) {
	if p := Tool(t, "sh"); !strings.HasSuffix(p, "/sh") {
		t.Errorf("Tool(sh) = %q", p)
	}
}
