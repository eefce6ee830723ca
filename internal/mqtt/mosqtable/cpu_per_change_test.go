package mosqtable

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/hostload"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// BenchmarkBrokerCPUPerChange measures what one change costs the whole broker process (its
// thread, the plugin's disk writer, its password hasher and its Go runtime), the figure the
// fleet benchmark on kind reads from the container's cgroup, at 1 000 and 10 000 configured
// clients (TABLE_CLIENTS), in the same run. Per size: a fresh broker is filled, let go idle,
// its idle CPU is measured, then CHANGES (default 200) new agents (a role, a client with a
// password and the link: one message; its retained card; and, for the two thirds whose callers
// are SameUnit or SameOrg, its unit's or org's shared role with one rule more, as the operator's
// shared controller sends it: sharedRoles) and as many password rotations (one message each)
// are sent one at a time, then as many status round trips (what a reconcile's read asked
// before acl.ObserveCached); the process's CPU over each batch and
// the settle after it (every thread's schedstat), less the idle CPU over the same time, is
// divided by the changes, and so are the threads' runs (the wake-ups: the broker's thread, the
// Go runtime's sysmon and scheduler threads, the disk writer; one line per batch breaks them
// down by thread). CHANGE_GAP pauses after each change, as an operator's reconciles do (see
// changeGapFromEnv). The largest size's cost per new agent must stay within 1.5× the
// smallest's.
//
// BROKER_PERF=dir records each batch with `perf record -g` into dir (perf must be installed
// and allowed to attach): `perf report -i dir/<size>-<kind>.data` says where the time goes;
// with BROKER_STRACE=1 it records the threads' sleeps, wake-ups and syncs with strace instead
// (dir/<size>-<kind>.strace).
// TABLE_IN_MEMORY=1 runs the plugin without its state_dir: the difference is the disk writer's
// share (its rounds, their fdatasyncs and the runtime's polling meanwhile).
// A2A_FLEET_TABLE_PROFILE_DIR=dir takes the plugin's own CPU and allocation profiles of the
// new-agent batch into dir (<size>-new-agent-*.pprof).
//
//	go test ./internal/mqtt/mosqtable -run '^$' -bench BrokerCPUPerChange -benchtime 1x -timeout 30m
func BenchmarkBrokerCPUPerChange(b *testing.B) {
	sizes := []int{1000, 10000}
	if env := os.Getenv("TABLE_CLIENTS"); env != "" {
		sizes = nil
		for _, f := range strings.Split(env, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				b.Fatalf("TABLE_CLIENTS: %v", err)
			}
			sizes = append(sizes, n)
		}
	}
	changes := 200
	if env := os.Getenv("CHANGES"); env != "" {
		n, err := strconv.Atoi(env)
		if err != nil || n <= 0 {
			b.Fatalf("CHANGES=%q: want a positive count", env)
		}
		changes = n
	}
	perAgent := map[int]float64{}
	for _, n := range sizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for range b.N {
				perAgent[n] = measureCPUPerChange(b, n, changes)
			}
			lo, hi := sizes[0], sizes[len(sizes)-1]
			if n != hi || n == lo || perAgent[lo] <= 0 {
				return
			}
			ratio := perAgent[n] / perAgent[lo]
			b.ReportMetric(ratio, "new-agent-ratio-to-smallest")
			b.Logf("broker process CPU per new agent: %.3f ms at %d, %.3f ms at %d: ratio %.2f; %s", perAgent[lo], lo, perAgent[n], n, ratio, hostload.Label())
			if ratio > 1.5 {
				b.Errorf("a new agent costs the broker process %.2f× more at %d configured clients than at %d (want ≤ 1.5×)", ratio, n, lo)
			}
		})
	}
}

// measureCPUPerChange fills a fresh broker with n agents and returns the process's CPU per new
// agent in ms (it reports the rotation's too).
func measureCPUPerChange(b *testing.B, n, changes int) float64 {
	// The shipped broker keeps retained cards and sessions on disk (config/mosquitto): its
	// autosave is timed (autosave_interval 30), so it is set out of the batches' way here and
	// measured on its own (saveCost).
	m := brokertest.StartMosquitto(b, brokertest.MosquittoOptions{MaxPacketSize: 1 << 20, Table: &brokertest.TableOptions{InMemory: os.Getenv("TABLE_IN_MEMORY") != ""},
		ExtraConfig: fmt.Sprintf("persistence true\npersistence_location %s/\nautosave_interval 3600\n", b.TempDir())})
	be := connect(b, m)
	execute(b, be, fleet(n))
	shared := newSharedRoles(n)
	execute(b, be, shared.create())
	if err := be.mirror.Flush(); err != nil {
		b.Fatal(err)
	}
	admin, pass := m.TableAdmin()
	cards, err := brokertest.Dial(b, m.Addr(), brokertest.Options{Username: admin, Password: pass, ClientID: "cards"})
	if err != nil {
		b.Fatal(err)
	}
	defer cards.Close()
	for i := range n {
		publishCard(b, cards, i)
	}
	pid := m.PID()
	waitIdle(b, pid)
	b.ReportMetric(float64(readRSS(b, pid))/(1<<20), "broker-RSS-MiB")
	// The idle process's CPU (the Go runtime's background work), subtracted from each batch.
	const idleFor = 5 * time.Second
	idle0, t0 := processCPU(b, pid), time.Now()
	time.Sleep(idleFor)
	idle1 := processCPU(b, pid)
	idleRate := float64(idle1.all-idle0.all) / float64(time.Since(t0))
	idleRuns := float64(idle1.runs-idle0.runs) / time.Since(t0).Seconds()
	changeGap := changeGapFromEnv(b)

	batch := func(kind string, one func(i int)) (all, main, runs float64) {
		stopPerf := startPerf(b, pid, fmt.Sprintf("%d-%s", n, kind))
		before, start := processCPU(b, pid), time.Now()
		for i := range changes {
			one(i)
			time.Sleep(changeGap)
		}
		// The disk writer and the hasher run after the reply: let them finish.
		time.Sleep(2 * time.Second)
		after, elapsed := processCPU(b, pid), time.Since(start)
		stopPerf()
		all = (float64(after.all-before.all) - idleRate*float64(elapsed)) / 1e6 / float64(changes)
		main = float64(after.main-before.main) / 1e6 / float64(changes)
		runs = (float64(after.runs-before.runs) - idleRuns*elapsed.Seconds()) / float64(changes)
		b.Logf("%d clients, %s, %s apart: %.3f ms and %.1f thread runs per change (idle %.1f runs/s subtracted): %s",
			n, kind, changeGap, all, runs, idleRuns, threadsSince(pid, before, after, changes))
		return all, main, runs
	}
	profile := startProfileWindow(b)
	newAll, newMain, newRuns := batch("new-agent", func(i int) {
		_, c := agent(n + i)
		execute(b, be, c)
		publishCard(b, cards, n+i) // the operator publishes the new Agent's card, retained
		// The shared controller's message: the scope's role with the new member.
		if role := shared.join(n + i); role != nil {
			execute(b, be, role)
		}
	})
	profile(fmt.Sprintf("%d-new-agent", n))
	rotAll, rotMain, rotRuns := batch("rotation", func(i int) {
		execute(b, be, []acl.Command{{Op: acl.OpSetClientPassword, Username: fmt.Sprintf("a2a:o/u/agent-%05d", i), Password: fmt.Sprintf("rotated-%d", i)}})
	})
	// A status round trip (what each reconcile's read asked before ObserveCached), for scale.
	statusAll, _, statusRuns := batch("status", func(int) {
		if _, err := be.Status(b.Context()); err != nil {
			b.Fatal(err)
		}
	})
	b.ReportMetric(statusAll, "ms/status")
	b.ReportMetric(statusRuns, "thread-runs/status")
	save := saveCost(b, m, pid)
	b.ReportMetric(save, "ms/autosave")
	b.Logf("%d clients (%d retained cards): one save of Mosquitto's persistence (its autosave, every 30 s in config/mosquitto) costs the process %.2f ms: %.3f ms/s at autosave_interval 30", n, n+changes, save, save/30)
	b.ReportMetric(newAll, "ms/new-agent")
	b.ReportMetric(rotAll, "ms/rotation")
	b.ReportMetric(newMain, "broker-thread-ms/new-agent")
	b.ReportMetric(rotMain, "broker-thread-ms/rotation")
	b.ReportMetric(newRuns, "thread-runs/new-agent")
	b.ReportMetric(rotRuns, "thread-runs/rotation")
	b.Logf("%d clients: broker process CPU per new agent %.3f ms (its thread %.3f), per rotation %.3f ms (its thread %.3f); idle %.2f ms/s subtracted; %d each; %s",
		n, newAll, newMain, rotAll, rotMain, idleRate*1e3, changes, hostload.Label())
	m.Kill()
	return newAll
}

// changeGapFromEnv is CHANGE_GAP: the pause after each change (0 by default: back to back).
// The operator sends a change when its Agent's reconcile runs, tens of milliseconds or more
// apart on kind; after such a pause the plugin's Go runtime has gone to sleep (sysmon in its
// deep sleep, the scheduler's threads parked) and each change wakes it again, which back-to-back
// changes share (docs/benchmarks.md).
func changeGapFromEnv(b *testing.B) time.Duration {
	env := os.Getenv("CHANGE_GAP")
	if env == "" {
		return 0
	}
	d, err := time.ParseDuration(env)
	if err != nil || d < 0 {
		b.Fatalf("CHANGE_GAP=%q: want a duration such as 50ms", env)
	}
	return d
}

// sharedRoles models the operator's shared roles (internal/registration): each unit's and the
// org's role hold one rule per member of that scope (an agent whose callers are SameUnit or
// SameOrg: a third of the fleet each, units of a tenth), and a new member's role is sent whole
// (modifyRole carrying the full list, which kicks nobody), as the shared controller sends it.
type sharedRoles struct {
	members map[string][]acl.ACL
}

func sharedRoleOf(i int) string {
	switch i % 3 {
	case 1:
		return fmt.Sprintf("a2a:unit:o/u%d", i%10)
	case 2:
		return "a2a:org:o"
	}
	return ""
}

func newSharedRoles(n int) *sharedRoles {
	s := &sharedRoles{members: map[string][]acl.ACL{}}
	for i := range n {
		if role := sharedRoleOf(i); role != "" {
			s.members[role] = append(s.members[role], memberACL(i))
		}
	}
	return s
}

// memberACL is what a scope's callers may do to member i: publish to its request topic.
func memberACL(i int) acl.ACL {
	return acl.ACL{Type: acl.PublishClientSend, Topic: fmt.Sprintf("rpc/o/u%d/agent-%05d/request", i%10, i), Allow: true}
}

func (s *sharedRoles) create() []acl.Command {
	var cmds []acl.Command
	for _, role := range slices.Sorted(maps.Keys(s.members)) {
		cmds = append(cmds, acl.Command{Op: acl.OpCreateRole, Role: role, ACLs: slices.Clone(s.members[role])})
	}
	return cmds
}

// join adds agent i to its scope's role and returns the command that sends the role (nil when
// its callers are None).
func (s *sharedRoles) join(i int) []acl.Command {
	role := sharedRoleOf(i)
	if role == "" {
		return nil
	}
	s.members[role] = append(s.members[role], memberACL(i))
	return []acl.Command{{Op: acl.OpModifyRole, Role: role, ACLs: slices.Clone(s.members[role])}}
}

// startProfileWindow, when A2A_FLEET_TABLE_PROFILE_DIR is set (the broker inherits it: the
// plugin's profile windows, hack/mosquitto-plugin/table/profile.go), starts one; the returned
// function ends it and renames its files after name.
func startProfileWindow(b testing.TB) func(name string) {
	dir := os.Getenv("A2A_FLEET_TABLE_PROFILE_DIR")
	if dir == "" {
		return func(string) {}
	}
	if err := os.WriteFile(filepath.Join(dir, "start"), nil, 0o644); err != nil {
		b.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	return func(name string) {
		if err := os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644); err != nil {
			b.Fatal(err)
		}
		time.Sleep(2500 * time.Millisecond)
		for _, f := range []string{"cpu-1.pprof", "allocs-1.pprof", "allocs-1-before.pprof", "gc-1.txt"} {
			_ = os.Rename(filepath.Join(dir, f), filepath.Join(dir, name+"-"+f))
		}
		if gc, err := os.ReadFile(filepath.Join(dir, name+"-gc-1.txt")); err == nil {
			b.Logf("%s: %s", name, gc)
		}
	}
}

// publishCard publishes agent i's card (≈ 1 KiB, retained), as the operator does.
func publishCard(b testing.TB, c *brokertest.Client, i int) {
	b.Helper()
	card := fmt.Sprintf(`{"name":"agent-%05d","description":%q,"url":"mqtt://a2a/o/u/agent-%05d","version":"1.0.0","skills":[]}`, i, strings.Repeat("x", 900), i)
	pr, err := c.PublishWith(&paho.Publish{Topic: fmt.Sprintf("a2a/v1/cards/o/u/agent-%05d", i), QoS: 1, Retain: true, Payload: []byte(card)})
	if err != nil || pr == nil || pr.ReasonCode >= 0x80 {
		b.Fatalf("card %d: %v %+v", i, err, pr)
	}
}

// saveCost is the process's median CPU, in ms, of one save of Mosquitto's persistence file
// (SIGUSR1 saves it at once, the work an autosave does), over five saves.
func saveCost(b testing.TB, m *brokertest.Mosquitto, pid int) float64 {
	b.Helper()
	var costs []float64
	for range 5 {
		saves := strings.Count(m.Log(), "Saving in-memory database")
		before := processCPU(b, pid)
		if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for strings.Count(m.Log(), "Saving in-memory database") == saves {
			if time.Now().After(deadline) {
				b.Fatalf("the broker did not save on SIGUSR1:\n%s", m.Log())
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond) // the log line comes first, then the write
		costs = append(costs, float64(processCPU(b, pid).all-before.all)/1e6)
	}
	slices.Sort(costs)
	return costs[len(costs)/2]
}

// cpuAccount is a process's CPU time in ns (every thread's, and the broker's own: the first)
// and its threads' runs (the times the kernel put one on a core: each wake-up of the broker's
// thread, the Go runtime's sysmon, a scheduler thread or the disk writer), in all and by
// thread id.
type cpuAccount struct {
	all, main, runs int64
	threads         map[string]threadAccount
}

type threadAccount struct{ ns, runs int64 }

// processCPU sums the schedstat of every thread of pid (ns resolution, unlike /proc/PID/stat's
// clock ticks).
func processCPU(b testing.TB, pid int) cpuAccount {
	b.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		b.Fatalf("broker's threads: %v", err)
	}
	a := cpuAccount{threads: map[string]threadAccount{}}
	for _, t := range tasks {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // a thread that ended meanwhile
		}
		f := strings.Fields(string(raw))
		if len(f) == 0 {
			continue
		}
		ns, _ := strconv.ParseInt(f[0], 10, 64)
		a.all += ns
		var runs int64
		if len(f) >= 3 {
			runs, _ = strconv.ParseInt(f[2], 10, 64)
		}
		a.runs += runs
		a.threads[t.Name()] = threadAccount{ns: ns, runs: runs}
		if t.Name() == strconv.Itoa(pid) {
			a.main = ns
		}
	}
	return a
}

// threadsSince is, per change, what each thread of pid did between before and after (the
// broker's own thread first, then by runs), as one log line.
func threadsSince(pid int, before, after cpuAccount, changes int) string {
	type row struct {
		tid string
		d   threadAccount
	}
	var rows []row
	for tid, a := range after.threads {
		d := threadAccount{ns: a.ns - before.threads[tid].ns, runs: a.runs - before.threads[tid].runs}
		if d.runs > 0 {
			rows = append(rows, row{tid, d})
		}
	}
	main := strconv.Itoa(pid)
	slices.SortFunc(rows, func(x, y row) int {
		if (x.tid == main) != (y.tid == main) {
			if x.tid == main {
				return -1
			}
			return 1
		}
		return int(y.d.runs - x.d.runs)
	})
	var parts []string
	for _, r := range rows {
		name := "thread " + r.tid
		if r.tid == main {
			name = "the broker's thread"
		}
		parts = append(parts, fmt.Sprintf("%s %.1f runs %.3f ms", name, float64(r.d.runs)/float64(changes), float64(r.d.ns)/1e6/float64(changes)))
	}
	return strings.Join(parts, ", ")
}

// startPerf records pid with perf into $BROKER_PERF/name.data when BROKER_PERF is set; the
// returned function stops it.
func startPerf(b testing.TB, pid int, name string) func() {
	dir := os.Getenv("BROKER_PERF")
	if dir == "" {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("perf", "record", "-q", "-g", "-F", "999", "-p", strconv.Itoa(pid), "-o", filepath.Join(dir, name+".data"))
	if os.Getenv("BROKER_STRACE") != "" {
		// Which thread sleeps and wakes how often: sysmon's nanosleeps, the scheduler's futexes,
		// the writer's syncs (strace slows every call it records: its CPU figures are not the
		// benchmark's).
		cmd = exec.Command("strace", "-f", "-tt", "-e", "trace=nanosleep,futex,epoll_wait,fdatasync,pwrite64", "-p", strconv.Itoa(pid), "-o", filepath.Join(dir, name+".strace"))
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("perf record: %v", err)
	}
	time.Sleep(500 * time.Millisecond) // perf attaches
	return func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
	}
}
