package convstore

import (
	"context"
	"encoding/json"
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

	"github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// BenchmarkHistoryModes measures what history mode Messages costs next to
// Summaries, in the same run: n contexts (BENCH_HISTORY_CONTEXTS, default
// 10 000) of five turns each, a turn being Memory.Decide of the request
// (with its ~260-byte message as history item in Messages mode) and
// Memory.Observe of the completion (with the agent's ~200-byte status
// message), journaled to bbolt without fsync (the commit is measured by
// BenchmarkDecide). Reports per mode the thread CPU per turn (p50, mean),
// the heap the state holds per context, the bytes stored per context
// (header, task and history records) and the records per context; and the
// Messages/Summaries ratios.
//
//	go test -run '^$' -bench BenchmarkHistoryModes -benchtime 1x ./internal/convstore/
func BenchmarkHistoryModes(b *testing.B) {
	n := 10_000
	if v, err := strconv.Atoi(os.Getenv("BENCH_HISTORY_CONTEXTS")); err == nil {
		n = v
	}
	const turns = 5
	type result struct {
		cpuP50, cpuMean            float64 // µs per turn
		heapPerCtx, storePerCtx    float64 // bytes
		recordsPerCtx, itemsPerCtx float64
	}
	run := func(b *testing.B, mode v1alpha1.HistoryMode) result {
		p := benchPolicy()
		p.History = mode
		j, err := OpenBoltJournal(filepath.Join(b.TempDir(), "h.db"), &BoltOptions{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		defer j.Close()
		m := NewMemory(j, true)
		text := strings.Repeat("a question of about one hundred and twenty characters ", 3)[:120]
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		cpu := make([]time.Duration, 0, n*turns)
		var total time.Duration
		var last *Ticket
		runtime.LockOSThread()
		for i := range n {
			cid := fmt.Sprintf("%08d-1111-4111-8111-111111111111", i)
			for k := range turns {
				tid := fmt.Sprintf("%08d-2222-4222-8222-%012d", i, k)
				corr := fmt.Sprintf("%032x", i*turns+k)
				req := send(tid, cid, tid+"-m", corr)
				req.ResponseTopic = "$a2a/v1/reply/org/unit/requester/0123456789abcdef0123456789abcdef"
				user := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
				user.ID, user.TaskID, user.ContextID = req.MessageID, a2a.TaskID(tid), cid
				answer := a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart("answer: "+text[:60]))
				ub, _ := json.Marshal(user)
				ab, _ := json.Marshal(answer)
				start := threadCPU()
				if _, _, err := m.Decide(benchAgent, p, t0, req, Item{Kind: ItemMessage, Key: user.ID, Data: ub}); err != nil {
					b.Fatal(err)
				}
				_, t, err := m.Observe(benchAgent, p, t0, status(tid, corr, a2a.TaskStateCompleted), Item{Kind: ItemMessage, Key: answer.ID, Data: ab})
				if err != nil {
					b.Fatal(err)
				}
				d := threadCPU() - start
				cpu = append(cpu, d)
				total += d
				last = t
			}
		}
		runtime.UnlockOSThread()
		if err := last.Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		var stored, records, items int
		if err := j.Load(context.Background(), benchAgent, func(_ string, c *conversation.Context, its []*Item) error {
			stored += len(encodeHeader(c))
			records++
			for _, t := range c.Tasks {
				stored += len(encodeTask(t))
				records++
			}
			for _, it := range its {
				stored += len(encodeItem(it))
				records++
				items++
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		runtime.KeepAlive(m)
		slices.Sort(cpu)
		return result{
			cpuP50: pct(cpu, 0.5), cpuMean: float64(total.Nanoseconds()) / 1e3 / float64(len(cpu)),
			heapPerCtx:    (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(n),
			storePerCtx:   float64(stored) / float64(n),
			recordsPerCtx: float64(records) / float64(n), itemsPerCtx: float64(items) / float64(n),
		}
	}
	for range b.N {
		res := map[v1alpha1.HistoryMode]result{}
		for _, mode := range []v1alpha1.HistoryMode{v1alpha1.HistorySummaries, v1alpha1.HistoryMessages} {
			r := run(b, mode)
			res[mode] = r
			name := strings.ToLower(string(mode))
			b.ReportMetric(r.cpuP50, name+"-cpu-p50-µs/turn")
			b.ReportMetric(r.cpuMean, name+"-cpu-mean-µs/turn")
			b.ReportMetric(r.heapPerCtx, name+"-heap-B/context")
			b.ReportMetric(r.storePerCtx, name+"-store-B/context")
			b.ReportMetric(r.recordsPerCtx, name+"-records/context")
		}
		s, m := res[v1alpha1.HistorySummaries], res[v1alpha1.HistoryMessages]
		b.ReportMetric(m.cpuMean/s.cpuMean, "cpu-messages/summaries")
		b.ReportMetric(m.heapPerCtx/s.heapPerCtx, "heap-messages/summaries")
		b.ReportMetric(m.storePerCtx/s.storePerCtx, "store-messages/summaries")
		b.ReportMetric(m.itemsPerCtx, "messages-items/context")
		b.ReportMetric(float64(n), "contexts")
		if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
			b.Logf("load average: %s", strings.Join(strings.Fields(string(raw))[:3], " "))
		}
	}
}
