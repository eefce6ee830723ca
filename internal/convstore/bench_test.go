package convstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"golang.org/x/sys/unix"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// threadCPU is the calling OS thread's CPU time: on a shared machine,
// wall-clock percentiles mostly measure the scheduler.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

func pct(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(float64(len(sorted)-1)*q)].Nanoseconds()) / 1e3
}

func benchContexts() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_CONTEXTS")); err == nil {
		return n
	}
	return 100_000
}

func benchPolicy() conversation.Policy {
	p := conversation.DefaultPolicy()
	p.MaxConcurrentTasksPerContext = 1
	p.MaxActiveContextsPerAgent = 1_000_000
	p.InputRequiredTimeout = time.Hour
	return p
}

const benchAgent = "org/unit/agent"

// fill builds n contexts of three tasks (two completed, one waiting for
// input: the shape of long conversations) through Memory, journaled
// behind (the group committer batches them).
func fill(b *testing.B, m *Memory, p conversation.Policy, n int) {
	b.Helper()
	var last *Ticket
	for i := range n {
		cid := fmt.Sprintf("%08d-1111-4111-8111-111111111111", i)
		for j := range 3 {
			tid := fmt.Sprintf("%08d-2222-4222-8222-%012d", i, j)
			corr := fmt.Sprintf("%032x", i*3+j)
			req := send(tid, cid, tid+"-m", corr)
			req.ResponseTopic = "$a2a/v1/reply/org/unit/requester/0123456789abcdef0123456789abcdef"
			if _, _, err := m.Decide(benchAgent, p, t0, req); err != nil {
				b.Fatal(err)
			}
			st := a2a.TaskStateCompleted
			if j == 2 {
				st = a2a.TaskStateInputRequired
			}
			_, t, err := m.Observe(benchAgent, p, t0, status(tid, corr, st))
			if err != nil {
				b.Fatal(err)
			}
			last = t
		}
	}
	if err := last.Wait(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkDecide times what the service runs for one turn, state store
// included: Memory.Decide (engine, record encoding, journal append) of a
// follow-up in a random one of 100k live contexts, then the wait until it is
// durable (a group commit with fsync, bbolt), then the completion's Observe
// and its durable wait. Sequential, so every wait is a commit of its own:
// the worst case for group commit. Reports p50/p99 of the decision (wall
// and thread CPU), of decision-to-durable, and of the completion.
//
//	go test -run '^$' -bench BenchmarkDecide -benchtime 20000x ./internal/convstore/
func BenchmarkDecide(b *testing.B) {
	for _, sync := range []bool{true, false} {
		name := "fsync"
		if !sync {
			name = "nosync"
		}
		b.Run(name, func(b *testing.B) {
			j, err := OpenBoltJournal(filepath.Join(b.TempDir(), "conv.db"), &BoltOptions{NoSync: !sync})
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			m := NewMemory(j, true)
			p := benchPolicy()
			n := benchContexts()
			fill(b, m, p, n)
			runtime.GC()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			decide := make([]time.Duration, 0, b.N)
			decideCPU := make([]time.Duration, 0, b.N)
			durable := make([]time.Duration, 0, b.N)
			observe := make([]time.Duration, 0, b.N)
			ctx := context.Background()
			commits0, _ := j.Stats()
			b.ResetTimer()
			for i := range b.N {
				c := (i * 7919) % n
				cid := fmt.Sprintf("%08d-1111-4111-8111-111111111111", c)
				tid := fmt.Sprintf("%08d-3333-4333-8333-%012d", c, i)
				start, cpu := time.Now(), threadCPU()
				d, t, err := m.Decide(benchAgent, p, t0, send(tid, cid, "m", tid))
				decideCPU = append(decideCPU, threadCPU()-cpu)
				decide = append(decide, time.Since(start))
				if err != nil || d.Kind != conversation.KindNewTask {
					b.Fatalf("%s %v %v", d.Kind, d.Err, err)
				}
				if err := t.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				durable = append(durable, time.Since(start))
				start = time.Now()
				_, t, err = m.Observe(benchAgent, p, t0, status(tid, tid, a2a.TaskStateCompleted))
				if err == nil {
					err = t.Wait(ctx)
				}
				if err != nil {
					b.Fatal(err)
				}
				observe = append(observe, time.Since(start))
			}
			b.StopTimer()
			commits1, _ := j.Stats()
			for _, s := range [][]time.Duration{decide, decideCPU, durable, observe} {
				slices.Sort(s)
			}
			b.ReportMetric(pct(decide, .5), "decide-p50-µs")
			b.ReportMetric(pct(decide, .99), "decide-p99-µs")
			b.ReportMetric(pct(decideCPU, .5), "decide-cpu-p50-µs")
			b.ReportMetric(pct(decideCPU, .99), "decide-cpu-p99-µs")
			b.ReportMetric(pct(durable, .5), "durable-p50-µs")
			b.ReportMetric(pct(durable, .99), "durable-p99-µs")
			b.ReportMetric(pct(observe, .5), "final-durable-p50-µs")
			b.ReportMetric(pct(observe, .99), "final-durable-p99-µs")
			b.ReportMetric(float64(commits1-commits0)/float64(b.N), "commits/turn")
			b.ReportMetric(float64(n), "contexts")
		})
	}
}

// BenchmarkGroupCommit: 16 goroutines decide at once (new contexts) and
// wait for durability, bbolt with fsync: the changes per commit and the
// throughput group commit gives.
//
//	go test -run '^$' -bench BenchmarkGroupCommit -benchtime 20000x ./internal/convstore/
func BenchmarkGroupCommit(b *testing.B) {
	j, err := OpenBoltJournal(filepath.Join(b.TempDir(), "conv.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	m := NewMemory(j, true)
	p := benchPolicy()
	ctx := context.Background()
	const workers = 16
	b.ResetTimer()
	start := time.Now()
	done := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := w; i < b.N; i += workers {
				id := fmt.Sprintf("%08d-1111-4111-8111-%012d", w, i)
				_, t, err := m.Decide(benchAgent, p, t0, send(id, id, "m", id))
				if err == nil {
					err = t.Wait(ctx)
				}
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range workers {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	commits, changes := j.Stats()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "durable-decisions/s")
	b.ReportMetric(float64(changes)/float64(commits), "changes/commit")
}

func rssMB() (rss, hwm float64) {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "VmRSS:":
			rss = float64(v) / 1024
		case "VmHWM:":
			hwm = float64(v) / 1024
		}
	}
	return rss, hwm
}

// BenchmarkRecovery measures a restart: open the bbolt journal holding 100k
// contexts (300k task records) and rebuild the in-memory state
// (Memory.Recover). Reports the time, the heap the state keeps, the process
// RSS and the file size.
//
//	go test -run '^$' -bench BenchmarkRecovery -benchtime 3x ./internal/convstore/
func BenchmarkRecovery(b *testing.B) {
	n := benchContexts()
	p := benchPolicy()
	path := filepath.Join(b.TempDir(), "conv.db")
	j, err := OpenBoltJournal(path, &BoltOptions{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	fill(b, NewMemory(j, true), p, n)
	if err := j.Close(); err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	var elapsed time.Duration
	var before, after runtime.MemStats
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()
		start := time.Now()
		j, err := OpenBoltJournal(path, nil)
		if err != nil {
			b.Fatal(err)
		}
		m := NewMemory(j, true)
		if err := m.Recover(context.Background(), "", nil); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		b.StopTimer()
		if live, _ := m.Stats(); live[benchAgent] != n {
			b.Fatalf("recovered %d contexts, want %d", live[benchAgent], n)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		rss, hwm := rssMB()
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "state-heap-MB")
		b.ReportMetric(rss, "rss-MB")
		b.ReportMetric(hwm, "peak-rss-MB")
		runtime.KeepAlive(m)
		if err := j.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(elapsed.Milliseconds())/float64(b.N), "recover-ms")
	b.ReportMetric(float64(n), "contexts")
	b.ReportMetric(float64(fi.Size())/(1<<20), "file-MB")
}
