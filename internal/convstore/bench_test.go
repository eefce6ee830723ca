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
	"github.com/redis/go-redis/v9"
	bolt "go.etcd.io/bbolt"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// benchContext is a realistic stored context: two finished turns and one
// task waiting for input, UUID-sized ids.
func benchContext(i int, now time.Time, p conversation.Policy) *conversation.Context {
	a := conversation.NewAgent()
	cid := fmt.Sprintf("%08d-1111-4111-8111-111111111111", i)
	for j := 0; j < 3; j++ {
		tid := fmt.Sprintf("%08d-2222-4222-8222-%012d", i, j)
		corr := []byte(fmt.Sprintf("%032x", i*3+j))
		a.Decide(p, now, conversation.Request{
			Method: conversation.MethodSendStreamingMessage, TaskID: tid, ContextID: cid,
			MessageID: tid + "-m", Correlation: corr, Requester: "org/unit/requester",
			ResponseTopic: "$a2a/v1/reply/org/unit/requester/0123456789abcdef0123456789abcdef",
		})
		state := a2a.TaskStateCompleted
		if j == 2 {
			state = a2a.TaskStateInputRequired
		}
		a.Observe(p, now, conversation.Event{Kind: conversation.EventStatus, TaskID: tid, State: state, Correlation: corr})
	}
	return a.Context(cid)
}

// bulkLoad writes contexts in one bbolt transaction (building a large
// store with one fsync per context would take minutes).
func bulkLoad(s *Bolt, agent string, cs []*conversation.Context) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, c := range cs {
			if err := s.commit(tx, Key{Agent: agent, ContextID: c.ID}, nil, c); err != nil {
				return err
			}
		}
		return nil
	})
}

func rssKB() (rss, hwm int) {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "VmRSS:":
			rss = n
		case "VmHWM:":
			hwm = n
		}
	}
	return rss, hwm
}

// BenchmarkBoltRecovery measures a restart: open the bbolt file holding
// 100k contexts (300k task summaries) and rebuild the in-memory state
// (convstore.Recover → one conversation.Agent per agent). Reports the time,
// the heap the recovered state keeps, the process RSS and the file size.
//
//	go test -run '^$' -bench BenchmarkBoltRecovery -benchtime 3x ./internal/convstore/
func BenchmarkBoltRecovery(b *testing.B) {
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("BENCH_CONTEXTS")); err == nil {
		n = v
	}
	p := conversation.DefaultPolicy()
	p.InputRequiredTimeout = time.Hour
	path := filepath.Join(b.TempDir(), "conv.db")
	s, err := OpenBolt(path, &BoltOptions{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]*conversation.Context, 0, 10_000)
	for i := 0; i < n; i++ {
		batch = append(batch, benchContext(i, t0, p))
		if len(batch) == cap(batch) || i == n-1 {
			if err := bulkLoad(s, "org/unit/agent", batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	var before, after runtime.MemStats
	var elapsed time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()
		start := time.Now()
		s, err := OpenBolt(path, nil)
		if err != nil {
			b.Fatal(err)
		}
		agents, err := Recover(context.Background(), s)
		if err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		b.StopTimer()
		if got, _ := agents["org/unit/agent"].Len(); got != n {
			b.Fatalf("recovered %d contexts, want %d", got, n)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		rss, hwm := rssKB()
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "state-heap-MB")
		b.ReportMetric(float64(rss)/1024, "rss-MB")
		b.ReportMetric(float64(hwm)/1024, "peak-rss-MB")
		runtime.KeepAlive(agents)
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(elapsed.Milliseconds())/float64(b.N), "recover-ms")
	b.ReportMetric(float64(n), "contexts")
	b.ReportMetric(float64(fi.Size())/(1<<20), "file-MB")
}

// benchStoreDecide measures one follow-up turn through the store
// (convstore.Decide: load, decide, commit) and its completion (Observe).
func benchStoreDecide(b *testing.B, s Store) {
	ctx := context.Background()
	p := conversation.DefaultPolicy()
	p.MaxConcurrentTasksPerContext = 1
	const contexts = 1000
	for i := 0; i < contexts; i++ {
		id := fmt.Sprintf("C%d", i)
		if _, err := Decide(ctx, s, "b", p, t0, send(id+"-T", id, "m", id)); err != nil {
			b.Fatal(err)
		}
		if _, err := Observe(ctx, s, "b", p, t0, status(id+"-T", id, a2a.TaskStateCompleted)); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("C%d", i%contexts)
		tid := fmt.Sprintf("%s-T%d", id, i)
		start := time.Now()
		d, err := Decide(ctx, s, "b", p, t0, send(tid, id, "m", tid))
		lat = append(lat, time.Since(start))
		if err != nil || d.Kind != conversation.KindNewTask {
			b.Fatalf("%s %v %v", d.Kind, d.Err, err)
		}
		if _, err := Observe(ctx, s, "b", p, t0, status(tid, tid, a2a.TaskStateCompleted)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "decide-p50-µs")
	b.ReportMetric(float64(lat[(len(lat)-1)*99/100].Microseconds()), "decide-p99-µs")
}

// BenchmarkStoreDecide compares a decision round trip through each store.
// Bolt syncs every commit (the default), Redis runs on loopback.
//
//	go test -run '^$' -bench BenchmarkStoreDecide -benchtime 2000x ./internal/convstore/
func BenchmarkStoreDecide(b *testing.B) {
	b.Run("bolt", func(b *testing.B) {
		s, err := OpenBolt(filepath.Join(b.TempDir(), "conv.db"), nil)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		benchStoreDecide(b, s)
	})
	b.Run("redis", func(b *testing.B) {
		s := NewRedis(redis.NewClient(&redis.Options{Addr: startRedis(b)}), "bench")
		defer s.Close()
		benchStoreDecide(b, s)
	})
}
