package conversation

import (
	"bytes"
	"fmt"
	"testing"
	"testing/quick"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

const (
	working   = a2a.TaskStateWorking
	inputReq  = a2a.TaskStateInputRequired
	authReq   = a2a.TaskStateAuthRequired
	completed = a2a.TaskStateCompleted
	failed    = a2a.TaskStateFailed
	canceled  = a2a.TaskStateCanceled
	rejectedS = a2a.TaskStateRejected
)

func wantState(task string, s a2a.TaskState) func(*testing.T, *Agent, Decision, Outcome, []Expiration) {
	return func(t *testing.T, a *Agent, _ Decision, _ Outcome, _ []Expiration) {
		t.Helper()
		if got := state(t, a, task); got != s {
			t.Fatalf("task %s state %s, want %s", task, got, s)
		}
	}
}

func wantDetail(key string, want any) func(*testing.T, *Agent, Decision, Outcome, []Expiration) {
	return func(t *testing.T, _ *Agent, d Decision, _ Outcome, _ []Expiration) {
		t.Helper()
		// error.data is JSON on the wire: numbers compare by their text.
		if got := d.Err.Details()[key]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("error detail %s = %v (%T), want %v (%T); error %v", key, got, got, want, want, d.Err)
		}
	}
}

func TestSeed000MultiTurn(t *testing.T) {
	p := basePolicy()
	p.IdleTTL = 10 * time.Minute
	ttlPolicy := p
	maxAge := p
	maxAge.IdleTTL, maxAge.MaxAge = time.Hour, 15*time.Minute

	tests := []struct {
		name  string
		p     Policy
		steps []step
	}{
		{"turn 1: new context, stream, completion", p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext).with(wantState("T1", a2a.TaskStateSubmitted)),
			{ev: &Event{Kind: EventStatus, TaskID: "T1", State: working, Correlation: []byte("D1")}, known: yes(), ended: no(),
				check: func(t *testing.T, _ *Agent, _ Decision, o Outcome, _ []Expiration) {
					if o.Stream == nil || o.Stream.ResponseTopic != "$a2a/v1/reply/org/unit/a/r1" {
						t.Fatalf("stream of D1 not routed: %+v", o.Stream)
					}
				}},
			{ev: &Event{Kind: EventArtifact, TaskID: "T1", Correlation: []byte("D1")}, known: yes(), ended: no()},
			{ev: &Event{Kind: EventStatus, TaskID: "T1", State: completed, Correlation: []byte("D1")}, known: yes(), ended: yes(), freed: yes()},
			req(Request{Method: MethodGetTask, TaskID: "T1"}, KindRead).with(wantState("T1", completed)),
		}},
		{"turn 2: new task in the same context", p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(status("T1", "D1", completed)),
			req(send("T2", "C", "m2", "D2"), KindNewTask).after(time.Minute),
			ev(status("T2", "D2", working)).after(time.Minute),
			ev(status("T2", "D2", completed)).after(2 * time.Minute).with(func(t *testing.T, a *Agent, _ Decision, _ Outcome, _ []Expiration) {
				c := a.Context("C")
				if len(c.Tasks) != 2 || c.Tasks[0].ID != "T1" || c.Tasks[1].ID != "T2" {
					t.Fatalf("history of C: %+v", c.Tasks)
				}
			}),
		}},
		{"interrupted task resumed with fresh correlation", p, []step{
			req(send("T3", "C", "m3", "D3"), KindNewContext),
			ev(status("T3", "D3", working)),
			{ev: &Event{Kind: EventStatus, TaskID: "T3", State: inputReq, Correlation: []byte("D3")}, ended: yes(), freed: yes()},
			req(send("T3", "C", "m4", "D4"), KindResume).after(time.Minute).with(func(t *testing.T, a *Agent, d Decision, _ Outcome, _ []Expiration) {
				tk := a.Context("C").Task("T3")
				if tk.State != a2a.TaskStateSubmitted || tk.PrevState != inputReq || len(tk.Streams) != 1 || !bytes.Equal(tk.Streams[0].Correlation, []byte("D4")) {
					t.Fatalf("resumed task: %+v", tk)
				}
				if !d.Forward {
					t.Fatal("resume not forwarded")
				}
			}),
			{ev: &Event{Kind: EventStatus, TaskID: "T3", State: completed, Correlation: []byte("D4")}, ended: yes(), freed: yes()},
		}},
		{"auth-required resumes like input-required", p, []step{
			req(send("T3", "C", "m3", "D3"), KindNewContext),
			ev(status("T3", "D3", authReq)).with(wantState("T3", authReq)),
			req(send("T3", "C", "m4", "D4"), KindResume),
		}},
		{"resume without contextId uses the task's context", p, []step{
			req(send("T3", "C", "m3", "D3"), KindNewContext),
			ev(status("T3", "D3", inputReq)),
			req(send("T3", "", "m4", "D4"), KindResume),
		}},
		{"mismatched context is -32602", p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(status("T1", "D1", inputReq)),
			rejected(send("T1", "C2", "m2", "D2"), -32602, a2a.ErrInvalidParams).with(func(t *testing.T, a *Agent, d Decision, _ Outcome, _ []Expiration) {
				if d.Err.Details()["taskContextId"] != "C" || d.Err.Details()["contextId"] != "C2" {
					t.Fatalf("details %v", d.Err.Details())
				}
				if a.Context("C2") != nil {
					t.Fatal("a rejected request created context C2")
				}
			}),
		}},
		{"unknown context is a new context", p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			req(send("T9", "C9", "m9", "D9"), KindNewContext),
		}},
		{"expired context (idle TTL)", p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(status("T1", "D1", completed)).after(time.Minute),
			{req: ptr(send("T2", "C", "m2", "D2")), at: 12 * time.Minute, kind: KindReject, code: CodeContextExpired, sentinel: ErrContextExpired, a2aErr: A2AErrorContextExpired,
				check: func(t *testing.T, a *Agent, d Decision, _ Outcome, x []Expiration) {
					wantDetail("reason", "idle_ttl")(t, a, d, Outcome{}, x)
					wantDetail("expiredAt", "2026-05-01T12:11:00Z")(t, a, d, Outcome{}, x)
					wantDetail("idleTTL", "10m0s")(t, a, d, Outcome{}, x)
					if len(x) != 1 || x[0].Expired == nil || len(x[0].Dropped) != 1 {
						t.Fatalf("expirations %+v", x)
					}
				}},
			// Still expired (a tombstone), not silently a new conversation.
			{req: ptr(send("T3", "C", "m3", "D3")), at: 13 * time.Minute, kind: KindReject, code: CodeContextExpired, a2aErr: A2AErrorContextExpired},
		}},
		{"expired context (max age)", maxAge, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(status("T1", "D1", completed)).after(time.Minute),
			req(send("T2", "C", "m2", "D2"), KindNewTask).after(10 * time.Minute),
			ev(status("T2", "D2", completed)).after(14 * time.Minute),
			{req: ptr(send("T3", "C", "m3", "D3")), at: 16 * time.Minute, kind: KindReject, code: CodeContextExpired, a2aErr: A2AErrorContextExpired,
				check: func(t *testing.T, a *Agent, d Decision, _ Outcome, x []Expiration) {
					wantDetail("reason", "max_age")(t, a, d, Outcome{}, x)
					wantDetail("expiredAt", "2026-05-01T12:15:00Z")(t, a, d, Outcome{}, x)
					wantDetail("maxAge", "15m0s")(t, a, d, Outcome{}, x)
				}},
		}},
		{"concurrent T4 and T5 complete independently", p, []step{
			req(send("T4", "C", "m4", "D4"), KindNewContext),
			req(send("T5", "C", "m5", "D5"), KindNewTask),
			ev(status("T5", "D5", working)),
			ev(status("T4", "D4", working)),
			{ev: ptr(status("T5", "D5", completed)), ended: yes(), freed: yes(), check: func(t *testing.T, a *Agent, _ Decision, o Outcome, _ []Expiration) {
				if !bytes.Equal(o.Stream.Correlation, []byte("D5")) {
					t.Fatalf("T5 completion routed to %q", o.Stream.Correlation)
				}
				if state(t, a, "T4") != working || a.Context("C").Working != 1 {
					t.Fatal("T4 affected by T5's completion")
				}
			}},
			{ev: ptr(status("T4", "D4", completed)), ended: yes(), freed: yes(), check: func(t *testing.T, a *Agent, _ Decision, o Outcome, _ []Expiration) {
				if !bytes.Equal(o.Stream.Correlation, []byte("D4")) || a.Context("C").Working != 0 {
					t.Fatalf("T4 completion: stream %q working %d", o.Stream.Correlation, a.Context("C").Working)
				}
			}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.p, tt.steps) })
	}
	_ = ttlPolicy
}

func ptr[T any](v T) *T { return &v }

func TestTerminalTask(t *testing.T) {
	for _, s := range []a2a.TaskState{completed, failed, canceled, rejectedS} {
		t.Run(string(s), func(t *testing.T) {
			run(t, basePolicy(), []step{
				req(send("T1", "C", "m1", "D1"), KindNewContext),
				ev(status("T1", "D1", s)),
				{req: ptr(send("T1", "C", "m2", "D2")), kind: KindReject, code: -32004, sentinel: a2a.ErrUnsupportedOperation,
					check: wantDetail("state", string(s))},
				// A retry of the message that finished the task is not a
				// new message: forwarded, the agent answers with the task.
				{req: ptr(send("T1", "C", "m1", "D9")), kind: KindRetry, forward: yes()},
				rejected(Request{Method: MethodCancelTask, TaskID: "T1"}, -32002, a2a.ErrTaskNotCancelable),
				rejected(Request{Method: MethodSubscribeToTask, TaskID: "T1", Correlation: []byte("S")}, -32004, a2a.ErrUnsupportedOperation),
				// Terminal is final: a late working event does not reopen it.
				ev(status("T1", "D1", working)).with(wantState("T1", s)),
			})
		})
	}
}

func TestRetries(t *testing.T) {
	run(t, basePolicy(), []step{
		req(send("T1", "C", "m1", "D1"), KindNewContext),
		// QoS 1 redelivery: same correlation, already forwarded.
		{req: ptr(send("T1", "C", "m1", "D1")), kind: KindRetry, forward: no()},
		// Profile retry: same message, fresh correlation: forwarded, tracked.
		{req: ptr(send("T1", "C", "m1", "D2")), kind: KindRetry, forward: yes(), check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, _ []Expiration) {
			if n := len(a.Context("C").Task("T1").Streams); n != 2 {
				t.Fatalf("%d streams, want 2", n)
			}
			if a.Context("C").Working != 1 {
				t.Fatal("a retry took a second slot")
			}
		}},
		ev(status("T1", "D2", inputReq)),
		// Redelivery of the first message after the task went
		// input-required: the agent deduplicates and answers the state.
		{req: ptr(send("T1", "C", "m1", "D3")), kind: KindRetry, forward: yes()},
		req(send("T1", "C", "m2", "D4"), KindResume),
		{req: ptr(send("T1", "C", "m2", "D4")), kind: KindRetry, forward: no()},
	})
}

func TestConcurrencyLimit(t *testing.T) {
	one := basePolicy()
	one.MaxConcurrentTasksPerContext = 1
	two := basePolicy()
	two.MaxConcurrentTasksPerContext = 2

	t.Run("limit 1 is the concurrent-call guard", func(t *testing.T) {
		run(t, one, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(status("T1", "D1", working)),
			{req: ptr(send("T2", "C", "m2", "D2")), kind: KindReject, code: CodeConcurrencyLimit, sentinel: ErrConcurrencyLimit, a2aErr: A2AErrorConcurrencyLimit,
				check: func(t *testing.T, a *Agent, d Decision, o Outcome, x []Expiration) {
					wantDetail("limit", 1)(t, a, d, o, x)
					wantDetail("scope", "context")(t, a, d, o, x)
					if ids, _ := d.Err.Details()["workingTaskIds"].([]any); len(ids) != 1 || ids[0] != "T1" {
						t.Fatalf("workingTaskIds %v", d.Err.Details()["workingTaskIds"])
					}
				}},
			// Other contexts are not affected.
			req(send("T3", "C3", "m3", "D3"), KindNewContext),
			// The completion frees the slot before the requester can react:
			// a follow-up at the same instant is accepted.
			{ev: ptr(status("T1", "D1", completed)), at: time.Minute, freed: yes()},
			req(send("T2", "C", "m2", "D2b"), KindNewTask).after(time.Minute),
		})
	})
	t.Run("input-required frees the slot, resume needs one", func(t *testing.T) {
		run(t, one, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			{ev: ptr(status("T1", "D1", inputReq)), freed: yes()},
			req(send("T2", "C", "m2", "D2"), KindNewTask),
			{req: ptr(send("T1", "C", "m3", "D3")), kind: KindReject, code: CodeConcurrencyLimit, a2aErr: A2AErrorConcurrencyLimit},
			ev(status("T2", "D2", completed)),
			req(send("T1", "C", "m3", "D3"), KindResume),
		})
	})
	t.Run("limit 2", func(t *testing.T) {
		run(t, two, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			req(send("T2", "C", "m2", "D2"), KindNewTask),
			{req: ptr(send("T3", "C", "m3", "D3")), kind: KindReject, code: CodeConcurrencyLimit, a2aErr: A2AErrorConcurrencyLimit, check: wantDetail("limit", 2)},
			ev(status("T2", "D2", failed)),
			req(send("T3", "C", "m3", "D3"), KindNewTask),
		})
	})
	t.Run("unlimited", func(t *testing.T) {
		var steps []step
		steps = append(steps, req(send("T0", "C", "m0", "D0"), KindNewContext))
		for i := 1; i < 50; i++ {
			id := string(rune('A'+i%26)) + string(rune('a'+i/26))
			steps = append(steps, req(send(id, "C", "m"+id, "D"+id), KindNewTask))
		}
		run(t, basePolicy(), steps)
	})
	t.Run("a working task takes one message at a time", func(t *testing.T) {
		run(t, basePolicy(), []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			{req: ptr(send("T1", "C", "m2", "D2")), kind: KindReject, code: CodeConcurrencyLimit, a2aErr: A2AErrorConcurrencyLimit,
				check: wantDetail("scope", "task")},
		})
	})
}

// by is r sent by another caller.
func by(r Request, caller string) Request {
	r.Requester = caller
	r.ResponseTopic = "$a2a/v1/reply/" + caller + "/r1"
	return r
}

func TestActiveContextsLimit(t *testing.T) {
	p := basePolicy()
	p.MaxActiveContextsPerAgent = 2
	p.IdleTTL = 10 * time.Minute
	run(t, p, []step{
		req(by(send("T1", "C1", "m1", "D1"), "o/u/a"), KindNewContext),
		req(by(send("T2", "C2", "m2", "D2"), "o/u/b"), KindNewContext).after(5 * time.Minute),
		{req: ptr(by(send("T3", "C3", "m3", "D3"), "o/u/c")), at: 6 * time.Minute, kind: KindReject, code: CodeActiveContextsLimit, sentinel: ErrActiveContextsLimit, a2aErr: A2AErrorActiveContextsLimit,
			check: func(t *testing.T, a *Agent, d Decision, o Outcome, x []Expiration) {
				wantDetail("limit", 2)(t, a, d, o, x)
				wantDetail("active", 2)(t, a, d, o, x)
				wantDetail("scope", "agent")(t, a, d, o, x)
			}},
		// Existing contexts still take new turns at the limit.
		req(by(send("T4", "C2", "m4", "D4"), "o/u/b"), KindNewTask).after(6 * time.Minute),
		// C1 expires at 10m: a new context fits again (the engine sweeps
		// before refusing, no sweeper needed).
		req(by(send("T3", "C3", "m3", "D3"), "o/u/c"), KindNewContext).after(11 * time.Minute).with(
			func(t *testing.T, a *Agent, d Decision, _ Outcome, _ []Expiration) {
				if len(d.Expirations) != 1 || d.Expirations[0].ContextID != "C1" {
					t.Fatalf("expirations %+v", d.Expirations)
				}
			}),
	})
}

func TestInputRequiredTimeout(t *testing.T) {
	p := basePolicy()
	p.InputRequiredTimeout = 5 * time.Minute
	t.Run("sweeper fails the task", func(t *testing.T) {
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(status("T1", "D1", inputReq)).after(time.Minute),
			{sweep: true, at: 5 * time.Minute, check: func(t *testing.T, _ *Agent, _ Decision, _ Outcome, x []Expiration) {
				if len(x) != 0 {
					t.Fatalf("expired early: %+v", x)
				}
			}},
			{sweep: true, at: 6 * time.Minute, check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, x []Expiration) {
				if len(x) != 1 || len(x[0].TimedOut) != 1 || x[0].TimedOut[0].TaskID != "T1" || !x[0].TimedOut[0].Deadline.Equal(t0.Add(6*time.Minute)) {
					t.Fatalf("expirations %+v", x)
				}
				tk := a.Context("C").Task("T1")
				if tk.State != failed || tk.StatusMessage == "" {
					t.Fatalf("timed-out task %+v", tk)
				}
			}},
			{req: ptr(send("T1", "C", "m2", "D2")), at: 7 * time.Minute, kind: KindReject, code: -32004, sentinel: a2a.ErrUnsupportedOperation,
				check: func(t *testing.T, _ *Agent, d Decision, _ Outcome, _ []Expiration) {
					if d.Err.Details()["statusMessage"] == nil {
						t.Fatalf("rejection does not say why the task failed: %v", d.Err)
					}
				}},
			// The context itself lives on.
			req(send("T2", "C", "m3", "D3"), KindNewTask).after(7 * time.Minute),
		})
	})
	t.Run("lazily on resume", func(t *testing.T) {
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(status("T1", "D1", authReq)),
			{req: ptr(send("T1", "C", "m2", "D2")), at: 5 * time.Minute, kind: KindReject, code: -32004,
				check: func(t *testing.T, _ *Agent, d Decision, _ Outcome, _ []Expiration) {
					if len(d.Expirations) != 1 || len(d.Expirations[0].TimedOut) != 1 {
						t.Fatalf("expirations %+v", d.Expirations)
					}
				}},
		})
	})
	t.Run("resumed in time", func(t *testing.T) {
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(status("T1", "D1", inputReq)),
			req(send("T1", "C", "m2", "D2"), KindResume).after(4 * time.Minute),
			ev(status("T1", "D2", working)).after(4 * time.Minute),
			{sweep: true, at: 20 * time.Minute, check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, x []Expiration) {
				if len(x) != 0 || state(t, a, "T1") != working {
					t.Fatalf("a working task timed out: %+v", x)
				}
			}},
		})
	})
	t.Run("zero waits forever", func(t *testing.T) {
		q := basePolicy()
		q.IdleTTL = 0
		run(t, q, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(status("T1", "D1", inputReq)),
			req(send("T1", "C", "m2", "D2"), KindResume).after(1000 * time.Hour),
		})
	})
}

func TestHistoryBound(t *testing.T) {
	p := basePolicy()
	p.HistoryTasksPerContext = 3
	var steps []step
	steps = append(steps, req(send("T0", "C", "m0", "D0"), KindNewContext), ev(status("T0", "D0", completed)))
	for _, id := range []string{"T1", "T2", "T3", "T4"} {
		steps = append(steps, req(send(id, "C", "m"+id, "D"+id), KindNewTask), ev(status(id, "D"+id, completed)))
	}
	steps = append(steps, step{check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, _ []Expiration) {
		c := a.Context("C")
		if len(c.Tasks) != 3 || c.Tasks[0].ID != "T2" || c.Tasks[2].ID != "T4" {
			t.Fatalf("history %+v", c.Tasks)
		}
		if _, ok := a.TaskContext("T0"); ok {
			t.Fatal("evicted task still indexed")
		}
	}})
	// Unfinished tasks are never evicted, even past the bound.
	for _, id := range []string{"W1", "W2", "W3", "W4"} {
		steps = append(steps, req(send(id, "C", "m"+id, "D"+id), KindNewTask))
	}
	steps = append(steps, step{check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, _ []Expiration) {
		c := a.Context("C")
		if len(c.Tasks) != 4 || c.Working != 4 {
			t.Fatalf("history %+v", c.Tasks)
		}
	}})
	run(t, p, steps)
}

func TestTombstone(t *testing.T) {
	p := basePolicy()
	p.IdleTTL = time.Minute
	p.TombstoneTTL = time.Hour
	run(t, p, []step{
		req(send("T1", "C", "m1", "D1"), KindNewContext),
		{sweep: true, at: 2 * time.Minute, check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, x []Expiration) {
			if len(x) != 1 || x[0].Expired == nil || a.Context("C").Expired == nil || a.Live() != 0 {
				t.Fatalf("expirations %+v", x)
			}
			// A working task dropped with its context is reported so the
			// service can cancel it at the agent.
			if len(x[0].Dropped) != 1 || x[0].Dropped[0].State != a2a.TaskStateSubmitted {
				t.Fatalf("dropped %+v", x[0].Dropped)
			}
		}},
		{ev: ptr(status("T1", "D1", completed)), at: 3 * time.Minute, known: no()},
		// A resume naming only its task still finds the (expired) context.
		{req: ptr(send("T1", "", "m2", "D2")), at: 4 * time.Minute, kind: KindReject, code: CodeContextExpired, a2aErr: A2AErrorContextExpired},
		// Its task id can't start over in another context while the
		// tombstone lasts.
		rejected(send("T1", "C2", "m3", "D3"), -32602, a2a.ErrInvalidParams).after(5 * time.Minute),
		{req: ptr(send("T2", "C", "m2", "D2")), at: 30 * time.Minute, kind: KindReject, code: CodeContextExpired, a2aErr: A2AErrorContextExpired},
		{sweep: true, at: 62 * time.Minute, check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, x []Expiration) {
			if len(x) != 1 || !x[0].Delete || a.Context("C") != nil {
				t.Fatalf("tombstone not deleted: %+v", x)
			}
		}},
		req(send("T2", "C", "m2", "D2"), KindNewContext).after(63 * time.Minute),
		req(send("T1", "C2", "m3", "D3"), KindNewContext).after(63 * time.Minute),
	})
}

func TestAgentErrors(t *testing.T) {
	p := basePolicy()
	p.MaxActiveContextsPerAgent = 1
	run(t, p, []step{
		req(send("T1", "C", "m1", "D1"), KindNewContext),
		// The agent refuses the first message (for example its own -32602):
		// the task and its context never existed.
		{ev: &Event{Kind: EventError, TaskID: "T1", Correlation: []byte("D1")}, known: yes(), freed: yes(), ended: yes(),
			check: func(t *testing.T, a *Agent, _ Decision, o Outcome, _ []Expiration) {
				if !o.Delete || a.Context("C") != nil || a.Live() != 0 {
					t.Fatalf("refused first message left state: %+v", o)
				}
			}},
		req(send("T2", "C2", "m2", "D2"), KindNewContext),
		ev(status("T2", "D2", inputReq)),
		req(send("T2", "C2", "m3", "D3"), KindResume),
		// The agent refuses the resume: the task waits again.
		{ev: &Event{Kind: EventError, TaskID: "T2", Correlation: []byte("D3")}, freed: yes(), check: wantState("T2", inputReq)},
		// An error once the run started leaves the task to the agent.
		req(send("T2", "C2", "m4", "D4"), KindResume),
		ev(status("T2", "D4", working)),
		{ev: &Event{Kind: EventError, TaskID: "T2", Correlation: []byte("D4")}, ended: yes(), freed: no(), check: wantState("T2", working)},
	})
}

func TestResultKinds(t *testing.T) {
	run(t, basePolicy(), []step{
		req(send("T1", "C", "m1", "D1"), KindNewContext),
		// A direct Message result completes the run.
		{ev: &Event{Kind: EventMessage, TaskID: "T1", Correlation: []byte("D1"), Final: true}, freed: yes(), ended: yes(), check: wantState("T1", completed)},
		req(send("T2", "C", "m2", "D2"), KindNewTask),
		// A unary Task result in working state ends its correlation but
		// the task keeps its slot.
		{ev: &Event{Kind: EventTask, TaskID: "T2", State: working, Correlation: []byte("D2"), Final: true}, ended: yes(), freed: no(),
			check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, _ []Expiration) {
				if tk := a.Context("C").Task("T2"); len(tk.Streams) != 0 || a.Context("C").Working != 1 {
					t.Fatalf("task %+v", tk)
				}
			}},
		// A subscription tracks a new stream; the canceled result of
		// CancelTask ends everything and frees the slot.
		req(Request{Method: MethodSubscribeToTask, TaskID: "T2", Correlation: []byte("S1")}, KindSubscribe),
		req(Request{Method: MethodCancelTask, TaskID: "T2", Correlation: []byte("X1")}, KindCancel),
		{ev: &Event{Kind: EventTask, TaskID: "T2", State: canceled, Correlation: []byte("X1"), Final: true}, freed: yes()},
		// Events for unknown tasks are relayed, not tracked.
		{ev: ptr(status("nope", "D9", working)), known: no()},
		req(Request{Method: "GetExtendedAgentCard"}, KindPassthrough),
		req(Request{Method: MethodListTasks, ContextID: "C"}, KindRead),
	})
}

func TestInvalidRequests(t *testing.T) {
	run(t, basePolicy(), []step{
		rejected(send("", "C", "m1", "D1"), -32602, a2a.ErrInvalidParams),
		rejected(send("T1", "", "m1", "D1"), -32602, a2a.ErrInvalidParams),
		rejected(send("T1", "C", "", "D1"), -32602, a2a.ErrInvalidParams),
	})
	// A view loaded for another context is refused, not applied.
	d := Decide(basePolicy(), t0, View{ContextID: "X"}, send("T1", "C", "m1", "D1"))
	if d.Kind != KindReject || d.Err.Code != -32603 || d.Changed {
		t.Fatalf("wrong view: %+v", d)
	}
}

func TestNoWriteForIdleEvents(t *testing.T) {
	p := basePolicy()
	a := NewAgent()
	a.Decide(p, t0, send("T1", "C", "m1", "D1"))
	if o := a.Observe(p, t0.Add(time.Second), status("T1", "D1", working)); !o.Changed {
		t.Fatal("state change not written")
	}
	if o := a.Observe(p, t0.Add(1500*time.Millisecond), Event{Kind: EventArtifact, TaskID: "T1", Correlation: []byte("D1")}); o.Changed || !o.Known || o.Stream == nil {
		t.Fatalf("artifact right after activity: %+v", o)
	}
	if o := a.Observe(p, t0.Add(3*time.Second), Event{Kind: EventArtifact, TaskID: "T1", Correlation: []byte("D1")}); !o.Changed {
		t.Fatal("activity older than the resolution not written")
	}
}

// TestPolicyChange: a context stored under one policy is judged by the
// policy in force at the decision, and its indexed deadlines follow.
func TestPolicyChange(t *testing.T) {
	long := basePolicy()
	short := basePolicy()
	short.IdleTTL = time.Minute
	a := NewAgent()
	a.Decide(long, t0, send("T1", "C", "m1", "D1"))
	if got := a.Context("C").ExpiresAt; !got.Equal(t0.Add(30 * time.Minute)) {
		t.Fatalf("expires at %v", got)
	}
	d := a.Decide(short, t0.Add(2*time.Minute), send("T2", "C", "m2", "D2"))
	if d.Kind != KindReject || d.Err.Code != CodeContextExpired {
		t.Fatalf("under the shorter TTL: %s %v", d.Kind, d.Err)
	}
	// Lengthening the TTL moves the deadline out without other changes.
	a.Decide(long, t0, send("T3", "C3", "m3", "D3"))
	longer := basePolicy()
	longer.IdleTTL = time.Hour
	x := Expire(longer, t0.Add(time.Minute), a.Context("C3"))
	if !x.Changed || x.notable() || !x.Context.ExpiresAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("refresh under a longer TTL: %+v", x)
	}
	if err := a.check(short); err != nil {
		t.Fatal(err)
	}
}

// TestCallerShare: a caller's live contexts at one agent are bounded by its share: the explicit
// MaxActiveContextsPerCaller, or by default the fair share of MaxActiveContextsPerAgent that keeps
// one share free for a caller not there yet.
func TestCallerShare(t *testing.T) {
	callerLimit := func(limit, active int) func(t *testing.T, a *Agent, d Decision, o Outcome, x []Expiration) {
		return func(t *testing.T, a *Agent, d Decision, o Outcome, x []Expiration) {
			wantDetail("scope", "caller")(t, a, d, o, x)
			wantDetail("limit", limit)(t, a, d, o, x)
			wantDetail("active", active)(t, a, d, o, x)
		}
	}
	refuse := func(r Request, check func(t *testing.T, a *Agent, d Decision, o Outcome, x []Expiration)) step {
		return step{req: &r, kind: KindReject, code: CodeActiveContextsLimit, sentinel: ErrActiveContextsLimit, a2aErr: A2AErrorActiveContextsLimit, check: check}
	}
	t.Run("fair by default", func(t *testing.T) {
		p := basePolicy()
		p.MaxActiveContextsPerAgent = 6
		run(t, p, []step{
			// Alone, a caller gets half: ceil(6/2) = 3.
			req(by(send("A1", "CA1", "m", "D1"), "o/u/a"), KindNewContext),
			req(by(send("A2", "CA2", "m", "D2"), "o/u/a"), KindNewContext),
			req(by(send("A3", "CA3", "m", "D3"), "o/u/a"), KindNewContext),
			refuse(by(send("A4", "CA4", "m", "D4"), "o/u/a"), callerLimit(3, 3)),
			// Its existing contexts still take new turns.
			req(by(send("A5", "CA1", "m", "D5"), "o/u/a"), KindNewTask),
			// Another caller gets in: with two callers a share is ceil(6/3) = 2.
			req(by(send("B1", "CB1", "m", "D6"), "o/u/b"), KindNewContext),
			req(by(send("B2", "CB2", "m", "D7"), "o/u/b"), KindNewContext),
			refuse(by(send("B3", "CB3", "m", "D8"), "o/u/b"), callerLimit(2, 2)),
			// A third one still finds the agent's last context free.
			req(by(send("C1", "CC1", "m", "D9"), "o/u/c"), KindNewContext),
		})
	})
	t.Run("explicit", func(t *testing.T) {
		p := basePolicy()
		p.MaxActiveContextsPerAgent = 4
		p.MaxActiveContextsPerCaller = 4
		run(t, p, []step{
			req(by(send("A1", "CA1", "m", "D1"), "o/u/a"), KindNewContext),
			req(by(send("A2", "CA2", "m", "D2"), "o/u/a"), KindNewContext),
			req(by(send("A3", "CA3", "m", "D3"), "o/u/a"), KindNewContext),
			req(by(send("A4", "CA4", "m", "D4"), "o/u/a"), KindNewContext),
			// The whole agent, as asked: the agent's limit refuses the next one.
			{req: ptr(by(send("B1", "CB1", "m", "D5"), "o/u/b")), kind: KindReject, code: CodeActiveContextsLimit, a2aErr: A2AErrorActiveContextsLimit,
				sentinel: ErrActiveContextsLimit, check: wantDetail("scope", "agent")},
		})
	})
	t.Run("without an agent limit", func(t *testing.T) {
		p := basePolicy()
		p.MaxActiveContextsPerCaller = 1
		p.IdleTTL = 10 * time.Minute
		run(t, p, []step{
			req(by(send("A1", "CA1", "m", "D1"), "o/u/a"), KindNewContext),
			refuse(by(send("A2", "CA2", "m", "D2"), "o/u/a"), callerLimit(1, 1)),
			req(by(send("B1", "CB1", "m", "D3"), "o/u/b"), KindNewContext),
			// CA1 expires: the share is free again (swept before refusing).
			req(by(send("A2", "CA2", "m", "D2"), "o/u/a"), KindNewContext).after(11 * time.Minute),
		})
	})
	t.Run("unlimited", func(t *testing.T) {
		var steps []step
		for i := range 30 {
			id := fmt.Sprint(i)
			steps = append(steps, req(by(send("A"+id, "CA"+id, "m", "D"+id), "o/u/a"), KindNewContext))
		}
		run(t, basePolicy(), steps)
	})
}

// TestFloodingCallerCannotLockOutAnother (testing/quick): whatever the agent's limit and however
// a flooding caller's attempts interleave with another caller's, the other caller's new contexts
// are accepted until it holds its fair share, ceil(limit/3) with two callers: the flooder never
// holds more than half of the agent, and the rest always covers that share.
func TestFloodingCallerCannotLockOutAnother(t *testing.T) {
	prop := func(limit uint8, order uint64) bool {
		p := basePolicy()
		p.MaxActiveContextsPerAgent = int(limit%200) + 2
		a := NewAgent()
		share := (p.MaxActiveContextsPerAgent + 2) / 3
		victim, n := 0, 0
		for i := 0; victim < share; i++ {
			n++
			if order>>(i%64)&1 == 0 || i > 4*p.MaxActiveContextsPerAgent {
				id := fmt.Sprint("V", i)
				d := a.Decide(p, t0, by(send(id, "C"+id, "m", "D"+id), "o/u/victim"))
				if d.Kind != KindNewContext {
					t.Logf("limit %d: the victim's new context %d refused (%v) with the flooder holding %d",
						p.MaxActiveContextsPerAgent, victim+1, d.Err, a.CallerContexts("o/u/flooder"))
					return false
				}
				victim++
				continue
			}
			id := fmt.Sprint("F", i)
			a.Decide(p, t0, by(send(id, "C"+id, "m", "D"+id), "o/u/flooder"))
			if held := a.CallerContexts("o/u/flooder"); held > (p.MaxActiveContextsPerAgent+1)/2 {
				t.Logf("limit %d: the flooder holds %d", p.MaxActiveContextsPerAgent, held)
				return false
			}
		}
		return a.check(p) == nil
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 2000}); err != nil {
		t.Fatal(err)
	}
}
