package convstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// backing is one store's storage under test. open returns a new Store on
// it (a restart, or another replica when replicas is true); the suite
// closes what it opens.
type backing struct {
	open func(t *testing.T) Store
	// replicas: several Stores may be open on the storage at once (Redis);
	// otherwise (bbolt's file lock) one Store stands in for every replica.
	replicas bool
}

func send(task, ctx, msg, corr string) conversation.Request {
	return conversation.Request{
		Method: conversation.MethodSendMessage, TaskID: task, ContextID: ctx, MessageID: msg,
		Correlation: []byte(corr), ResponseTopic: "$a2a/v1/reply/org/unit/a/r", Requester: "org/unit/a",
	}
}

func status(task, corr string, s a2a.TaskState) conversation.Event {
	return conversation.Event{Kind: conversation.EventStatus, TaskID: task, State: s, Correlation: []byte(corr)}
}

func mustDecide(t *testing.T, s Store, agent string, p conversation.Policy, now time.Time, req conversation.Request, want conversation.Kind) conversation.Decision {
	t.Helper()
	d, err := Decide(context.Background(), s, agent, p, now, req)
	if err != nil {
		t.Fatalf("decide %s %s/%s: %v", req.Method, req.TaskID, req.ContextID, err)
	}
	if d.Kind != want {
		t.Fatalf("decide %s %s/%s: %s (%v), want %s", req.Method, req.TaskID, req.ContextID, d.Kind, d.Err, want)
	}
	return d
}

func mustObserve(t *testing.T, s Store, agent string, p conversation.Policy, now time.Time, ev conversation.Event) conversation.Outcome {
	t.Helper()
	o, err := Observe(context.Background(), s, agent, p, now, ev)
	if err != nil {
		t.Fatalf("observe %s %s: %v", ev.TaskID, ev.State, err)
	}
	return o
}

func mustContext(t *testing.T, s Store, agent, id string) *conversation.Context {
	t.Helper()
	c, err := s.Context(context.Background(), agent, id)
	if err != nil {
		t.Fatalf("context %s/%s: %v", agent, id, err)
	}
	return c
}

// runSuite is the one test suite every Store implementation passes.
func runSuite(t *testing.T, newBacking func(t *testing.T) backing) {
	ctx := context.Background()
	open := func(t *testing.T, b backing) Store {
		s := b.open(t)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}

	t.Run("seed 000 flow through the store", func(t *testing.T) {
		s := open(t, newBacking(t))
		p := conversation.DefaultPolicy()
		p.MaxConcurrentTasksPerContext = 1
		mustDecide(t, s, "b", p, t0, send("T1", "C", "m1", "D1"), conversation.KindNewContext)
		if c := mustContext(t, s, "b", "C"); c.Version != 1 || len(c.Tasks) != 1 || c.Working != 1 {
			t.Fatalf("stored %+v", c)
		}
		o := mustObserve(t, s, "b", p, t0, status("T1", "D1", a2a.TaskStateWorking))
		if !o.Known || o.Stream == nil || string(o.Stream.Correlation) != "D1" {
			t.Fatalf("outcome %+v", o)
		}
		// Completion and follow-up at the same instant: the slot is free.
		if o := mustObserve(t, s, "b", p, t0.Add(time.Second), status("T1", "D1", a2a.TaskStateCompleted)); !o.SlotFreed {
			t.Fatalf("completion did not free the slot: %+v", o)
		}
		mustDecide(t, s, "b", p, t0.Add(time.Second), send("T2", "C", "m2", "D2"), conversation.KindNewTask)
		mustObserve(t, s, "b", p, t0.Add(2*time.Second), status("T2", "D2", a2a.TaskStateInputRequired))
		mustDecide(t, s, "b", p, t0.Add(3*time.Second), send("T2", "", "m3", "D3"), conversation.KindResume)
		d := mustDecide(t, s, "b", p, t0.Add(3*time.Second), send("T2", "C2", "m4", "D4"), conversation.KindReject)
		if d.Err.Code != -32602 {
			t.Fatalf("mismatch: %v", d.Err)
		}
		if id, err := s.TaskContext(ctx, "b", "T2"); err != nil || id != "C" {
			t.Fatalf("task context %q %v", id, err)
		}
		c := mustContext(t, s, "b", "C")
		if len(c.Tasks) != 2 || c.Tasks[0].ID != "T1" || c.Tasks[1].State != a2a.TaskStateSubmitted || c.Version != 6 {
			t.Fatalf("stored %+v (version %d)", c.Tasks, c.Version)
		}
	})

	t.Run("not found", func(t *testing.T) {
		s := open(t, newBacking(t))
		if _, err := s.Context(ctx, "b", "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("context: %v", err)
		}
		if _, err := s.TaskContext(ctx, "b", "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("task: %v", err)
		}
		if n, err := s.LiveContexts(ctx, "b", t0); err != nil || n != 0 {
			t.Fatalf("live: %d %v", n, err)
		}
		if o := mustObserve(t, s, "b", conversation.DefaultPolicy(), t0, status("nope", "D", a2a.TaskStateWorking)); o.Known {
			t.Fatal("unknown task known")
		}
	})

	t.Run("reads and failed functions write nothing", func(t *testing.T) {
		s := open(t, newBacking(t))
		p := conversation.DefaultPolicy()
		mustDecide(t, s, "b", p, t0, send("T1", "C", "m1", "D1"), conversation.KindNewContext)
		mustDecide(t, s, "b", p, t0, conversation.Request{Method: conversation.MethodGetTask, TaskID: "T1"}, conversation.KindRead)
		boom := errors.New("boom")
		err := s.Update(ctx, Key{Agent: "b", ContextID: "C"}, t0, func(tx *Txn) error {
			tx.Delete()
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("update error %v", err)
		}
		if c := mustContext(t, s, "b", "C"); c.Version != 1 {
			t.Fatalf("version %d after reads", c.Version)
		}
	})

	t.Run("live count, sweep, tombstones", func(t *testing.T) {
		s := open(t, newBacking(t))
		p := conversation.DefaultPolicy()
		p.IdleTTL = time.Minute
		p.TombstoneTTL = 10 * time.Minute
		p.InputRequiredTimeout = 20 * time.Second
		policy := func(string) conversation.Policy { return p }
		mustDecide(t, s, "b", p, t0, send("T1", "C1", "m", "D1"), conversation.KindNewContext)
		mustDecide(t, s, "b", p, t0.Add(30*time.Second), send("T2", "C2", "m", "D2"), conversation.KindNewContext)
		mustObserve(t, s, "b", p, t0.Add(40*time.Second), status("T2", "D2", a2a.TaskStateInputRequired))
		mustDecide(t, s, "other", p, t0, send("X1", "C1", "m", "X"), conversation.KindNewContext)
		if n, _ := s.LiveContexts(ctx, "b", t0.Add(50*time.Second)); n != 2 {
			t.Fatalf("live at 50s: %d", n)
		}
		if n, _ := s.LiveContexts(ctx, "b", t0.Add(70*time.Second)); n != 1 {
			t.Fatalf("live at 70s: %d (C1 expired at 60s)", n)
		}
		due, err := s.Due(ctx, t0.Add(62*time.Second), 100)
		if err != nil || len(due) != 3 {
			t.Fatalf("due at 62s: %v %v (C1 of both agents expiry, C2's input timeout)", due, err)
		}
		swept, err := Sweep(ctx, s, policy, t0.Add(62*time.Second), 100)
		if err != nil {
			t.Fatal(err)
		}
		var expired, timedOut int
		for _, x := range swept {
			if x.Expired != nil {
				expired++
			}
			timedOut += len(x.TimedOut)
		}
		if expired != 2 || timedOut != 1 {
			t.Fatalf("swept %+v", swept)
		}
		if c := mustContext(t, s, "b", "C1"); c.Expired == nil || c.Expired.Reason != conversation.ExpiredIdleTTL || len(c.Tasks) != 0 {
			t.Fatalf("C1 %+v", c)
		}
		// The tombstone keeps its tasks indexed: a resume naming only the
		// task gets "context expired", not "contextId required".
		if id, err := s.TaskContext(ctx, "b", "T1"); err != nil || id != "C1" {
			t.Fatalf("task of a tombstone: %q %v", id, err)
		}
		if d := mustDecide(t, s, "b", p, t0.Add(90*time.Second), send("T1", "", "m2", "D9"), conversation.KindReject); d.Err.A2AError != conversation.A2AErrorContextExpired {
			t.Fatalf("resume in expired context: %v", d.Err)
		}
		if c := mustContext(t, s, "b", "C2"); c.Tasks[0].State != a2a.TaskStateFailed {
			t.Fatalf("C2 %+v", c.Tasks[0])
		}
		d := mustDecide(t, s, "b", p, t0.Add(2*time.Minute), send("T3", "C1", "m", "D3"), conversation.KindReject)
		if d.Err.A2AError != conversation.A2AErrorContextExpired {
			t.Fatalf("follow-up in expired context: %v", d.Err)
		}
		if due, _ := s.Due(ctx, t0.Add(2*time.Minute), 100); len(due) != 1 {
			t.Fatalf("due at 2m: %v (C2 idle expiry at 100s)", due)
		}
		if _, err := Sweep(ctx, s, policy, t0.Add(20*time.Minute), 100); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"C1", "C2"} {
			if _, err := s.Context(ctx, "b", id); !errors.Is(err, ErrNotFound) {
				t.Fatalf("tombstone %s not deleted: %v", id, err)
			}
		}
		if _, err := s.TaskContext(ctx, "b", "T1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("task of a deleted tombstone still indexed: %v", err)
		}
		if due, _ := s.Due(ctx, t0.Add(time.Hour), 100); len(due) != 0 {
			t.Fatalf("due after everything was swept: %v", due)
		}
		mustDecide(t, s, "b", p, t0.Add(21*time.Minute), send("T4", "C1", "m", "D4"), conversation.KindNewContext)
	})

	t.Run("history bound keeps the task index in step", func(t *testing.T) {
		s := open(t, newBacking(t))
		p := conversation.DefaultPolicy()
		p.HistoryTasksPerContext = 2
		mustDecide(t, s, "b", p, t0, send("T0", "C", "m", "D0"), conversation.KindNewContext)
		mustObserve(t, s, "b", p, t0, status("T0", "D0", a2a.TaskStateCompleted))
		for i := 1; i <= 4; i++ {
			id := fmt.Sprintf("T%d", i)
			mustDecide(t, s, "b", p, t0, send(id, "C", "m", "D"+id), conversation.KindNewTask)
			mustObserve(t, s, "b", p, t0, status(id, "D"+id, a2a.TaskStateCompleted))
		}
		c := mustContext(t, s, "b", "C")
		if len(c.Tasks) != 2 || c.Tasks[0].ID != "T3" || c.Tasks[1].ID != "T4" {
			t.Fatalf("history %+v", c.Tasks)
		}
		for _, id := range []string{"T0", "T1", "T2"} {
			if _, err := s.TaskContext(ctx, "b", id); !errors.Is(err, ErrNotFound) {
				t.Fatalf("evicted %s still indexed: %v", id, err)
			}
		}
	})

	t.Run("delete", func(t *testing.T) {
		s := open(t, newBacking(t))
		p := conversation.DefaultPolicy()
		mustDecide(t, s, "b", p, t0, send("T1", "C", "m", "D1"), conversation.KindNewContext)
		if err := s.Update(ctx, Key{Agent: "b", ContextID: "C"}, t0, func(tx *Txn) error { tx.Delete(); return nil }); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Context(ctx, "b", "C"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("context: %v", err)
		}
		if _, err := s.TaskContext(ctx, "b", "T1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("task: %v", err)
		}
		if n, _ := s.LiveContexts(ctx, "b", t0); n != 0 {
			t.Fatalf("live %d", n)
		}
		if due, _ := s.Due(ctx, t0.Add(24*time.Hour), 10); len(due) != 0 {
			t.Fatalf("due %v", due)
		}
	})

	t.Run("recovery after restart", func(t *testing.T) {
		b := newBacking(t)
		s := b.open(t)
		p := conversation.DefaultPolicy()
		want := map[string]*conversation.Context{}
		for _, agent := range []string{"a1", "a2"} {
			for i := 0; i < 50; i++ {
				id := fmt.Sprintf("C%d", i)
				mustDecide(t, s, agent, p, t0, send(agent+"-T"+id, id, "m", "D"), conversation.KindNewContext)
				if i%2 == 0 {
					mustObserve(t, s, agent, p, t0, status(agent+"-T"+id, "D", a2a.TaskStateInputRequired))
				}
				want[agent+"/"+id] = mustContext(t, s, agent, id)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = open(t, b)
		agents, err := Recover(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if len(agents) != 2 {
			t.Fatalf("%d agents recovered", len(agents))
		}
		n := 0
		for name, a := range agents {
			a.Range(func(c *conversation.Context) bool {
				n++
				w := want[name+"/"+c.ID]
				if w == nil || w.Version != c.Version || len(w.Tasks) != len(c.Tasks) || w.Tasks[0].State != c.Tasks[0].State ||
					len(w.Tasks[0].Streams) != len(c.Tasks[0].Streams) || !w.NextDeadline.Equal(c.NextDeadline) {
					t.Errorf("recovered %s/%s = %+v, stored %+v", name, c.ID, c, w)
				}
				return true
			})
			if _, ok := a.TaskContext(name + "-TC7"); !ok {
				t.Errorf("task index of %s not rebuilt", name)
			}
		}
		if n != 100 {
			t.Fatalf("%d contexts recovered", n)
		}
		// The recovered state decides like the store does.
		d := agents["a1"].Decide(p, t0, send("a1-TC0", "C0", "m2", "D2"))
		if d.Kind != conversation.KindResume {
			t.Fatalf("resume on recovered state: %s %v", d.Kind, d.Err)
		}
	})

	// race runs n deciders at once, spread over replicas when the backing
	// has several, and returns their decisions.
	replicas := func(t *testing.T, b backing) []Store {
		stores := []Store{open(t, b)}
		if b.replicas {
			stores = append(stores, open(t, b), open(t, b))
		}
		return stores
	}
	race := func(t *testing.T, stores []Store, p conversation.Policy, reqs []conversation.Request) []conversation.Decision {
		t.Helper()
		out := make([]conversation.Decision, len(reqs))
		errs := make([]error, len(reqs))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, req := range reqs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				out[i], errs[i] = Decide(ctx, stores[i%len(stores)], "b", p, t0.Add(time.Minute), req)
			}()
		}
		close(start)
		wg.Wait()
		var conflicts int64
		for _, s := range stores {
			if r, ok := s.(interface{ Conflicts() int64 }); ok {
				conflicts += r.Conflicts()
			}
		}
		t.Logf("%d racers on %d store(s): %d optimistic conflicts re-decided", len(reqs), len(stores), conflicts)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("decider %d: %v", i, err)
			}
		}
		return out
	}
	count := func(ds []conversation.Decision, k conversation.Kind, sentinel error) (n, other int) {
		for _, d := range ds {
			switch {
			case d.Kind == k:
				n++
			case d.Kind == conversation.KindReject && errors.Is(d.Err, sentinel):
			default:
				other++
			}
		}
		return n, other
	}
	const racers = 8

	t.Run("a commit interleaved between read and write is re-decided", func(t *testing.T) {
		stores := replicas(t, newBacking(t))
		a, b := stores[0], stores[len(stores)-1]
		p := conversation.DefaultPolicy()
		p.MaxActiveContextsPerAgent = 1
		runs := 0
		var d conversation.Decision
		req := send("TA", "CA", "m", "DA")
		err := a.Update(ctx, Key{Agent: "b", ContextID: "CA", TaskID: "TA"}, t0, func(tx *Txn) error {
			runs++
			if runs == 1 {
				// Another replica takes the agent's only context slot
				// after this one read the state and before it commits.
				mustDecide(t, b, "b", p, t0, send("TB", "CB", "m", "DB"), conversation.KindNewContext)
			}
			d = conversation.Decide(p, t0, tx.View, req)
			apply(tx, d.Changed, d.Context)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if runs != 2 || d.Kind != conversation.KindReject || !errors.Is(d.Err, conversation.ErrActiveContextsLimit) {
			t.Fatalf("after %d runs: %s %v", runs, d.Kind, d.Err)
		}
		if _, err := a.Context(ctx, "b", "CA"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the losing decision was committed: %v", err)
		}
	})

	t.Run("racing new contexts past the agent limit: exactly one wins", func(t *testing.T) {
		for round := 0; round < 5; round++ {
			stores := replicas(t, newBacking(t))
			p := conversation.DefaultPolicy()
			p.MaxActiveContextsPerAgent = 1
			var reqs []conversation.Request
			for i := 0; i < racers; i++ {
				id := fmt.Sprintf("%d", i)
				reqs = append(reqs, send("T"+id, "C"+id, "m", "D"+id))
			}
			ds := race(t, stores, p, reqs)
			if won, other := count(ds, conversation.KindNewContext, conversation.ErrActiveContextsLimit); won != 1 || other != 0 {
				t.Fatalf("round %d: %d new contexts, %d unexpected decisions: %+v", round, won, other, ds)
			}
			s := stores[0]
			if n, _ := s.LiveContexts(ctx, "b", t0.Add(time.Minute)); n != 1 {
				t.Fatalf("round %d: %d live contexts", round, n)
			}
		}
	})

	t.Run("racing tasks past the context limit: exactly one wins", func(t *testing.T) {
		for round := 0; round < 5; round++ {
			stores := replicas(t, newBacking(t))
			p := conversation.DefaultPolicy()
			p.MaxConcurrentTasksPerContext = 1
			s := stores[0]
			mustDecide(t, s, "b", p, t0, send("T0", "C", "m", "D0"), conversation.KindNewContext)
			mustObserve(t, s, "b", p, t0, status("T0", "D0", a2a.TaskStateCompleted))
			var reqs []conversation.Request
			for i := 1; i <= racers; i++ {
				id := fmt.Sprintf("T%d", i)
				reqs = append(reqs, send(id, "C", "m", "D"+id))
			}
			ds := race(t, stores, p, reqs)
			if won, other := count(ds, conversation.KindNewTask, conversation.ErrConcurrencyLimit); won != 1 || other != 0 {
				t.Fatalf("round %d: %d new tasks, %d unexpected decisions", round, won, other)
			}
			if c := mustContext(t, s, "b", "C"); c.Working != 1 || len(c.Tasks) != 2 {
				t.Fatalf("round %d: stored %+v", round, c)
			}
		}
	})

	t.Run("racing one task into several contexts: it lands in one", func(t *testing.T) {
		stores := replicas(t, newBacking(t))
		p := conversation.DefaultPolicy()
		var reqs []conversation.Request
		for i := 0; i < racers; i++ {
			reqs = append(reqs, send("T", fmt.Sprintf("C%d", i), "m", fmt.Sprintf("D%d", i)))
		}
		ds := race(t, stores, p, reqs)
		if won, other := count(ds, conversation.KindNewContext, a2a.ErrInvalidParams); won != 1 || other != 0 {
			t.Fatalf("%d new contexts, %d unexpected decisions", won, other)
		}
		s := stores[0]
		if n, _ := s.LiveContexts(ctx, "b", t0.Add(time.Minute)); n != 1 {
			t.Fatalf("%d live contexts", n)
		}
	})
}
