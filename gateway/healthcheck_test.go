package gateway

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

func TestHealthcheck(t *testing.T) {
	g := start(t, base())
	addr := strings.TrimPrefix(g.admin, "http://")
	_, port, _ := net.SplitHostPort(addr)

	unhealthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer unhealthy.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()

	for _, tc := range []struct {
		listen string
		ok     bool
		errMsg string
	}{
		{addr, true, ""},
		{":" + port, true, ""},        // all interfaces: probed on loopback
		{"0.0.0.0:" + port, true, ""}, // likewise
		{"[::]:" + port, true, ""},    // likewise
		{strings.TrimPrefix(unhealthy.URL, "http://"), false, "503 Service Unavailable"},
		{closedAddr, false, "connection refused"},
		{"nonsense", false, "SLUICE_ADMIN_LISTEN: expected host:port"},
	} {
		var out bytes.Buffer
		// Only SLUICE_ADMIN_LISTEN: the probe needs no other setting.
		err := Healthcheck(context.Background(), map[string]string{"SLUICE_ADMIN_LISTEN": tc.listen}, &out)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.listen, err)
		case tc.ok && !strings.Contains(out.String(), "200 OK"):
			t.Errorf("%s: printed %q", tc.listen, out.String())
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), tc.errMsg)):
			t.Errorf("%s: got %v, want an error containing %q", tc.listen, err, tc.errMsg)
		}
	}
}

// TestSubcommandSettings: the commands that read only some settings read
// them under the same names and with the same defaults as the gateway.
func TestSubcommandSettings(t *testing.T) {
	full := reflect.TypeFor[settings]()
	for _, sub := range []reflect.Type{reflect.TypeFor[healthcheckSettings](), reflect.TypeFor[migrateSettings]()} {
		for i := range sub.NumField() {
			f := sub.Field(i)
			g, ok := full.FieldByName(f.Name)
			if !ok {
				t.Errorf("%s.%s: no such field in settings", sub.Name(), f.Name)
				continue
			}
			for _, tag := range []string{"env", "envDefault"} {
				if f.Tag.Get(tag) != g.Tag.Get(tag) {
					t.Errorf("%s.%s: %s %q, settings has %q", sub.Name(), f.Name, tag, f.Tag.Get(tag), g.Tag.Get(tag))
				}
			}
		}
	}
}
