package fleetkind

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseCgroupOutput(t *testing.T) {
	got, err := ParseCgroupOutput("abc 1500000 4096 2048\ndef 7 8 9\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Usage{CPU: 1500 * time.Microsecond, Memory: 4096, RSS: 2048}); got["abc"] != want {
		t.Fatalf("abc: got %+v, want %+v", got["abc"], want)
	}
	if len(got) != 2 || got["def"].RSS != 9 {
		t.Fatalf("got %+v", got)
	}
	if _, err := ParseCgroupOutput("abc - - -\n"); err == nil || !strings.Contains(err.Error(), "no cgroup") {
		t.Fatalf("a container without a cgroup: want an error, got %v", err)
	}
	if _, err := ParseCgroupOutput("abc 1 2\n"); err == nil {
		t.Fatal("a short line: want an error")
	}
}

// The script the benchmark runs on the kind node, run here on a fake cgroup v1 tree and a fake
// v2 tree (the test rewrites the script's /sys/fs/cgroup/ to a temporary folder).
func TestCgroupScriptReadsV1AndV2(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Fatal("sh is needed")
	}
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(root string) map[string]Usage {
		t.Helper()
		script := strings.ReplaceAll(cgroupScript, "/sys/fs/cgroup", root)
		out, err := exec.CommandContext(context.Background(), "sh", "-c", script, "cgroup", "c0ffee", "node").CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		got, err := ParseCgroupOutput(string(out))
		if err != nil {
			t.Fatalf("%v (%s)", err, out)
		}
		return got
	}
	v1 := t.TempDir()
	write(v1+"/cpuacct/kubelet/kubepods/pod1/cri-containerd-c0ffee.scope/cpuacct.usage", "123456789\n")
	write(v1+"/memory/kubelet/kubepods/pod1/cri-containerd-c0ffee.scope/memory.usage_in_bytes", "1048576\n")
	write(v1+"/memory/kubelet/kubepods/pod1/cri-containerd-c0ffee.scope/memory.stat", "cache 10\nrss 20\ntotal_cache 30\ntotal_rss 524288\n")
	write(v1+"/cpuacct/cpuacct.usage", "999000000000\n")
	write(v1+"/memory/memory.usage_in_bytes", "4194304\n")
	write(v1+"/memory/memory.stat", "total_rss 2097152\n")
	got := run(v1)
	if want := (Usage{CPU: 123456789, Memory: 1048576, RSS: 524288}); got["c0ffee"] != want {
		t.Fatalf("cgroup v1: got %+v, want %+v", got["c0ffee"], want)
	}
	if want := (Usage{CPU: 999 * time.Second, Memory: 4194304, RSS: 2097152}); got["node"] != want {
		t.Fatalf("cgroup v1, the node's root: got %+v, want %+v", got["node"], want)
	}
	v2 := t.TempDir()
	write(v2+"/kubepods.slice/pod1/cri-containerd-c0ffee.scope/cpu.stat", "usage_usec 2500\nuser_usec 2000\n")
	write(v2+"/kubepods.slice/pod1/cri-containerd-c0ffee.scope/memory.current", "2097152\n")
	write(v2+"/kubepods.slice/pod1/cri-containerd-c0ffee.scope/memory.stat", "anon 1048576\nfile 5\n")
	write(v2+"/cpu.stat", "usage_usec 7000000\n")
	write(v2+"/memory.current", "8388608\n")
	write(v2+"/memory.stat", "anon 4194304\n")
	got = run(v2)
	if want := (Usage{CPU: 2500 * time.Microsecond, Memory: 2097152, RSS: 1048576}); got["c0ffee"] != want {
		t.Fatalf("cgroup v2: got %+v, want %+v", got["c0ffee"], want)
	}
	if want := (Usage{CPU: 7 * time.Second, Memory: 8388608, RSS: 4194304}); got["node"] != want {
		t.Fatalf("cgroup v2, the node's root: got %+v, want %+v", got["node"], want)
	}
}

func TestPercentileAndPerChange(t *testing.T) {
	lat := make([]time.Duration, 0, 100)
	for i := 100; i >= 1; i-- {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	s := Summarise(lat)
	if s.N != 100 || s.P50 != 50*time.Millisecond || s.P99 != 99*time.Millisecond {
		t.Fatalf("got %+v, want p50 50 ms and p99 99 ms of 1..100 ms", s)
	}
	if got := Percentile(nil, 0.5); got != 0 {
		t.Fatalf("empty: %v", got)
	}
	// 20 changes over 4 s took 600 ms of CPU; idle was 100 ms over 10 s: 40 ms of the 600 is idle.
	if got, want := PerChange(600*time.Millisecond, 100*time.Millisecond, 4*time.Second, 10*time.Second, 20), 28*time.Millisecond; got != want {
		t.Fatalf("PerChange: got %v, want %v", got, want)
	}
	if got := PerChange(time.Millisecond, time.Second, time.Second, time.Second, 5); got != 0 {
		t.Fatalf("PerChange below idle: got %v, want 0", got)
	}
}

// The node's CPU split over its leaf cgroups adds up to the root's: parents are not counted twice,
// leaves with one label are summed, a leaf new since the first read counts from zero, and what no
// leaf holds is Unattributed.
func TestAttributeAddsUpToTheNode(t *testing.T) {
	id := func(c byte) string { return strings.Repeat(string(c), 64) }
	out := func(root, kubelet, a1, a2, b int) string {
		return fmt.Sprintf(". %d\n./kubelet.slice %d\n./kubelet.slice/kubelet.service %d\n"+
			"./kubelet.slice/kubepods/pod1/cri-containerd-%s.scope %d\n./kubelet.slice/kubepods/pod2/cri-containerd-%s.scope %d\n"+
			"./kubelet.slice/kubepods %d\n./kubelet.slice/kubepods/pod1 %d\n./kubelet.slice/kubepods/pod2 %d\n./kubelet.slice/kubepods/pod3/%s %d\n",
			root, kubelet+a1+a2+b, kubelet, id('a'), a1, id('c'), a2, a1+a2+b, a1, a2, id('b'), b)
	}
	before, err := ParseCgroupTree(out(1000, 100, 200, 300, 0))
	if err != nil {
		t.Fatal(err)
	}
	delete(before, "./kubelet.slice/kubepods/pod3/"+id('b')) // b started after the first read
	after, err := ParseCgroupTree(out(2000, 150, 500, 400, 250))
	if err != nil {
		t.Fatal(err)
	}
	label := func(path string) string {
		switch ContainerID(path) {
		case id('a'), id('c'):
			return "ns/replica"
		case id('b'):
			return "ns/other"
		}
		return strings.TrimPrefix(path, "./")
	}
	shares, total := Attribute(before, after, label)
	want := []CPUShare{{"ns/replica", 400 * time.Microsecond}, {Unattributed, 300 * time.Microsecond},
		{"ns/other", 250 * time.Microsecond}, {"kubelet.slice/kubelet.service", 50 * time.Microsecond}}
	if total != 1000*time.Microsecond || !slices.Equal(shares, want) {
		t.Fatalf("got %v (total %v), want %v (total 1ms)", shares, total, want)
	}
	if _, err := ParseCgroupTree("./x 5\n"); err == nil {
		t.Fatal("a tree without its root: want an error")
	}
}

// The idle rate with a periodic burst: the mean counts the burst, the median of one-second rates
// does not.
func TestRatesMeanAndMedian(t *testing.T) {
	t0 := time.Unix(0, 0)
	var cpu []time.Duration
	var at []time.Time
	c := time.Duration(0)
	for i := range 11 {
		cpu, at = append(cpu, c), append(at, t0.Add(time.Duration(i)*time.Second))
		c += time.Millisecond
		if i == 4 {
			c += 20 * time.Millisecond // a save
		}
	}
	got := Rates(cpu, at)
	if got.Samples != 10 || abs(got.Median-0.001) > 1e-9 || abs(got.Mean-0.003) > 1e-9 {
		t.Fatalf("got %+v, want mean 0.003, median 0.001 over 10 samples", got)
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}
