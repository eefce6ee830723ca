package convstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/redis/go-redis/v9"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/redistest"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func send(task, ctx, msg, corr string) conversation.Request {
	return conversation.Request{
		Method: conversation.MethodSendMessage, TaskID: task, ContextID: ctx, MessageID: msg,
		Correlation: []byte(corr), ResponseTopic: "$a2a/v1/reply/org/unit/a/r", Requester: "org/unit/a",
	}
}

func status(task, corr string, s a2a.TaskState) conversation.Event {
	return conversation.Event{Kind: conversation.EventStatus, TaskID: task, State: s, Correlation: []byte(corr)}
}

// journalKind opens a journal on one storage; reopen returns a journal on
// the same storage (a restart).
type journalKind struct {
	name string
	open func(t *testing.T) (first Journal, reopen func() Journal)
}

func journals(t *testing.T) []journalKind {
	addr := startRedis(t)
	// A cluster of 3 primaries with a replica each, commits waiting for it
	// (one pipeline and one WAIT per shard).
	cluster := redistest.StartCluster(t, 3, 1).StoreURL("wait_replicas=1")
	n := 0
	return []journalKind{
		{"bolt", func(t *testing.T) (Journal, func() Journal) {
			path := filepath.Join(t.TempDir(), "conv.db")
			open := func() Journal {
				j, err := OpenBoltJournal(path, &BoltOptions{Timeout: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				return j
			}
			return open(), open
		}},
		{"redis", func(t *testing.T) (Journal, func() Journal) {
			n++
			prefix := fmt.Sprintf("t%d", n)
			open := func() Journal { return NewRedisJournal(redis.NewClient(&redis.Options{Addr: addr}), prefix) }
			return open(), open
		}},
		{"redis-cluster", func(t *testing.T) (Journal, func() Journal) {
			n++
			prefix := fmt.Sprintf("t%d", n)
			open := func() Journal { return openRedisURL(t, cluster, prefix) }
			return open(), open
		}},
	}
}

func mustDecide(t *testing.T, m *Memory, agent string, p conversation.Policy, now time.Time, req conversation.Request, want conversation.Kind) conversation.Decision {
	t.Helper()
	d, tk, err := m.Decide(agent, p, now, req)
	if err == nil {
		err = tk.Wait(context.Background())
	}
	if err != nil || d.Kind != want {
		t.Fatalf("decide %s/%s: %s %v %v, want %s", req.TaskID, req.ContextID, d.Kind, d.Err, err, want)
	}
	return d
}

func mustObserve(t *testing.T, m *Memory, agent string, p conversation.Policy, now time.Time, ev conversation.Event) conversation.Outcome {
	t.Helper()
	o, tk, err := m.Observe(agent, p, now, ev)
	if err == nil {
		err = tk.Wait(context.Background())
	}
	if err != nil {
		t.Fatalf("observe %s: %v", ev.TaskID, err)
	}
	return o
}

// snapshot renders every context of a Memory for comparison.
func snapshot(m *Memory) map[string]*conversation.Context {
	out := map[string]*conversation.Context{}
	for _, a := range m.Agents() {
		st, _ := m.agent(a)
		st.a.Range(func(c *conversation.Context) bool {
			out[a+"/"+c.ID] = c.DeepClone()
			return true
		})
		st.mu.Unlock()
	}
	return out
}

func TestMemoryJournals(t *testing.T) {
	for _, jk := range journals(t) {
		t.Run(jk.name, func(t *testing.T) {
			t.Run("state survives a restart record for record", func(t *testing.T) {
				j, reopen := jk.open(t)
				m := NewMemory(j, true)
				p := conversation.DefaultPolicy()
				p.MaxConcurrentTasksPerContext = 1
				p.InputRequiredTimeout = time.Hour
				p.HistoryTasksPerContext = 3
				for _, agent := range []string{"o/u/a", "o/u/b"} {
					for i := range 20 {
						c := fmt.Sprintf("C%d", i)
						for k := range 5 { // past the history bound: evictions
							task := fmt.Sprintf("%s-T%d", c, k)
							mustDecide(t, m, agent, p, t0, send(task, c, "m", task), map[bool]conversation.Kind{true: conversation.KindNewContext, false: conversation.KindNewTask}[k == 0])
							st := a2a.TaskStateCompleted
							if k == 4 && i%2 == 0 {
								st = a2a.TaskStateInputRequired
							}
							mustObserve(t, m, agent, p, t0.Add(time.Second), status(task, task, a2a.TaskStateWorking))
							mustObserve(t, m, agent, p, t0.Add(2*time.Second), status(task, task, st))
						}
					}
				}
				want := snapshot(m)
				if err := j.Close(); err != nil {
					t.Fatal(err)
				}
				j2 := reopen()
				defer j2.Close()
				m2 := NewMemory(j2, true)
				if err := m2.Recover(context.Background(), "", nil); err != nil {
					t.Fatal(err)
				}
				got := snapshot(m2)
				if len(got) != 40 || !reflect.DeepEqual(got, want) {
					for k, w := range want {
						if !reflect.DeepEqual(got[k], w) {
							t.Fatalf("%s recovered as\n%+v\nstored\n%+v", k, got[k], w)
						}
					}
					t.Fatalf("recovered %d contexts, want %d", len(got), len(want))
				}
				// The recovered state decides like the original: the waiting
				// task resumes, the evicted task is unknown.
				mustDecide(t, m2, "o/u/a", p, t0.Add(time.Minute), send("C0-T4", "C0", "m2", "D"), conversation.KindResume)
				if _, ok := m2.TaskContext("o/u/a", "C0-T0"); ok {
					t.Fatal("evicted task recovered")
				}
				live, states := m2.Stats()
				if live["o/u/a"] != 20 || states[a2a.TaskStateCompleted] != 2*20*3-10-10 {
					t.Fatalf("stats %v %v", live, states)
				}
			})

			t.Run("a durable decision implies every earlier change is durable", func(t *testing.T) {
				j, reopen := jk.open(t)
				m := NewMemory(j, true)
				p := conversation.DefaultPolicy()
				// Not waited on: written behind.
				if _, _, err := m.Decide("o/u/a", p, t0, send("A", "CA", "m", "DA")); err != nil {
					t.Fatal(err)
				}
				if _, _, err := m.Observe("o/u/a", p, t0, status("A", "DA", a2a.TaskStateWorking)); err != nil {
					t.Fatal(err)
				}
				mustDecide(t, m, "o/u/b", p, t0, send("B", "CB", "m", "DB"), conversation.KindNewContext)
				// Read what is durable now through a second journal handle
				// where the storage allows it (Redis); bbolt: after close.
				var m2 *Memory
				if strings.HasPrefix(jk.name, "redis") {
					j2 := reopen()
					defer j2.Close()
					m2 = NewMemory(j2, true)
				} else {
					_ = j.Close()
					j2 := reopen()
					defer j2.Close()
					m2 = NewMemory(j2, true)
				}
				if err := m2.Recover(context.Background(), "", nil); err != nil {
					t.Fatal(err)
				}
				c := m2.Context("o/u/a", "CA")
				if c == nil || c.Task("A").State != a2a.TaskStateWorking || m2.Context("o/u/b", "CB") == nil {
					t.Fatalf("durable state %+v", snapshot(m2))
				}
				if strings.HasPrefix(jk.name, "redis") {
					_ = j.Close()
				}
			})

			t.Run("concurrent decisions share group commits", func(t *testing.T) {
				j, _ := jk.open(t)
				defer j.Close()
				m := NewMemory(j, true)
				p := conversation.DefaultPolicy()
				const n = 200
				var wg sync.WaitGroup
				errs := make(chan error, n)
				for i := range n {
					wg.Go(func() {
						_, tk, err := m.Decide(fmt.Sprintf("o/u/a%d", i%4), p, t0, send(fmt.Sprintf("T%d", i), fmt.Sprintf("C%d", i), "m", "D"))
						if err == nil {
							err = tk.Wait(context.Background())
						}
						errs <- err
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Fatal(err)
					}
				}
				if b, ok := j.(*BoltJournal); ok {
					commits, changes := b.Stats()
					t.Logf("%d changes in %d group commits", changes, commits)
					if changes != n || commits >= n {
						t.Fatalf("%d changes in %d commits: not grouped", changes, commits)
					}
				}
			})

			t.Run("expiry deletes records", func(t *testing.T) {
				j, reopen := jk.open(t)
				m := NewMemory(j, true)
				p := conversation.DefaultPolicy()
				p.IdleTTL = time.Minute
				p.TombstoneTTL = 10 * time.Minute
				mustDecide(t, m, "o/u/a", p, t0, send("T1", "C1", "m", "D1"), conversation.KindNewContext)
				mustObserve(t, m, "o/u/a", p, t0, status("T1", "D1", a2a.TaskStateCompleted))
				swept, tk := m.Sweep(func(string) conversation.Policy { return p }, t0.Add(2*time.Minute))
				if err := tk.Wait(context.Background()); err != nil || len(swept) != 1 || swept[0].Expired == nil {
					t.Fatalf("sweep %+v %v", swept, err)
				}
				swept, tk = m.Sweep(func(string) conversation.Policy { return p }, t0.Add(time.Hour))
				if err := tk.Wait(context.Background()); err != nil || len(swept) != 1 || !swept[0].Delete {
					t.Fatalf("second sweep %+v %v", swept, err)
				}
				_ = j.Close()
				j2 := reopen()
				defer j2.Close()
				n := 0
				if err := j2.Load(context.Background(), "", func(string, *conversation.Context, []*Item) error { n++; return nil }); err != nil || n != 0 {
					t.Fatalf("%d contexts left after expiry (%v)", n, err)
				}
			})
		})
	}
}

// TestRedisFencing: a replica whose lease was taken over can no longer
// commit (the correctness bar of several replicas), and the new owner
// rebuilds what the old one had made durable.
func TestRedisFencing(t *testing.T) { onRedisStores(t, redisFencing) }

func redisFencing(t *testing.T, openStore func(prefix string) *RedisJournal) {
	ctx := context.Background()
	open := func() *RedisJournal { return openStore("fence") }
	j1, j2 := open(), open()
	defer j1.Close()
	defer j2.Close()
	p := conversation.DefaultPolicy()
	p.MaxConcurrentTasksPerContext = 1
	if ok, err := j1.Acquire(ctx, "o/u/a", "r1", time.Minute); err != nil || !ok {
		t.Fatalf("r1 acquire: %v %v", ok, err)
	}
	if ok, _ := j2.Acquire(ctx, "o/u/a", "r2", time.Minute); ok {
		t.Fatal("r2 acquired a held lease")
	}
	m1 := NewMemory(j1, false)
	if _, _, err := m1.Decide("o/u/a", p, t0, send("T0", "C", "m", "D0")); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("decided for an agent it did not recover: %v", err)
	}
	if err := m1.Recover(ctx, "o/u/a", &Fence{Token: "r1"}); err != nil {
		t.Fatal(err)
	}
	mustDecide(t, m1, "o/u/a", p, t0, send("T1", "C", "m", "D1"), conversation.KindNewContext)
	// r1 stalls past its lease; r2 takes the agent over.
	if err := j1.Release(ctx, "o/u/a", "r1"); err != nil {
		t.Fatal(err)
	}
	if ok, err := j2.Acquire(ctx, "o/u/a", "r2", time.Minute); err != nil || !ok {
		t.Fatalf("r2 acquire: %v %v", ok, err)
	}
	m2 := NewMemory(j2, false)
	if err := m2.Recover(ctx, "o/u/a", &Fence{Token: "r2"}); err != nil {
		t.Fatal(err)
	}
	// The stale owner still believes it owns the agent: its commit is refused.
	_, tk, err := m1.Observe("o/u/a", p, t0, status("T1", "D1", a2a.TaskStateCompleted))
	if err == nil {
		err = tk.Wait(ctx)
	}
	if !errors.Is(err, ErrNotOwner) {
		t.Fatalf("stale owner committed: %v", err)
	}
	// The new owner sees T1 as r1 made it durable (working slot held) and
	// refuses a second task past the limit.
	d, _, err := m2.Decide("o/u/a", p, t0, send("T2", "C", "m", "D2"))
	if err != nil || d.Kind != conversation.KindReject || !errors.Is(d.Err, conversation.ErrConcurrencyLimit) {
		t.Fatalf("new owner: %s %v %v", d.Kind, d.Err, err)
	}
	// Events handed over by another replica reach the owner.
	if err := j1.PushEvent(ctx, "o/u/a", status("T1", "D1", a2a.TaskStateCompleted)); err != nil {
		t.Fatal(err)
	}
	evs, err := j2.PopEvents(ctx, "o/u/a", 10)
	if err != nil || len(evs) != 1 || evs[0].TaskID != "T1" || evs[0].State != a2a.TaskStateCompleted || string(evs[0].Correlation) != "D1" {
		t.Fatalf("inbox %+v %v", evs, err)
	}
	mustObserve(t, m2, "o/u/a", p, t0, evs[0])
	mustDecide(t, m2, "o/u/a", p, t0, send("T2", "C", "m", "D2"), conversation.KindNewTask)
}

// TestRedisHandOver: a replica restarted under the same id takes its
// previous run's lease back at once (and that run, were it alive, is fenced
// off and cannot renew); another replica's lease is not taken. A hand-over
// passes the requests the previous owner handled to the next one, which
// drops them as duplicates instead of answering them a second time.
func TestRedisHandOver(t *testing.T) { onRedisStores(t, redisHandOver) }

func redisHandOver(t *testing.T, openStore func(prefix string) *RedisJournal) {
	ctx := context.Background()
	open := func() *RedisJournal { return openStore("handover") }
	j1, j2, j3 := open(), open(), open()
	defer j1.Close()
	defer j2.Close()
	defer j3.Close()
	const agent = "o/u/a"
	p := conversation.DefaultPolicy()
	if ok, err := j1.Acquire(ctx, agent, "r1/run1", time.Minute); err != nil || !ok {
		t.Fatalf("first run acquires: %v %v", ok, err)
	}
	m1 := NewMemory(j1, false)
	if err := m1.Recover(ctx, agent, &Fence{Token: "r1/run1"}); err != nil {
		t.Fatal(err)
	}
	mustDecide(t, m1, agent, p, t0, send("T1", "C", "m1", "D1"), conversation.KindNewContext)
	// Another replica id cannot take it; the same id can (its second run).
	if ok, err := j3.TakeOver(ctx, agent, "r3/run1", "r3/", time.Minute); err != nil || ok {
		t.Fatalf("r3 took r1's lease: %v %v", ok, err)
	}
	if ok, err := j2.TakeOver(ctx, agent, "r1/run2", "r1/", time.Minute); err != nil || !ok {
		t.Fatalf("second run of r1 takes the lease back: %v %v", ok, err)
	}
	// The first run, were it still alive, can neither commit nor renew.
	_, tk, err := m1.Observe(agent, p, t0, status("T1", "D1", a2a.TaskStateCompleted))
	if err == nil {
		err = tk.Wait(ctx)
	}
	if !errors.Is(err, ErrNotOwner) {
		t.Fatalf("first run committed after its lease was taken back: %v", err)
	}
	if ok, _ := j1.Acquire(ctx, agent, "r1/run1", time.Minute); ok {
		t.Fatal("first run renewed a lease its second run holds")
	}
	m2 := NewMemory(j2, false)
	if err := m2.Recover(ctx, agent, &Fence{Token: "r1/run2"}); err != nil {
		t.Fatal(err)
	}
	if _, task := m2.Task(agent, "T1"); task == nil || task.State != a2a.TaskStateSubmitted {
		t.Fatalf("second run recovered %+v", task)
	}
	// Hand-over from r1 (second run) to r3: r1 answered D2 (a read) and D3
	// (a refusal: T1 is busy), both delivered to r3 too.
	if dup, err := m2.Note(agent, []byte("D2")); err != nil || dup {
		t.Fatalf("note: %v %v", dup, err)
	}
	if d := mustDecide(t, m2, agent, p, t0, send("T1", "C", "other", "D3"), conversation.KindReject); d.Err == nil {
		t.Fatal("no refusal")
	}
	durable, handled := m2.Drop(agent)
	if err := durable.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := j2.RecordHandled(ctx, agent, handled, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := j2.Release(ctx, agent, "r1/run2"); err != nil {
		t.Fatal(err)
	}
	if ok, err := j3.TakeOver(ctx, agent, "r3/run1", "r3/", time.Minute); err != nil || !ok {
		t.Fatalf("r3 takes the released lease: %v %v", ok, err)
	}
	m3 := NewMemory(j3, false)
	if err := m3.Recover(ctx, agent, &Fence{Token: "r3/run1"}); err != nil {
		t.Fatal(err)
	}
	got, err := j3.Handled(ctx, agent)
	if err != nil || len(got) != 2 {
		t.Fatalf("handled %q %v, want D2 and D3", got, err)
	}
	m3.Handed(agent, got, time.Minute)
	if dup, err := m3.Note(agent, []byte("D2")); err != nil || !dup {
		t.Fatalf("read answered by r1 not seen as a duplicate: %v %v", dup, err)
	}
	d, tk, err := m3.Decide(agent, p, t0, send("T1", "C", "other", "D3"))
	if err != nil || d.Forward || d.Kind != conversation.KindRetry || tk != nil {
		t.Fatalf("refusal r1 answered decided again: %s forward %v %v", d.Kind, d.Forward, err)
	}
	// A request r1 never saw is decided as usual.
	if dup, err := m3.Note(agent, []byte("D4")); err != nil || dup {
		t.Fatalf("new read: %v %v", dup, err)
	}
	mustObserve(t, m3, agent, p, t0, status("T1", "D1", a2a.TaskStateCompleted))
	mustDecide(t, m3, agent, p, t0, send("T2", "C", "m2", "D5"), conversation.KindNewTask)
}
