//go:build mosquittoplugin

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"time"
)

// Profiles of the plugin's Go side, off unless asked for. Time the broker spends in its own C
// code shows as external code; `perf record -p <broker pid>` sees both sides.
//
//   - A2A_FLEET_TABLE_CPUPROFILE=path: a CPU profile from the moment the broker loads the
//     plugin, for A2A_FLEET_TABLE_CPUPROFILE_SECONDS (default 60), written to path.
//   - A2A_FLEET_TABLE_PROFILE_DIR=dir: profiles of a window a benchmark chooses: creating
//     dir/start starts a CPU profile, creating dir/stop ends it and writes dir/cpu-N.pprof,
//     dir/allocs-N.pprof (the allocations since the start: `go tool pprof -sample_index
//     alloc_space -base`) and dir/gc-N.txt (GC cycles and pause in the window); N counts
//     the windows from 1. The plugin looks for the files once a second.
func init() {
	if dir := os.Getenv("A2A_FLEET_TABLE_PROFILE_DIR"); dir != "" {
		go profileWindows(dir)
	}
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

// profileWindows serves A2A_FLEET_TABLE_PROFILE_DIR's start and stop files.
func profileWindows(dir string) {
	_ = os.MkdirAll(dir, 0o755)
	start, stop := filepath.Join(dir, "start"), filepath.Join(dir, "stop")
	var cpu *os.File
	var gcBefore runtime.MemStats
	n := 0
	for range time.Tick(time.Second) {
		if cpu == nil {
			if _, err := os.Stat(start); err != nil {
				continue
			}
			_ = os.Remove(start)
			n++
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("cpu-%d.pprof", n)))
			if err != nil {
				continue
			}
			writeProfile(filepath.Join(dir, fmt.Sprintf("allocs-%d-before.pprof", n)), "allocs")
			runtime.ReadMemStats(&gcBefore)
			if err := pprof.StartCPUProfile(f); err != nil {
				_ = f.Close()
				continue
			}
			cpu = f
			continue
		}
		if _, err := os.Stat(stop); err != nil {
			continue
		}
		_ = os.Remove(stop)
		pprof.StopCPUProfile()
		_ = cpu.Close()
		cpu = nil
		writeProfile(filepath.Join(dir, fmt.Sprintf("allocs-%d.pprof", n)), "allocs")
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("gc-%d.txt", n)), fmt.Appendf(nil,
			"gc cycles %d, pause %s, allocated %d B in %d objects, heap in use %d B, GOGC target next %d B, GOMAXPROCS %d\n",
			m.NumGC-gcBefore.NumGC, time.Duration(m.PauseTotalNs-gcBefore.PauseTotalNs), m.TotalAlloc-gcBefore.TotalAlloc,
			m.Mallocs-gcBefore.Mallocs, m.HeapInuse, m.NextGC, runtime.GOMAXPROCS(0)), 0o644)
	}
}

func writeProfile(path, name string) {
	f, err := os.Create(path)
	if err != nil {
		return
	}
	_ = pprof.Lookup(name).WriteTo(f, 0)
	_ = f.Close()
}
