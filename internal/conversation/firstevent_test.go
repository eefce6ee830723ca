package conversation

import (
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// TestFirstEventTimeout: a run no agent ever acknowledged (issue 12.2: an
// offline agent on a broker that does not answer PUBACK 0x10) gives its slot
// back after Policy.FirstEventTimeout, and the requester's stream is reported
// so the service can answer it.
func TestFirstEventTimeout(t *testing.T) {
	p := basePolicy()
	p.FirstEventTimeout = 30 * time.Second
	p.MaxConcurrentTasksPerContext = 1
	p.InputRequiredTimeout = time.Hour

	t.Run("a new task nobody acknowledged is removed and frees the context", func(t *testing.T) {
		run(t, p, []step{
			req(send("T0", "C", "m0", "D0"), KindNewContext),
			ev(status("T0", "D0", completed)),
			req(send("T1", "C", "m1", "D1"), KindNewTask).after(time.Second),
			// Not yet due: the slot is still held.
			policyRejection(send("T2", "C", "m2", "D2"), CodeConcurrencyLimit, ErrConcurrencyLimit, A2AErrorConcurrencyLimit).after(30 * time.Second),
			{sweep: true, at: 31 * time.Second, check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, x []Expiration) {
				if len(x) != 1 || len(x[0].Unacknowledged) != 1 {
					t.Fatalf("expirations %+v", x)
				}
				u := x[0].Unacknowledged[0]
				if u.TaskID != "T1" || !u.Removed || len(u.Streams) != 1 || string(u.Streams[0].Correlation) != "D1" ||
					u.Streams[0].ResponseTopic == "" {
					t.Fatalf("unacknowledged %+v", u)
				}
				if _, ok := a.TaskContext("T1"); ok {
					t.Fatal("T1 still indexed")
				}
			}},
			req(send("T2", "C", "m2", "D2"), KindNewTask).after(32 * time.Second),
		})
	})

	t.Run("an acknowledged run is never undone", func(t *testing.T) {
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(status("T1", "D1", working)).after(time.Second),
			{sweep: true, at: time.Hour / 2, check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, x []Expiration) {
				if len(x) != 0 || state(t, a, "T1") != working {
					t.Fatalf("expirations %+v, state %s", x, state(t, a, "T1"))
				}
			}},
		})
	})

	t.Run("an artifact acknowledges the run", func(t *testing.T) {
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(Event{Kind: EventArtifact, TaskID: "T1", Correlation: []byte("D1")}),
			{sweep: true, at: time.Minute, check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, x []Expiration) {
				if len(x) != 0 || state(t, a, "T1") != working {
					t.Fatalf("expirations %+v, state %s", x, state(t, a, "T1"))
				}
			}},
		})
	})

	t.Run("an unacknowledged resume waits again", func(t *testing.T) {
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(status("T1", "D1", inputReq)),
			req(send("T1", "C", "m2", "D2"), KindResume).after(time.Minute),
			// Lazily applied by the next decision: the resume is undone, so a
			// new answer resumes again.
			req(send("T1", "C", "m3", "D3"), KindResume).after(2 * time.Minute).with(
				func(t *testing.T, a *Agent, d Decision, _ Outcome, x []Expiration) {
					if len(x) != 1 || len(x[0].Unacknowledged) != 1 || x[0].Unacknowledged[0].Removed {
						t.Fatalf("expirations %+v", x)
					}
				}),
		})
	})

	t.Run("the only, never acknowledged task of a context deletes it", func(t *testing.T) {
		q := p
		q.MaxActiveContextsPerAgent = 1
		run(t, q, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			policyRejection(send("T2", "C2", "m2", "D2"), CodeActiveContextsLimit, ErrActiveContextsLimit, A2AErrorActiveContextsLimit).after(time.Second),
			req(send("T2", "C2", "m2", "D2"), KindNewContext).after(time.Minute).with(
				func(t *testing.T, a *Agent, _ Decision, _ Outcome, _ []Expiration) {
					if a.Context("C") != nil {
						t.Fatal("the empty context C is still stored")
					}
				}),
		})
	})
}

// TestInputRequiredTimeoutNotifies: the stream on which the requester got
// input-required is kept, so the engine's later failure can be told there
// (issue 12.3).
func TestInputRequiredTimeoutNotifies(t *testing.T) {
	p := basePolicy()
	p.InputRequiredTimeout = time.Minute
	run(t, p, []step{
		req(send("T1", "C", "m1", "D1"), KindNewContext),
		ev(status("T1", "D1", inputReq)),
		{sweep: true, at: 2 * time.Minute, check: func(t *testing.T, a *Agent, _ Decision, _ Outcome, x []Expiration) {
			if len(x) != 1 || len(x[0].TimedOut) != 1 {
				t.Fatalf("expirations %+v", x)
			}
			to := x[0].TimedOut[0]
			if to.Notify == nil || string(to.Notify.Correlation) != "D1" || to.StatusMessage == "" {
				t.Fatalf("timed out %+v", to)
			}
			if c := a.Context("C"); c.Task("T1").Notify != nil || c.Task("T1").State != a2a.TaskStateFailed {
				t.Fatalf("task after timeout %+v", c.Task("T1"))
			}
		}},
	})
}

func policyRejection(r Request, code int, sentinel error, a2aErr string) step {
	s := rejected(r, code, sentinel)
	s.a2aErr = a2aErr
	return s
}
