// Package hostload reads the machine's load average, which every benchmark prints beside its
// figures (docs/benchmarks.md): on a shared 2-core machine a figure without it cannot be
// compared with another run's.
package hostload

import (
	"os"
	"strings"
)

// Average is /proc/loadavg's 1, 5 and 15 minute figures, "?" where it cannot be read.
func Average() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// Label is Average as "load 1 5 15", the form the benchmarks' log lines use.
func Label() string {
	return "load " + Average()
}
