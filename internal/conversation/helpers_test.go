package conversation

import (
	"errors"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// send builds a SendMessage request.
func send(task, ctx, msg, corr string) Request {
	return Request{
		Method: MethodSendMessage, TaskID: task, ContextID: ctx, MessageID: msg,
		Correlation: []byte(corr), ResponseTopic: "$a2a/v1/reply/org/unit/a/r1", Requester: "org/unit/a",
	}
}

func status(task, corr string, s a2a.TaskState) Event {
	return Event{Kind: EventStatus, TaskID: task, State: s, Correlation: []byte(corr)}
}

// step is one event of a scenario: a request (want a decision), a reply
// event (want an outcome) or a sweep.
type step struct {
	at  time.Duration
	req *Request
	ev  *Event
	// sweep runs Agent.Expire.
	sweep bool

	kind     Kind   // expected decision kind (requests)
	forward  *bool  // expected Forward when set
	code     int    // expected error code for rejections
	sentinel error  // expected errors.Is target for rejections
	a2aErr   string // expected error.data.a2a_error
	known    *bool  // expected Outcome.Known (events)
	freed    *bool  // expected Outcome.SlotFreed (events)
	ended    *bool  // expected Outcome.StreamEnded (events)
	check    func(t *testing.T, a *Agent, d Decision, o Outcome, x []Expiration)
}

func yes() *bool { b := true; return &b }
func no() *bool  { b := false; return &b }

func req(r Request, k Kind) step { return step{req: &r, kind: k} }
func ev(e Event) step            { return step{ev: &e} }
func rejected(r Request, code int, s error) step {
	return step{req: &r, kind: KindReject, code: code, sentinel: s, forward: no()}
}

func (s step) after(d time.Duration) step { s.at = d; return s }

func (s step) with(f func(t *testing.T, a *Agent, d Decision, o Outcome, x []Expiration)) step {
	s.check = f
	return s
}

// run plays the steps on a fresh Agent and checks every expectation and the
// invariants after every step.
func run(t *testing.T, p Policy, steps []step) *Agent {
	t.Helper()
	a := NewAgent()
	for i, s := range steps {
		now := t0.Add(s.at)
		var d Decision
		var o Outcome
		var x []Expiration
		switch {
		case s.req != nil:
			d = a.Decide(p, now, *s.req)
			x = d.Expirations
			if s.kind != "" && d.Kind != s.kind {
				t.Fatalf("step %d (%s %s): kind %s, want %s (err %v)", i, s.req.Method, s.req.TaskID, d.Kind, s.kind, d.Err)
			}
			if s.forward != nil && d.Forward != *s.forward {
				t.Fatalf("step %d: forward %v, want %v", i, d.Forward, *s.forward)
			}
			if d.Kind == KindReject {
				if d.Err == nil {
					t.Fatalf("step %d: reject without error", i)
				}
				if s.code != 0 && d.Err.Code != s.code {
					t.Fatalf("step %d: code %d, want %d (%v)", i, d.Err.Code, s.code, d.Err)
				}
				if s.sentinel != nil && !errors.Is(d.Err, s.sentinel) {
					t.Fatalf("step %d: error %v is not %v", i, d.Err, s.sentinel)
				}
				if d.Err.A2AError() != s.a2aErr {
					t.Fatalf("step %d: a2a_error %q, want %q", i, d.Err.A2AError(), s.a2aErr)
				}
			} else if d.Err != nil {
				t.Fatalf("step %d: %s with error %v", i, d.Kind, d.Err)
			}
		case s.ev != nil:
			o = a.Observe(p, now, *s.ev)
			x = o.Expirations
			if s.known != nil && o.Known != *s.known {
				t.Fatalf("step %d: known %v, want %v", i, o.Known, *s.known)
			}
			if s.freed != nil && o.SlotFreed != *s.freed {
				t.Fatalf("step %d: slot freed %v, want %v", i, o.SlotFreed, *s.freed)
			}
			if s.ended != nil && o.StreamEnded != *s.ended {
				t.Fatalf("step %d: stream ended %v, want %v", i, o.StreamEnded, *s.ended)
			}
		case s.sweep:
			x = a.Expire(p, now)
		}
		if s.check != nil {
			s.check(t, a, d, o, x)
		}
		if err := a.check(p); err != nil {
			t.Fatalf("step %d: invariant: %v", i, err)
		}
	}
	return a
}

func state(t *testing.T, a *Agent, task string) a2a.TaskState {
	t.Helper()
	id, ok := a.TaskContext(task)
	if !ok {
		t.Fatalf("task %s unknown", task)
	}
	return a.Context(id).Task(task).State
}

// basePolicy is the default policy without the first-event timeout, for
// scenarios that leave a forwarded task without any agent event while time
// passes (the timeout has its own tests).
func basePolicy() Policy {
	p := DefaultPolicy()
	p.FirstEventTimeout = 0
	return p
}
