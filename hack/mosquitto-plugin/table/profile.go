//go:build mosquittoplugin

package main

import (
	"os"
	"runtime/pprof"
	"strconv"
	"time"
)

// A CPU profile of the plugin's Go side, off unless asked for: with
// A2A_FLEET_TABLE_CPUPROFILE=path the plugin profiles itself from the moment the broker loads
// it for A2A_FLEET_TABLE_CPUPROFILE_SECONDS (default 60) and writes the profile to path
// (`go tool pprof path`). Time the broker spends in its own C code shows as external code;
// `perf record -p <broker pid>` sees both sides.
func init() {
	path := os.Getenv("A2A_FLEET_TABLE_CPUPROFILE")
	if path == "" {
		return
	}
	seconds, err := strconv.Atoi(os.Getenv("A2A_FLEET_TABLE_CPUPROFILE_SECONDS"))
	if err != nil || seconds <= 0 {
		seconds = 60
	}
	f, err := os.Create(path)
	if err != nil {
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return
	}
	time.AfterFunc(time.Duration(seconds)*time.Second, func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	})
}
