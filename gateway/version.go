package gateway

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Stamp is what a release build sets at link time, in package main:
//
//	go build -ldflags "-X main.version=1.4.0 -X main.commit=$(git rev-parse HEAD)"
//
// main passes it on. An empty field comes from the build information the
// Go toolchain records in every binary (see buildVersion).
type Stamp struct {
	Version string
	Commit  string
}

// build identifies this binary: what `sluice version` prints and
// sluice_build_info carries.
type build struct {
	Version   string
	Commit    string
	GoVersion string
}

// currentBuild is the build of the running binary, stamped with s.
func currentBuild(s Stamp) build {
	bi, _ := debug.ReadBuildInfo()
	return buildVersion(s.Version, s.Commit, bi)
}

// buildVersion resolves the build from the link-time values and the
// toolchain's build information (nil when the binary has none):
//
//   - Version: ldVersion; else the main module's version as the toolchain
//     stamped it (a tag, a pseudo-version, or the version given to go
//     install); else "devel".
//   - Commit: ldCommit; else the vcs.revision the toolchain read from the
//     work tree, with "-dirty" when it had uncommitted changes; else
//     "unknown".
//   - GoVersion: the toolchain that built the binary.
func buildVersion(ldVersion, ldCommit string, bi *debug.BuildInfo) build {
	b := build{Version: ldVersion, Commit: ldCommit, GoVersion: runtime.Version()}
	if bi != nil {
		if b.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
		if b.Commit == "" {
			var revision, modified string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					revision = s.Value
				case "vcs.modified":
					modified = s.Value
				}
			}
			if revision != "" && modified == "true" {
				revision += "-dirty"
			}
			b.Commit = revision
		}
		if bi.GoVersion != "" {
			b.GoVersion = bi.GoVersion
		}
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

// Version is `sluice version` (also --version): it writes one line, the
// version, commit, Go version and platform of the binary stamped with s.
func Version(stdout io.Writer, s Stamp) error {
	b := currentBuild(s)
	_, err := fmt.Fprintf(stdout, "sluice %s, commit %s, %s %s/%s\n", b.Version, b.Commit, b.GoVersion, runtime.GOOS, runtime.GOARCH)
	return err
}

// buildInfoCollector is sluice_build_info{version,commit,goversion}, always
// 1: dashboards and alerts join on it to tell which build an instance
// runs, and count instances per version during a rollout.
func buildInfoCollector(s Stamp) prometheus.Collector {
	b := currentBuild(s)
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "sluice_build_info",
		Help:        "Build of the running sluice: version, commit and Go version in the labels; the value is always 1.",
		ConstLabels: prometheus.Labels{"version": b.Version, "commit": b.Commit, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}
