// Package fleetkind measures a fleet of Agents on the installed product on a kind cluster: the
// quickstart (operator pod, conversation service, Mosquitto pod with the decision-table plugin,
// or dynsec) from the release images, Agents applied until Ready, what the broker, operator and
// API server spend per Agent (their containers' cgroups, read on the kind node), the broker's
// cost per change, a broker pod deleted under 1 000 connected clients, and request latency at
// fleet size. BenchmarkFleetOnKind runs it (make bench-fleet-kind, docs/benchmarks.md); the
// parts that need no cluster are unit-tested.
package fleetkind

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// cgroupScript prints, for each container ID given as an argument, "ID CPU_NS MEMORY_BYTES RSS_BYTES"
// from the container's cgroup on the node: cgroup v1 (cpuacct.usage, memory.usage_in_bytes,
// memory.stat total_rss) or v2 (cpu.stat usage_usec, memory.current, memory.stat anon). The
// cgroup path holds the container's ID under either cgroup driver (cgroupfs or systemd's
// cri-containerd-ID.scope), so a find by name locates it without asking the runtime. The ID
// "node" reads the root of the node's own hierarchy: every process of the kind node (kubelet,
// containerd, every pod).
const cgroupScript = `set -u
for id in "$@"; do
	if [ -d /sys/fs/cgroup/cpuacct ]; then
		if [ "$id" = node ]; then
			cpu_dir=/sys/fs/cgroup/cpuacct mem_dir=/sys/fs/cgroup/memory
		else
			cpu_dir=$(find /sys/fs/cgroup/cpuacct/ -type d -name "*$id*" 2>/dev/null | head -1)
			mem_dir=$(find /sys/fs/cgroup/memory/ -type d -name "*$id*" 2>/dev/null | head -1)
		fi
		[ -n "$cpu_dir" ] && [ -n "$mem_dir" ] || { echo "$id - - -"; continue; }
		cpu=$(cat "$cpu_dir/cpuacct.usage")
		mem=$(cat "$mem_dir/memory.usage_in_bytes")
		rss=$(awk '$1 == "total_rss" {print $2}' "$mem_dir/memory.stat")
	else
		dir=$(find /sys/fs/cgroup/ -type d -name "*$id*" 2>/dev/null | head -1)
		[ "$id" = node ] && dir=/sys/fs/cgroup
		[ -n "$dir" ] || { echo "$id - - -"; continue; }
		cpu=$(awk '$1 == "usage_usec" {print $2 "000"}' "$dir/cpu.stat")
		mem=$(cat "$dir/memory.current")
		rss=$(awk '$1 == "anon" {print $2}' "$dir/memory.stat")
	fi
	echo "$id $cpu $mem $rss"
done`

// Usage is a container's cgroup counters at one moment.
type Usage struct {
	CPU    time.Duration // cumulative CPU time of the container's processes
	Memory int64         // the cgroup's memory use (page cache included)
	RSS    int64         // its anonymous memory (the processes' heaps)
}

// ParseCgroupOutput reads cgroupScript's lines into a map by container ID; a container whose
// cgroup was not found is an error, as is a line that does not parse.
func ParseCgroupOutput(out string) (map[string]Usage, error) {
	usages := map[string]Usage{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 4 {
			return nil, fmt.Errorf("cgroup line %q: want ID CPU MEMORY RSS", sc.Text())
		}
		if f[1] == "-" {
			return nil, fmt.Errorf("container %s: no cgroup on the node", f[0])
		}
		var n [3]int64
		for i, s := range f[1:] {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("cgroup line %q: %w", sc.Text(), err)
			}
			n[i] = v
		}
		usages[f[0]] = Usage{CPU: time.Duration(n[0]), Memory: n[1], RSS: n[2]}
	}
	return usages, sc.Err()
}

// Node reads containers' cgroups on a kind node through `docker exec` (the node is a container
// of the project's dockerd; DOCKER_HOST as hack/kind/lib.sh sets it).
type Node struct {
	Docker string // the docker client
	Name   string // the node container, e.g. a2a-fleet-bench-control-plane
}

// Read returns the usage of each container ID.
func (n Node) Read(ctx context.Context, ids ...string) (map[string]Usage, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	args := append([]string{"exec", n.Name, "sh", "-c", cgroupScript, "cgroup"}, ids...)
	cmd := exec.CommandContext(ctx, n.Docker, args...)
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("docker exec %s (cgroups of %v): %w: %s", n.Name, ids, err, out)
	}
	return ParseCgroupOutput(string(out))
}

// Percentile is the q-quantile (0 < q <= 1) of sorted latencies, nearest rank.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Latencies summarises one series of request latencies.
type Latencies struct {
	N        int
	P50, P99 time.Duration
}

// Summarise sorts lat in place and returns its p50 and p99.
func Summarise(lat []time.Duration) Latencies {
	slices.Sort(lat)
	return Latencies{N: len(lat), P50: Percentile(lat, 0.50), P99: Percentile(lat, 0.99)}
}

// PerChange is the broker CPU one change costs: the CPU the broker spent over a batch of changes,
// less what it spends idle over the same time (idle measured just before), divided by the changes.
func PerChange(busy, idle time.Duration, busyFor, idleFor time.Duration, changes int) time.Duration {
	if changes <= 0 || idleFor <= 0 {
		return 0
	}
	idleShare := time.Duration(float64(idle) * float64(busyFor) / float64(idleFor))
	return max(busy-idleShare, 0) / time.Duration(changes)
}

// LoadAverage is /proc/loadavg's 1, 5 and 15 minute figures.
func LoadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
