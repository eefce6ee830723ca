package convstore

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// The batched lease calls of a replica's round do what their per-agent forms
// do, across several pipelines (more agents than leaseBatch) and on a server
// that has not loaded the lease script yet (NOSCRIPT, then a retry).
func TestBatchedLeasesMatchPerAgent(t *testing.T) { onRedisStores(t, batchedLeasesMatchPerAgent) }

func batchedLeasesMatchPerAgent(t *testing.T, openStore func(prefix string) *RedisJournal) {
	ctx := context.Background()
	open := func() *RedisJournal { return openStore("batch") }
	mine, other := open(), open()
	defer mine.Close()
	defer other.Close()
	n := 2*leaseBatch + 7
	agents := make([]string, n)
	for i := range agents {
		agents[i] = fmt.Sprintf("o/u/a%d", i)
	}
	// Another replica holds every third agent; nobody holds the rest yet.
	for i := 0; i < n; i += 3 {
		if ok, err := other.Acquire(ctx, agents[i], "r2/x", time.Minute); err != nil || !ok {
			t.Fatalf("r2 acquire %s: %v %v", agents[i], ok, err)
		}
	}
	if err := mine.c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	held, err := mine.RenewLeases(ctx, agents, "r1/x", time.Minute)
	if err != nil {
		t.Fatalf("renew after SCRIPT FLUSH: %v", err)
	}
	if len(held) != n {
		t.Fatalf("%d answers for %d agents", len(held), n)
	}
	for i, agent := range agents {
		if want := i%3 != 0; held[i] != want {
			t.Errorf("%s: held %v, want %v", agent, held[i], want)
		}
		// The same answer as Acquire, which also proves the lease was taken or left.
		if ok, err := mine.Acquire(ctx, agent, "r1/x", time.Minute); err != nil || ok != held[i] {
			t.Errorf("%s: Acquire says %v (%v), RenewLeases said %v", agent, ok, err, held[i])
		}
	}
	ttl, err := mine.c.PTTL(ctx, mine.base(agents[1])+"owner").Result()
	if err != nil || ttl <= 50*time.Second {
		t.Errorf("renewed lease has %s left (%v), want about a minute", ttl, err)
	}

	// Inboxes: events for some agents, in order, taken once.
	ev := func(task string) conversation.Event {
		return conversation.Event{Kind: conversation.EventStatus, TaskID: task, ContextID: "C", State: "completed", Final: true}
	}
	for _, i := range []int{1, leaseBatch + 1, n - 1} {
		for k := range 3 {
			if err := other.PushEvent(ctx, agents[i], ev(fmt.Sprintf("T%d-%d", i, k))); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := mine.PopInboxes(ctx, agents, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("inboxes with events: %d, want 3: %v", len(got), got)
	}
	for _, i := range []int{1, leaseBatch + 1, n - 1} {
		evs := got[agents[i]]
		if len(evs) != 2 || evs[0].TaskID != fmt.Sprintf("T%d-0", i) || evs[1].TaskID != fmt.Sprintf("T%d-1", i) || !evs[1].Final {
			t.Errorf("%s: popped %+v", agents[i], evs)
		}
		rest, err := mine.PopEvents(ctx, agents[i], 10)
		if err != nil || len(rest) != 1 || rest[0].TaskID != fmt.Sprintf("T%d-2", i) {
			t.Errorf("%s: left in the inbox %+v (%v)", agents[i], rest, err)
		}
	}

	// Release gives up only what this token holds.
	if err := mine.ReleaseLeases(ctx, agents, "r1/x"); err != nil {
		t.Fatal(err)
	}
	for i, agent := range agents {
		owner, err := mine.c.Get(ctx, mine.base(agent)+"owner").Result()
		switch {
		case i%3 == 0 && owner != "r2/x":
			t.Errorf("%s: the other replica's lease went: %q %v", agent, owner, err)
		case i%3 != 0 && err != redis.Nil:
			t.Errorf("%s: still leased after release: %q %v", agent, owner, err)
		}
	}
}

// BenchmarkLeaseRound measures a replica's periodic round over the agents it
// holds (renew every lease, read every inbox) against a real redis-server:
// one round trip per agent and call, as before, against the pipelined calls.
// BENCH_LEASE_AGENTS sets the number of agents (default 1 000).
//
//	go test ./internal/convstore/ -run '^$' -bench BenchmarkLeaseRound -benchtime 20x
func BenchmarkLeaseRound(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("BENCH_LEASE_AGENTS")); err == nil && v > 0 {
		n = v
	}
	addr := startRedis(b)
	ctx := context.Background()
	j := NewRedisJournal(redis.NewClient(&redis.Options{Addr: addr}), "bench")
	defer j.Close()
	agents := make([]string, n)
	for i := range agents {
		agents[i] = fmt.Sprintf("org/unit/agent-%d", i)
	}
	if _, err := j.RenewLeases(ctx, agents, "r1/x", time.Minute); err != nil {
		b.Fatal(err)
	}
	// CPU per round: this process (the replica's side) and redis-server's
	// (INFO cpu), besides the wall time.
	measure := func(b *testing.B, round func()) {
		self0, redis0 := processCPU(), redisCPU(b, j)
		for b.Loop() {
			round()
		}
		self, srv := processCPU()-self0, redisCPU(b, j)-redis0
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/round")
		b.ReportMetric(float64(self.Microseconds())/float64(b.N)/1000, "replica-cpu-ms/round")
		b.ReportMetric(float64(srv.Microseconds())/float64(b.N)/1000, "redis-cpu-ms/round")
	}
	b.Run(fmt.Sprintf("per-agent/agents=%d", n), func(b *testing.B) {
		measure(b, func() {
			for _, a := range agents {
				if ok, err := j.Acquire(ctx, a, "r1/x", time.Minute); err != nil || !ok {
					b.Fatalf("renew %s: %v %v", a, ok, err)
				}
				if _, err := j.PopEvents(ctx, a, 256); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run(fmt.Sprintf("batched/agents=%d", n), func(b *testing.B) {
		measure(b, func() {
			held, err := j.RenewLeases(ctx, agents, "r1/x", time.Minute)
			if err != nil || len(held) != n {
				b.Fatalf("renew: %v", err)
			}
			if _, err := j.PopInboxes(ctx, agents, 256); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// processCPU is this process's user+system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is redis-server's user+system CPU time so far (INFO cpu).
func redisCPU(b *testing.B, j *RedisJournal) time.Duration {
	info, err := j.c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}
