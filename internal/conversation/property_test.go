package conversation

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"testing/quick"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// walk drives an Agent with a seeded random sequence of requests, agent
// replies, sweeps and clock steps over small id pools (so collisions,
// mismatches, retries and limits happen often), checking after every step:
//   - the Agent invariants (Agent.check: one context per task, counters equal
//     recounts and never negative, history bound, tombstones empty);
//   - a task never changes context while the engine knows it;
//   - an accepted request never takes a context past its concurrency limit,
//     the agent past its active-context limit nor its caller past its share;
//   - Decide, Observe and Expire never mutate the context they were given.
func walk(t *testing.T, seed uint64, steps int, seen map[string]int) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	p := Policy{
		IdleTTL:                      time.Duration(r.IntN(20)+1) * time.Minute,
		InputRequiredTimeout:         time.Duration(r.IntN(10)) * time.Minute,
		MaxConcurrentTasksPerContext: r.IntN(4),
		MaxActiveContextsPerAgent:    r.IntN(5),
		MaxActiveContextsPerCaller:   r.IntN(3) * r.IntN(2),
		HistoryTasksPerContext:       r.IntN(5) + 1,
		TombstoneTTL:                 time.Duration(r.IntN(30)+1) * time.Minute,
		MaxStreamsPerTask:            r.IntN(3) + 1,
	}
	if r.IntN(2) == 0 {
		p.MaxAge = p.IdleTTL + time.Duration(r.IntN(30))*time.Minute
	}
	a := NewAgent()
	now := t0
	home := map[string]string{} // task → context while known
	states := []a2a.TaskState{working, working, inputReq, authReq, completed, failed, canceled, rejectedS, a2a.TaskStateSubmitted, a2a.TaskStateUnspecified}
	methods := []Method{MethodSendMessage, MethodSendMessage, MethodSendStreamingMessage, MethodGetTask, MethodListTasks, MethodCancelTask, MethodSubscribeToTask}
	id := func(prefix string, n int) string { return fmt.Sprintf("%s%d", prefix, r.IntN(n)) }

	for i := 0; i < steps; i++ {
		now = now.Add(time.Duration(r.IntN(90)) * time.Second)
		// Copy-on-write: whatever the step does, the context stored before it
		// must be unchanged in memory.
		var stored, storedCopy *Context
		snapshot := func(ctxID string) {
			if stored = a.Context(ctxID); stored != nil {
				storedCopy = stored.DeepClone()
			}
		}
		forgotten := map[string]bool{}
		forget := func(xs []Expiration) {
			for _, x := range xs {
				for _, id := range x.Forgotten {
					forgotten[id] = true
				}
			}
		}
		var op string
		switch k := r.IntN(10); {
		case k < 5:
			req := Request{
				Method:      methods[r.IntN(len(methods))],
				TaskID:      id("T", 12),
				ContextID:   id("C", 6),
				MessageID:   id("m", 6),
				Correlation: []byte(id("D", 8)),
				Requester:   id("R", 3),
			}
			if r.IntN(10) == 0 {
				req.ContextID = ""
			}
			req.Approval = r.IntN(2) == 0
			v := a.View(req)
			snapshot(v.ContextID)
			liveBefore := a.live
			d := a.Decide(p, now, req)
			forget(d.Expirations)
			op = fmt.Sprintf("%s %s/%s msg %s → %s %v", req.Method, req.TaskID, req.ContextID, req.MessageID, d.Kind, d.Err)
			seen[string(d.Kind)]++
			if d.Err != nil {
				seen[fmt.Sprintf("code %d %s", d.Err.Code, d.Err.A2AError())]++
				if scope, ok := d.Err.Details()["scope"].(string); ok && d.Err.Code == CodeActiveContextsLimit {
					seen["active contexts scope "+scope]++
				}
			}
			switch d.Kind {
			case KindNewContext, KindNewTask, KindResume:
				if l := p.MaxConcurrentTasksPerContext; l > 0 && d.Context.Working > l {
					t.Fatalf("seed %d step %d: %s: %d working tasks past limit %d", seed, i, op, d.Context.Working, l)
				}
				if l := p.MaxActiveContextsPerAgent; l > 0 && d.Kind == KindNewContext && a.live > l {
					t.Fatalf("seed %d step %d: %s: %d live contexts past limit %d (before %d)", seed, i, op, a.live, l, liveBefore)
				}
				// The share when it was decided: Decide may have swept first, and the
				// requester is counted among the callers either way.
				share := p.CallerShare(a.View(req).Callers)
				if d.Kind == KindNewContext && share > 0 && a.CallerContexts(req.Requester) > share {
					t.Fatalf("seed %d step %d: %s: caller %s holds %d live contexts past its share %d", seed, i, op, req.Requester, a.CallerContexts(req.Requester), share)
				}
				if !d.Forward {
					t.Fatalf("seed %d step %d: %s accepted but not forwarded", seed, i, op)
				}
				// What the responder declared holds for every accepted message.
				ended := false // the stored context expired in this step (Decide sweeps first)
				for _, x := range d.Expirations {
					ended = ended || (storedCopy != nil && x.ContextID == storedCopy.ID && (x.Expired != nil || x.Delete))
				}
				for _, w := range storedCopy.tasksOrNil() {
					if ended {
						break
					}
					h := w.Continuation
					if !interrupted(w.State) || h == nil {
						continue
					}
					switch {
					case d.Kind != KindResume && h.ResumeScope == ResumeSameTask:
						t.Fatalf("seed %d step %d: %s accepted while %s waits with same_task", seed, i, op, w.ID)
					case d.Kind == KindResume && w.ID == req.TaskID && (h.ResumeScope == ResumeNewTaskInContext ||
						(h.ExpectedInput == ExpectApproval && !req.Approval) || (h.ExpectedInput == ExpectCredential && w.State != authReq)):
						t.Fatalf("seed %d step %d: %s accepted against the hint %+v of %s in %s", seed, i, op, *h, w.ID, w.State)
					}
				}
			case KindReject:
				if d.Err == nil || d.Forward {
					t.Fatalf("seed %d step %d: %s: bad rejection", seed, i, op)
				}
			}
		case k < 9:
			task := id("T", 12)
			ctxID, _ := a.TaskContext(task)
			snapshot(ctxID)
			e := Event{Kind: EventStatus, TaskID: task, State: states[r.IntN(len(states))], Correlation: []byte(id("D", 8)), Final: r.IntN(5) == 0}
			if interrupted(e.State) && r.IntN(2) == 0 {
				hints := []*Continuation{
					{ResumeScope: ResumeSameTask}, {ResumeScope: ResumeNewTaskInContext},
					{ExpectedInput: ExpectApproval}, {ExpectedInput: ExpectCredential}, {ExpectedInput: "free_text"},
				}
				e.Continuation = hints[r.IntN(len(hints))]
			}
			if r.IntN(6) == 0 {
				e.AgentTaskID = "agent-" + task
			}
			switch r.IntN(8) {
			case 0:
				e.Kind = EventArtifact
			case 1:
				e.Kind = EventError
			case 2:
				e.Kind = EventMessage
			case 3:
				e.Kind = EventTask
				e.Snapshot = r.IntN(2) == 0
			}
			o := a.Observe(p, now, e)
			forget(o.Expirations)
			if o.SlotFreed {
				seen["slot freed"]++
			}
			if o.Delete {
				seen["refused first message"]++
			}
			op = fmt.Sprintf("event %s %s %s → known %v", e.Kind, task, e.State, o.Known)
		default:
			// Sweep; check immutability on one random context.
			ctxID := id("C", 6)
			snapshot(ctxID)
			for _, x := range a.Expire(p, now) {
				forget([]Expiration{x})
				if x.Expired != nil {
					seen["expired "+string(x.Expired.Reason)]++
				}
				if len(x.TimedOut) > 0 {
					seen["input timeout"]++
				}
				if x.Delete {
					seen["tombstone deleted"]++
				}
			}
			op = "sweep"
		}
		if stored != nil && !reflect.DeepEqual(stored, storedCopy) {
			t.Fatalf("seed %d step %d (%s): stored context %s mutated in place", seed, i, op, stored.ID)
		}
		if err := a.check(p); err != nil {
			t.Fatalf("seed %d step %d (%s): %v", seed, i, op, err)
		}
		for task, ctxID := range a.tasks {
			if h, ok := home[task]; ok && h != ctxID && !forgotten[task] {
				t.Fatalf("seed %d step %d (%s): task %s moved from context %s to %s", seed, i, op, task, h, ctxID)
			}
		}
		for task := range home {
			if _, ok := a.tasks[task]; !ok {
				delete(home, task) // forgotten (evicted or expired): may start over
			}
		}
		for task, ctxID := range a.tasks {
			home[task] = ctxID
		}
	}
}

func TestRandomWalkInvariants(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 50
	}
	seen := map[string]int{}
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		walk(t, seed, 400, seen)
	}
	// The walk must reach every rule, or passing means little.
	for _, want := range []string{
		"new_context", "new_task", "resume", "retry", "read", "cancel", "subscribe", "reject",
		"code -32602 ", "code -32004 ", "code -32002 ", "code -32060 context_expired",
		"code -32061 concurrency_limit", "code -32062 active_contexts_limit", "code -32063 continuation_mismatch",
		"active contexts scope agent", "active contexts scope caller",
		"slot freed", "refused first message", "expired idle_ttl", "expired max_age", "input timeout", "tombstone deleted",
	} {
		if seen[want] == 0 {
			t.Errorf("random walk never reached %q (saw %v)", want, seen)
		}
	}
}

// TestPurity checks with testing/quick that the pure functions never mutate
// their input context, whatever the request or event.
func TestPurity(t *testing.T) {
	p := basePolicy()
	p.MaxConcurrentTasksPerContext = 1
	p.InputRequiredTimeout = time.Minute
	p.FirstEventTimeout = 30 * time.Second
	p.HistoryTasksPerContext = 2
	base := NewAgent()
	base.Decide(p, t0, send("T1", "C", "m1", "D1"))
	base.Observe(p, t0, status("T1", "D1", inputReq))
	base.Decide(p, t0, send("T2", "C", "m2", "D2"))
	c := base.Context("C")
	frozen := c.DeepClone()

	pick := []string{"T1", "T2", "T3", ""}
	prop := func(m, task, ctx, msg, st, kind uint8, corr []byte, offset uint16) bool {
		now := t0.Add(time.Duration(offset) * time.Second)
		req := Request{
			Method:      []Method{MethodSendMessage, MethodSendStreamingMessage, MethodGetTask, MethodCancelTask, MethodSubscribeToTask}[int(m)%5],
			TaskID:      pick[int(task)%4],
			ContextID:   []string{"C", "C2", ""}[int(ctx)%3],
			MessageID:   []string{"m1", "m2", "m3"}[int(msg)%3],
			Correlation: corr,
		}
		Decide(p, now, View{ContextID: "C", Context: c, TaskContextID: "T1", LiveContexts: 1}, req)
		Observe(p, now, c, Event{
			Kind:        []EventKind{EventStatus, EventArtifact, EventTask, EventMessage, EventError}[int(kind)%5],
			TaskID:      pick[int(task)%4],
			State:       []a2a.TaskState{working, inputReq, completed, failed, a2a.TaskStateSubmitted}[int(st)%5],
			Correlation: corr,
		})
		Expire(p, now, c)
		return reflect.DeepEqual(c, frozen)
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 5000}); err != nil {
		t.Fatal(err)
	}
}

// tasksOrNil returns the tasks of a context that may be nil.
func (c *Context) tasksOrNil() []*Task {
	if c == nil {
		return nil
	}
	return c.Tasks
}
