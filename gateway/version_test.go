package gateway

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// buildInfo is what a go1.99.1 build of sluice at module version records,
// with the VCS settings given as key, value, key, value…
func buildInfo(version string, vcs ...string) *debug.BuildInfo {
	bi := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "github.com/sluicehq/sluice", Version: version}}
	for i := 0; i+1 < len(vcs); i += 2 {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: vcs[i], Value: vcs[i+1]})
	}
	return bi
}

func TestBuildVersion(t *testing.T) {
	stamped := buildInfo("v1.2.3", "vcs", "git", "vcs.revision", "0123456789abcdef", "vcs.modified", "false")
	dirty := buildInfo("(devel)", "vcs.revision", "fedcba", "vcs.modified", "true")
	bare := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "(devel)"}}
	for _, tc := range []struct {
		name             string
		ldVersion, ldCom string
		bi               *debug.BuildInfo
		want             build
	}{
		{"link-time values win", "2.0.0", "abc", stamped, build{"2.0.0", "abc", "go1.99.1"}},
		{"toolchain stamps", "", "", stamped, build{"v1.2.3", "0123456789abcdef", "go1.99.1"}},
		{"uncommitted changes", "", "", dirty, build{"devel", "fedcba-dirty", "go1.99.1"}},
		{"nothing recorded", "", "", bare, build{"devel", "unknown", "go1.99.1"}},
		{"no build information", "", "", nil, build{"devel", "unknown", runtime.Version()}},
		{"version only at link time", "1.0.0", "", dirty, build{"1.0.0", "fedcba-dirty", "go1.99.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := buildVersion(tc.ldVersion, tc.ldCom, tc.bi); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	for _, stamp := range []Stamp{{}, {Version: "1.4.0", Commit: "abc"}} {
		var out bytes.Buffer
		// No settings at all: printing the version needs none.
		if err := Version(&out, stamp); err != nil {
			t.Fatalf("%+v: %v", stamp, err)
		}
		b := currentBuild(stamp)
		want := "sluice " + b.Version + ", commit " + b.Commit + ", " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
		if out.String() != want {
			t.Errorf("%+v printed %q, want %q", stamp, out.String(), want)
		}
		if stamp.Version != "" && !strings.HasPrefix(out.String(), "sluice 1.4.0, commit abc, ") {
			t.Errorf("%+v printed %q: the stamp is not shown", stamp, out.String())
		}
	}
}

// TestBuildInfoMetric: a running gateway exports sluice_build_info with
// the build's labels, its stamp's where it has one, and the value 1.
func TestBuildInfoMetric(t *testing.T) {
	for _, stamp := range []Stamp{{}, {Version: "1.4.0", Commit: "abc"}} {
		_, g := serveGateway(t, base(), Options{Stamp: stamp, Logger: zap.NewNop()})
		_, body := get(t, g.admin+"/metrics")
		b := currentBuild(stamp)
		want := `sluice_build_info{commit="` + b.Commit + `",goversion="` + b.GoVersion + `",version="` + b.Version + `"} 1`
		if !strings.Contains(body, want+"\n") {
			t.Fatalf("/metrics lacks %s", want)
		}
		if stamp.Version != "" && !strings.Contains(body, `commit="abc"`) {
			t.Fatalf("/metrics does not show the stamp %+v", stamp)
		}
	}
}
