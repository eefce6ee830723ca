package mosqtable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/hostload"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// These tests run the real plugin (hack/build-mosquitto-table-plugin.sh) in a real Mosquitto
// 2.0.11 with real paho clients.

var quiet = slog.New(slog.DiscardHandler)

func startBroker(t testing.TB) *brokertest.Mosquitto {
	t.Helper()
	// The shipped configuration's packet limit (config/mosquitto): a table import must fit.
	return brokertest.StartMosquitto(t, brokertest.MosquittoOptions{MaxPacketSize: 1 << 20, Table: &brokertest.TableOptions{}})
}

func connect(t testing.TB, m *brokertest.Mosquitto) *Backend {
	t.Helper()
	user, pass := m.TableAdmin()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	be, err := Connect(ctx, Config{URL: m.URL(), Username: user, Password: pass, Timeout: 30 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, m.Log())
	}
	t.Cleanup(func() { _ = be.Close(context.Background()) })
	return be
}

// agent is the commands that give one agent a role allowing it to publish on its own topic.
func agent(i int) (user string, cmds []acl.Command) {
	role := fmt.Sprintf("a2a:role-%05d", i)
	user = fmt.Sprintf("a2a:o/u/agent-%05d", i)
	return user, []acl.Command{
		{Op: acl.OpCreateRole, Role: role, ACLs: []acl.ACL{{Type: acl.PublishClientSend, Topic: "t/" + user + "/#", Allow: true}}},
		{Op: acl.OpCreateClient, Username: user, Password: "pw-" + user},
		{Op: acl.OpAddClientRole, Username: user, Role: role, Priority: 0},
	}
}

func fleet(n int) []acl.Command {
	var cmds []acl.Command
	for i := range n {
		_, c := agent(i)
		cmds = append(cmds, c...)
	}
	return cmds
}

func execute(t testing.TB, be *Backend, cmds []acl.Command) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := be.Execute(ctx, cmds); err != nil {
		t.Fatal(err)
	}
}

// enforces checks the table decides on the broker: the agent connects with its password (not
// another), publishes on its topic and is refused elsewhere.
func enforces(t *testing.T, m *brokertest.Mosquitto, user string) {
	t.Helper()
	c, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: user, Password: "pw-" + user, ClientID: user})
	if err != nil {
		t.Fatalf("%s refused: %v\n%s", user, err, m.Log())
	}
	defer c.Close()
	if code := c.Publish("t/"+user+"/x", "ok"); code >= 0x80 {
		t.Errorf("%s: publish on its own topic refused (%#x)", user, code)
	}
	if code := c.Publish("t/someone-else/x", "no"); code < 0x80 {
		t.Errorf("%s: publish on another's topic accepted (%#x)", user, code)
	}
	if _, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: user, Password: "wrong", ClientID: user + "-2"}); err == nil {
		t.Errorf("%s: a wrong password was accepted", user)
	}
}

// The data plane does not depend on the operator: with the admin connection gone, the broker
// keeps deciding from its table, across a broker restart too (the table is on its disk).
func TestEnforcesWithTheOperatorGone(t *testing.T) {
	m := startBroker(t)
	be := connect(t, m)
	execute(t, be, fleet(50))
	if err := be.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	enforces(t, m, "a2a:o/u/agent-00007")
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	enforces(t, m, "a2a:o/u/agent-00042")
	if _, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: "a2a:o/u/nobody", Password: "x"}); err == nil {
		t.Error("an unknown user connected")
	}
}

// A broker restarted on an empty disk refuses every CONNECT but the admin's until the operator
// gives it the whole table back in one import (in parts: 4 000 agents are ≈ 3 MB, more than the
// broker's 1 MiB packet limit); after that the same decisions hold.
func TestEmptyDiskRestartFailsClosedThenBulkReload(t *testing.T) {
	const n = 4000
	m := startBroker(t)
	be := connect(t, m)
	execute(t, be, fleet(n))
	user := "a2a:o/u/agent-01234"
	enforces(t, m, user)

	// Hold the operator's side back (its reconnection waits for the lock) while the broker
	// restarts on an empty disk and is probed.
	be.mu.Lock()
	m.Stop()
	if err := os.RemoveAll(m.TableStateDir()); err != nil {
		t.Fatal(err)
	}
	if err := m.Restart(); err != nil {
		be.mu.Unlock()
		t.Fatal(err)
	}
	_, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: user, Password: "pw-" + user, ClientID: user})
	var refused *brokertest.RefusedError
	if !errors.As(err, &refused) {
		t.Errorf("before the table is back, %s's CONNECT: %v, want a refusal (fail closed)", user, err)
	}
	admin, pass := m.TableAdmin()
	if c, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: admin, Password: pass}); err != nil {
		t.Errorf("the bootstrap admin is refused on an empty disk: %v", err)
	} else {
		c.Close()
	}
	start := time.Now()
	be.mu.Unlock()

	// The operator's connection comes back by itself and imports its mirror.
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := be.Status(ctx)
		cancel()
		if err == nil && st.Loaded {
			if st.Clients != n || st.Roles != n {
				t.Fatalf("after the reload the broker holds %d clients and %d roles, want %d each", st.Clients, st.Roles, n)
			}
			t.Logf("%d agents back in the broker %.2f s after the operator could reconnect (one import)", n, time.Since(start).Seconds())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the table never came back: %+v %v\n%s", st, err, m.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	enforces(t, m, user)
	enforces(t, m, "a2a:o/u/agent-00000")
	// And the operator carries on with single changes.
	newUser, cmds := agent(n)
	execute(t, be, cmds)
	enforces(t, m, newUser)
}

// A revocation is immediate: a removed grant kicks the live connection it covered, a rotated
// password refuses the next CONNECT.
func TestRevocationOnTheBroker(t *testing.T) {
	m := startBroker(t)
	be := connect(t, m)
	user, cmds := agent(1)
	execute(t, be, cmds)
	c, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: user, Password: "pw-" + user, ClientID: user})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	execute(t, be, []acl.Command{{Op: acl.OpRemoveClientRole, Username: user, Role: "a2a:role-00001"}})
	if !c.Disconnected(5 * time.Second) {
		t.Error("removing the client's role did not end its connection")
	}
	execute(t, be, []acl.Command{{Op: acl.OpSetClientPassword, Username: user, Password: "rotated"}})
	if _, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: user, Password: "pw-" + user, ClientID: user}); err == nil {
		t.Error("the old password still connects after a rotation")
	}
	if c2, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: user, Password: "rotated", ClientID: user}); err != nil {
		t.Errorf("the rotated password is refused: %v", err)
	} else {
		c2.Close()
	}
}

// BenchmarkChangeCostByClients measures what a change costs the broker as the table grows,
// the figure that makes dynsec unusable for a fleet (internal/mqtt/dynsec's
// BenchmarkMessageCostByClients: ≈ 5.8 µs of broker CPU per configured client per command,
// the whole file rewritten). For each size (TABLE_CLIENTS, default 1000,10000) a fresh broker
// is filled with that many agents (a role, a client with a password and the link each), the
// broker is let go idle (the background password hashing), then five probes of 300 new agents
// (900 commands, one message each) are timed: the broker thread's CPU (schedstat of
// Mosquitto's main thread: the plugin's Go threads, the disk writer and the hasher, are not
// on the broker's path), the message's round trip, and what the process wrote. The largest
// size's broker CPU per command must stay within 1.5× the smallest's.
//
//	go test ./internal/mqtt/mosqtable -run '^$' -bench ChangeCostByClients -benchtime 1x -timeout 30m
func BenchmarkChangeCostByClients(b *testing.B) {
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
	cpuPerCmd := map[int]float64{}
	for _, n := range sizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for range b.N {
				cpuPerCmd[n] = measureChangeCost(b, n)
			}
			// The assertion, in the largest size's run (it has the smallest's figure).
			lo := sizes[0]
			if n == lo || n != sizes[len(sizes)-1] || cpuPerCmd[lo] == 0 {
				return
			}
			ratio := cpuPerCmd[n] / cpuPerCmd[lo]
			b.ReportMetric(ratio, "cpu-ratio-to-smallest")
			b.Logf("broker CPU per command: %.1f µs at %d clients, %.1f µs at %d: ratio %.2f; %s", cpuPerCmd[lo], lo, cpuPerCmd[n], n, ratio, hostload.Label())
			if ratio > 1.5 {
				b.Errorf("a change costs the broker %.2f× more at %d configured clients than at %d: the cost is not flat (want ≤ 1.5×)", ratio, n, lo)
			}
		})
	}
}

// measureChangeCost fills a fresh broker with n agents and returns the broker thread's median
// CPU per command, in µs, over five probes.
func measureChangeCost(b *testing.B, n int) float64 {
	m := startBroker(b)
	be := connect(b, m)
	fillStart := time.Now()
	execute(b, be, fleet(n))
	fill := time.Since(fillStart)
	if err := be.mirror.Flush(); err != nil {
		b.Fatal(err)
	}
	waitIdle(b, m.PID())
	rss := readRSS(b, m.PID())
	b.ReportMetric(float64(rss)/(1<<20), "broker-RSS-MiB")
	const probes, agents = 5, 300
	var cpus, walls []float64
	var written int64
	for p := range probes {
		var cmds []acl.Command
		for i := range agents {
			_, c := agent(n + p*agents + i)
			cmds = append(cmds, c...)
		}
		before := readBroker(b, m.PID())
		start := time.Now()
		execute(b, be, cmds)
		wall := time.Since(start)
		after := readBroker(b, m.PID())
		cpus = append(cpus, float64(after.mainCPU-before.mainCPU)/1e3/float64(len(cmds)))
		walls = append(walls, float64(wall.Microseconds())/float64(len(cmds)))
		// The disk writer and the hasher run after the reply: wait for them to count the writes.
		waitIdle(b, m.PID())
		written += readBroker(b, m.PID()).wchar - before.wchar
	}
	slices.Sort(cpus)
	slices.Sort(walls)
	cpu, wall := cpus[probes/2], walls[probes/2]
	perCmdWritten := float64(written) / float64(probes*agents*3)
	b.ReportMetric(cpu, "broker-thread-µs/cmd")
	b.ReportMetric(wall, "round-trip-µs/cmd")
	b.ReportMetric(perCmdWritten/1024, "KiB-written/cmd")
	b.ReportMetric(fill.Seconds(), "s-to-fill")
	b.Logf("%d clients: broker RSS %.1f MiB after the fill", n, float64(rss)/(1<<20))
	b.Logf("%d clients: per command the broker's thread used %.1f µs (median of %d messages of %d commands; all: %.1f), the round trip %.1f µs; the process wrote %.2f KiB per command (its disk writer); filling %d commands took %.1f s; %s",
		n, cpu, probes, agents*3, cpus, wall, perCmdWritten/1024, n*3, fill.Seconds(), hostload.Label())
	_ = be.Close(context.Background())
	m.Kill()
	return cpu
}

// brokerAccount is what the broker process wrote and its main thread's CPU time.
type brokerAccount struct {
	wchar   int64
	mainCPU int64 // ns on CPU of Mosquitto's own thread (the process's first)
	allCPU  int64 // clock ticks of every thread (utime+stime)
}

func readBroker(b testing.TB, pid int) brokerAccount {
	b.Helper()
	var a brokerAccount
	io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		b.Fatalf("broker's I/O accounting: %v", err)
	}
	for _, line := range strings.Split(string(io), "\n") {
		if k, v, _ := strings.Cut(line, ": "); k == "wchar" {
			a.wchar, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	sched, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/schedstat", pid, pid))
	if err != nil {
		b.Fatalf("broker thread's schedstat: %v", err)
	}
	if f := strings.Fields(string(sched)); len(f) > 0 {
		a.mainCPU, _ = strconv.ParseInt(f[0], 10, 64)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("broker's stat: %v", err)
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) >= 13 {
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		a.allCPU = ut + st
	}
	return a
}

// readRSS is the broker process's resident memory in bytes.
func readRSS(b testing.TB, pid int) int64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatalf("broker's status: %v", err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	b.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// waitIdle waits until the broker process (its background hashing and disk writes included)
// used no CPU for a second.
func waitIdle(b testing.TB, pid int) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	last := readBroker(b, pid).allCPU
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		now := readBroker(b, pid).allCPU
		if now-last <= 1 {
			return
		}
		last = now
	}
	b.Fatal("the broker did not go idle after the fill")
}

// A broker that crashed before its disk round lost changes it had acknowledged: it comes back at
// a generation below the operator's, and the operator gives it the mirror back (which has
// them). Simulated exactly: the state dir of a clean stop is put back after later changes.
func TestLostAcknowledgedChangesAreGivenBack(t *testing.T) {
	m := startBroker(t)
	be := connect(t, m)
	execute(t, be, fleet(20))
	m.Stop() // a clean stop writes everything
	backup := t.TempDir()
	if err := os.CopyFS(backup, os.DirFS(m.TableStateDir())); err != nil {
		t.Fatal(err)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	late, cmds := agent(20)
	execute(t, be, cmds) // acknowledged, then "lost"
	be.mu.Lock()
	m.Kill()
	if err := os.RemoveAll(m.TableStateDir()); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(m.TableStateDir(), os.DirFS(backup)); err != nil {
		t.Fatal(err)
	}
	if err := m.Restart(); err != nil {
		be.mu.Unlock()
		t.Fatal(err)
	}
	if c, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: late, Password: "pw-" + late, ClientID: late}); err == nil {
		c.Close()
		t.Error("the restored disk still knows the late agent: the test lost nothing")
	}
	be.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: late, Password: "pw-" + late, ClientID: late})
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the late agent never came back: %v\n%s", err, grepLog(m.Log(), "a2a-fleet table"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	enforces(t, m, late)
	enforces(t, m, "a2a:o/u/agent-00003")
}

func TestDecideSync(t *testing.T) {
	o := origin{epoch: "e1", boot: "b1", gen: 7}
	for _, tc := range []struct {
		name   string
		st     Status
		synced bool
		want   syncAction
	}{
		{"no table on the broker", Status{Loaded: false, Boot: "b2"}, true, syncImport},
		{"no table, fresh operator", Status{Loaded: false}, false, syncImport},
		{"in step", Status{Loaded: true, Epoch: "e1", Boot: "b1", Generation: 7}, true, syncNone},
		{"restart that kept everything", Status{Loaded: true, Epoch: "e1", Boot: "b2", Generation: 7}, true, syncAdopt},
		{"restart that lost acknowledged changes", Status{Loaded: true, Epoch: "e1", Boot: "b2", Generation: 5}, true, syncImport},
		{"lost changes, a request in doubt", Status{Loaded: true, Epoch: "e1", Boot: "b2", Generation: 5}, false, syncImport},
		{"another admin wrote", Status{Loaded: true, Epoch: "e1", Boot: "b1", Generation: 9}, true, syncExport},
		{"a request in doubt", Status{Loaded: true, Epoch: "e1", Boot: "b1", Generation: 8}, false, syncExport},
		{"another lineage", Status{Loaded: true, Epoch: "e2", Boot: "b2", Generation: 1}, true, syncExport},
	} {
		if got := decideSync(tc.st, o, tc.synced); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if got := decideSync(Status{Loaded: true, Epoch: "e1", Generation: 3}, origin{}, false); got != syncExport {
		t.Errorf("a mirror never made: %d, want export", got)
	}
}

func grepLog(log, what string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, what) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
