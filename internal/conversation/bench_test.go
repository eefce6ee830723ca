package conversation

import (
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU returns the CPU time of the calling OS thread. On a shared
// machine wall-clock percentiles mostly measure the scheduler (other
// processes preempting the benchmark); thread CPU time measures the code.
// Callers lock the goroutine to its thread.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// benchAgent builds an Agent with n live contexts of three finished tasks
// each, the shape of a busy agent with long conversations.
func benchAgent(b *testing.B, p Policy, n int) *Agent {
	b.Helper()
	a := NewAgent()
	for i := 0; i < n; i++ {
		cid := "ctx-" + strconv.Itoa(i)
		for j := 0; j < 3; j++ {
			tid := cid + "-t" + strconv.Itoa(j)
			corr := []byte(tid)
			if d := a.Decide(p, t0, send(tid, cid, "m", string(corr))); d.Err != nil {
				b.Fatal(d.Err)
			}
			a.Observe(p, t0, Event{Kind: EventStatus, TaskID: tid, State: completed, Correlation: corr})
		}
	}
	if a.Live() != n {
		b.Fatalf("%d live contexts, want %d", a.Live(), n)
	}
	return a
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(float64(len(sorted)-1)*q)]
}

// BenchmarkDecide measures the latency of one decision (a follow-up turn in
// a random context, under the concurrent-call guard and an active-context
// limit) with 100k live contexts, then completes the task with Observe so
// the state stays steady. It reports p50/p99 of Decide (wall and thread CPU
// time) and of Observe. BENCH_NOGC=1 measures with a warm heap and the GC
// paused, which isolates the code from GC assists and page faults.
//
//	go test -run '^$' -bench BenchmarkDecide -benchtime 200000x ./internal/conversation/
func BenchmarkDecide(b *testing.B) {
	contexts := 100_000
	if n, err := strconv.Atoi(os.Getenv("BENCH_CONTEXTS")); err == nil {
		contexts = n
	}
	p := DefaultPolicy()
	p.MaxConcurrentTasksPerContext = 1
	p.MaxActiveContextsPerAgent = 2 * contexts
	p.InputRequiredTimeout = 10 * time.Minute
	a := benchAgent(b, p, contexts)
	if os.Getenv("BENCH_NOGC") != "" {
		// Separate the code's latency from the runtime's: warm the heap
		// (no page faults) and pause the GC (no assists, no sweeping).
		warm := make([][]byte, 1<<20)
		for i := range warm {
			warm[i] = make([]byte, 512)
		}
		runtime.KeepAlive(warm)
		runtime.GC()
		runtime.GC()
		defer debug.SetGCPercent(debug.SetGCPercent(-1))
	}
	r := rand.New(rand.NewPCG(1, 2))
	decide := make([]time.Duration, 0, b.N)
	decideCPU := make([]time.Duration, 0, b.N)
	observe := make([]time.Duration, 0, b.N)
	now := t0
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(time.Millisecond)
		cid := "ctx-" + strconv.Itoa(r.IntN(contexts))
		tid := cid + "-n" + strconv.Itoa(i)
		req := send(tid, cid, "m"+strconv.Itoa(i), tid)

		cpu := threadCPU()
		start := time.Now()
		d := a.Decide(p, now, req)
		decide = append(decide, time.Since(start))
		decideCPU = append(decideCPU, threadCPU()-cpu)
		if d.Kind != KindNewTask {
			b.Fatalf("decision %s %v", d.Kind, d.Err)
		}

		start = time.Now()
		a.Observe(p, now, Event{Kind: EventStatus, TaskID: tid, State: completed, Correlation: req.Correlation})
		observe = append(observe, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(decide)
	slices.Sort(decideCPU)
	slices.Sort(observe)
	b.ReportMetric(float64(percentile(decide, 0.50).Nanoseconds()), "decide-p50-ns")
	b.ReportMetric(float64(percentile(decide, 0.99).Nanoseconds()), "decide-p99-ns")
	b.ReportMetric(float64(percentile(decideCPU, 0.50).Nanoseconds()), "decide-cpu-p50-ns")
	b.ReportMetric(float64(percentile(decideCPU, 0.99).Nanoseconds()), "decide-cpu-p99-ns")
	b.ReportMetric(float64(percentile(observe, 0.50).Nanoseconds()), "observe-p50-ns")
	b.ReportMetric(float64(percentile(observe, 0.99).Nanoseconds()), "observe-p99-ns")
	b.ReportMetric(float64(a.Live()), "live-contexts")
}

// BenchmarkDecideNewContext measures opening a context (the active-context
// limit check) with 100k live contexts.
func BenchmarkDecideNewContext(b *testing.B) {
	const contexts = 100_000
	p := DefaultPolicy()
	p.MaxActiveContextsPerAgent = contexts + 1_000_000
	a := benchAgent(b, p, contexts)
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := "new-" + strconv.Itoa(i)
		start := time.Now()
		d := a.Decide(p, t0.Add(time.Second), send(id, id, "m", id))
		lat = append(lat, time.Since(start))
		if d.Kind != KindNewContext {
			b.Fatalf("decision %s %v", d.Kind, d.Err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 0.50).Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(percentile(lat, 0.99).Nanoseconds()), "p99-ns")
}
