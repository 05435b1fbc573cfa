package proctest

import (
	"encoding/json"
	"strings"
	"time"
)

// LoggedAddr waits up to limit for a JSON log line in out, a sluice
// child's output, that has field (admin_listen, listen, check_listen or
// rls_listen), and returns its value: the address the listener took. A
// child given 127.0.0.1:0 binds a port the kernel chooses, which nothing
// else can hold, where a port picked before the child starts may be
// taken by then; sluice logs "admin listener open" as soon as the admin
// listener accepts, and the others with "sluice started".
//
// It returns "" if exited (which may be nil) is closed or limit passes
// first. The output is another process's: it is read every 10 ms.
func LoggedAddr(out *Buffer, field string, exited <-chan struct{}, limit time.Duration) string {
	deadline := time.After(limit)
	for {
		for line := range strings.Lines(out.String()) {
			if !strings.Contains(line, `"`+field+`"`) {
				continue
			}
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil {
				continue
			}
			if a, ok := m[field].(string); ok && a != "" {
				return a
			}
		}
		select {
		case <-exited:
			return ""
		case <-deadline:
			return ""
		case <-time.After(10 * time.Millisecond):
		}
	}
}
