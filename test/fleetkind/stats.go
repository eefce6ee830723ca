// Package fleetkind measures a fleet of Agents on the installed product on a kind cluster: the
// quickstart (operator pod, conversation service, Mosquitto pod with the decision-table plugin,
// or dynsec) from the release images, Agents applied until Ready, what the broker, operator and
// API server spend per Agent (their containers' cgroups, read on the kind node) and where all of
// the node's CPU goes (every cgroup of the node), the broker's cost per change, a broker pod
// deleted (then deleted with its volume: an empty disk) under 1 000 connected clients, and request
// latency at fleet size. BenchmarkFleetOnKind runs it (make bench-fleet-kind, docs/benchmarks.md); the
// parts that need no cluster are unit-tested.
package fleetkind

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
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

// cgroupTreeScript prints "PATH USAGE_USEC" for every cgroup of the kind node's unified (v2)
// hierarchy, the path relative to the node's root ("." is the root: every process of the node).
// On a hybrid cgroup v1 host the unified hierarchy is mounted at /sys/fs/cgroup/unified and
// carries cpu.stat for every cgroup (systemd's services too, which the v1 cpuacct tree does not
// separate), so one read attributes the node's CPU to every pod's container and system service.
const cgroupTreeScript = `set -u
base=/sys/fs/cgroup/unified
[ -f "$base/cpu.stat" ] || base=/sys/fs/cgroup
cd "$base" && find . -name cpu.stat -exec awk '$1 == "usage_usec" {f = FILENAME; sub(/\/cpu\.stat$/, "", f); print f, $2}' {} +`

// CgroupTree is the cumulative CPU of each cgroup of the node by path ("." the root).
type CgroupTree map[string]time.Duration

// ParseCgroupTree reads cgroupTreeScript's lines; the root must be among them.
func ParseCgroupTree(out string) (CgroupTree, error) {
	tree := CgroupTree{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("cgroup tree line %q: want PATH USAGE_USEC", sc.Text())
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("cgroup tree line %q: %w", sc.Text(), err)
		}
		tree[f[0]] = time.Duration(v) * time.Microsecond
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if _, ok := tree["."]; !ok {
		return nil, fmt.Errorf("cgroup tree without its root (%d cgroups)", len(tree))
	}
	return tree, nil
}

// ReadTree reads the CPU of every cgroup of the node.
func (n Node) ReadTree(ctx context.Context) (CgroupTree, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.Docker, "exec", n.Name, "sh", "-c", cgroupTreeScript)
	cmd.Env = os.Environ()
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("docker exec %s (cgroup tree): %w", n.Name, err)
	}
	return ParseCgroupTree(string(out))
}

// leaves are the cgroups of t without a child cgroup in t: the ones that hold processes (cgroup v2
// puts processes in leaves only, the root apart).
func (t CgroupTree) leaves() []string {
	parent := map[string]bool{}
	for p := range t {
		if p == "." {
			continue
		}
		if i := strings.LastIndexByte(p, '/'); i >= 0 {
			for q := p[:i]; ; {
				parent[q] = true
				j := strings.LastIndexByte(q, '/')
				if j < 0 {
					break
				}
				q = q[:j]
			}
		}
	}
	var out []string
	for p := range t {
		if p != "." && !parent[p] {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// containerIDInPath is the container ID a cgroup path names: systemd's cri-containerd-ID.scope
// or cgroupfs's .../ID, 64 hex digits either way.
var containerIDInPath = regexp.MustCompile(`([0-9a-f]{64})(\.scope)?$`)

// ContainerID returns the container ID in a cgroup path, "" when it names none.
func ContainerID(path string) string {
	m := containerIDInPath.FindStringSubmatch(path)
	if m == nil {
		return ""
	}
	return m[1]
}

// CPUShare is one line of the node's CPU attribution: a label's CPU over an interval.
type CPUShare struct {
	Label string
	CPU   time.Duration
}

// Unattributed is the label of the node's CPU that no leaf cgroup holds: processes in the node's
// root cgroup (docker exec, the benchmark's own reads) and the CPU of cgroups removed within the
// interval (exited containers).
const Unattributed = "(no leaf cgroup: node root, docker exec, exited containers)"

// Attribute splits the node's CPU between before and after over the leaf cgroups of after,
// labelled by label (leaves with one label are summed; a leaf new since before counts from 0),
// with the rest of the root's CPU as Unattributed; the shares add up to the root's CPU exactly.
// They are sorted by CPU, largest first.
func Attribute(before, after CgroupTree, label func(path string) string) (shares []CPUShare, total time.Duration) {
	total = after["."] - before["."]
	byLabel := map[string]time.Duration{}
	var sum time.Duration
	for _, leaf := range after.leaves() {
		d := after[leaf] - before[leaf]
		byLabel[label(leaf)] += d
		sum += d
	}
	byLabel[Unattributed] += total - sum
	for l, d := range byLabel {
		shares = append(shares, CPUShare{Label: l, CPU: d})
	}
	slices.SortFunc(shares, func(a, b CPUShare) int {
		return cmp.Or(cmp.Compare(b.CPU, a.CPU), strings.Compare(a.Label, b.Label))
	})
	return shares, total
}

// RateSummary is a counter's per-second rate over an interval sampled every second: the mean (all
// of its CPU over all of its time) and the median of the one-second rates (what it spends in a
// typical second, without a periodic burst such as Mosquitto's autosave).
type RateSummary struct {
	Mean, Median float64 // CPU-seconds per second
	Samples      int
}

// Rates summarises cumulative CPU samples taken at times at.
func Rates(cpu []time.Duration, at []time.Time) RateSummary {
	if len(cpu) < 2 || len(cpu) != len(at) {
		return RateSummary{}
	}
	var each []float64
	for i := 1; i < len(cpu); i++ {
		if dt := at[i].Sub(at[i-1]).Seconds(); dt > 0 {
			each = append(each, (cpu[i]-cpu[i-1]).Seconds()/dt)
		}
	}
	slices.Sort(each)
	mean := (cpu[len(cpu)-1] - cpu[0]).Seconds() / at[len(at)-1].Sub(at[0]).Seconds()
	median := each[len(each)/2]
	if len(each)%2 == 0 {
		median = (each[len(each)/2-1] + each[len(each)/2]) / 2
	}
	return RateSummary{Mean: mean, Median: median, Samples: len(each)}
}

// HostPID is the host's pid of a container's first process (the lowest pid whose cgroup names the
// container ID): a kind node's processes are the host's, so perf on the host can record them.
func HostPID(containerID string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("host pid of container %s: %w", containerID, err)
	}
	best := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile("/proc/" + e.Name() + "/cgroup")
		if err != nil || !strings.Contains(string(cg), containerID) {
			continue
		}
		if best == 0 || pid < best {
			best = pid
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("no host process in container %s", containerID)
	}
	return best, nil
}
