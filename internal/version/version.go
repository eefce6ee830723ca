// Package version is the one place a binary's release version and source
// commit live: the Makefile and the Dockerfile stamp them with -ldflags -X
// from the repository's VERSION file and `git rev-parse HEAD`, and every
// binary prints them (--version, `a2actl version`) and exports them as the
// a2a_fleet_build_info metric.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Unknown is what a binary reports for a part that was not stamped: a build
// without the Makefile's ldflags, or from a clone without .git.
const Unknown = "unknown"

// Version and Commit are set at link time:
//
//	go build -ldflags "-X github.com/a2a-fleet/a2a-fleet/internal/version.Version=$(cat VERSION)
//	                   -X github.com/a2a-fleet/a2a-fleet/internal/version.Commit=$(git rev-parse HEAD)"
//
// They are variables only because -X can set nothing else; nothing assigns
// them at run time (read them through Get).
var (
	Version = Unknown
	Commit  = ""
)

// Info is what a binary reports about its build.
type Info struct {
	Version   string
	Commit    string
	GoVersion string
}

// Get returns the stamped build. A binary linked without a commit (go build
// outside make) falls back to the VCS revision the Go toolchain records when
// it builds inside a git checkout, and else says Unknown.
func Get() Info {
	commit := Commit
	if commit == "" {
		commit = vcsRevision()
	}
	if commit == "" {
		commit = Unknown
	}
	return Info{Version: Version, Commit: commit, GoVersion: runtime.Version()}
}

func vcsRevision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}

// String is the line every binary prints for --version (and a2actl for
// `a2actl version`): "PROGRAM VERSION (commit COMMIT, GOVERSION)".
func (i Info) String(program string) string {
	return fmt.Sprintf("%s %s (commit %s, %s)", program, i.Version, i.Commit, i.GoVersion)
}

// BuildInfoMetric is the name of the gauge NewCollector exports.
const BuildInfoMetric = "a2a_fleet_build_info"

// NewCollector returns a collector of one gauge, always 1, whose labels say
// which build runs: a2a_fleet_build_info{version,commit,goversion}. Joined on
// the instance, it tells a dashboard or an alert which release each pod runs.
func NewCollector() prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: BuildInfoMetric,
		Help: "A metric with a constant value 1, labelled by the a2a-fleet release (VERSION), the source commit and the Go version the binary was built with.",
		ConstLabels: prometheus.Labels{
			"version": i.Version, "commit": i.Commit, "goversion": i.GoVersion,
		},
	})
	g.Set(1)
	return g
}
