package conversation

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

var update = flag.Bool("update", false, "rewrite golden files")

// pause is an input-required (or auth-required) status carrying hint h.
func pause(task, corr string, s a2a.TaskState, h *Continuation) Event {
	return Event{Kind: EventStatus, TaskID: task, State: s, Correlation: []byte(corr), Continuation: h}
}

func approval(r Request) Request { r.Approval = true; return r }

func mismatch(r Request) step {
	s := rejected(r, CodeContinuationMismatch, ErrContinuationMismatch)
	s.a2aErr = A2AErrorContinuationMismatch
	return s
}

// wantExpected checks error.data.expected and the waiting task a refusal names.
func wantExpected(task string, h Continuation) func(*testing.T, *Agent, Decision, Outcome, []Expiration) {
	return func(t *testing.T, _ *Agent, d Decision, _ Outcome, _ []Expiration) {
		t.Helper()
		var data struct {
			Expected Continuation `json:"expected"`
			TaskID   string       `json:"taskId"`
		}
		if err := json.Unmarshal(d.Err.Data, &data); err != nil || data.Expected != h || data.TaskID != task {
			t.Fatalf("refusal data %s (%v), want expected %+v for task %s", d.Err.Data, err, h, task)
		}
	}
}

// TestContinuationRules: the service enforces what the responder declared in
// its continuation hint (issue 12, seed 004 §3): resume_scope and
// expected_input, each accepted and refused, and nothing changes for tasks
// that declared nothing.
func TestContinuationRules(t *testing.T) {
	p := basePolicy()

	t.Run("same_task: a new task in the context is refused until the waiting task is answered", func(t *testing.T) {
		h := &Continuation{ExpectedInput: "free_text", ResumeScope: ResumeSameTask}
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(pause("T1", "D1", inputReq, h)),
			mismatch(send("T2", "C", "m2", "D2")).with(wantExpected("T1", *h)),
			// Another context is not concerned.
			req(send("T3", "C3", "m3", "D3"), KindNewContext),
			req(send("T1", "C", "m4", "D4"), KindResume),
			ev(status("T1", "D4", completed)),
			req(send("T2", "C", "m2", "D5"), KindNewTask),
		})
	})

	t.Run("new_task_in_context: a message to the waiting task is refused, a new task is accepted", func(t *testing.T) {
		h := &Continuation{ResumeScope: ResumeNewTaskInContext, HistoryPolicy: "agent_fetched"}
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(pause("T1", "D1", inputReq, h)),
			mismatch(send("T1", "C", "m2", "D2")).with(wantExpected("T1", *h)),
			// Retrying the message that paused it is still a retry.
			req(send("T1", "C", "m1", "D3"), KindRetry),
			req(send("T2", "C", "m3", "D4"), KindNewTask),
		})
	})

	t.Run("approval: a resume without an approve/deny part is refused", func(t *testing.T) {
		h := &Continuation{ExpectedInput: ExpectApproval, ResumeScope: ResumeSameTask}
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(pause("T1", "D1", inputReq, h)),
			mismatch(send("T1", "C", "m2", "D2")).with(wantExpected("T1", *h)),
			req(approval(send("T1", "C", "m3", "D3")), KindResume),
			// The agent asks again without a hint: free text is fine now.
			ev(pause("T1", "D3", inputReq, nil)),
			req(send("T1", "C", "m4", "D4"), KindResume),
		})
	})

	t.Run("credential: only a task in auth-required takes it", func(t *testing.T) {
		h := &Continuation{ExpectedInput: ExpectCredential}
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(pause("T1", "D1", inputReq, h)),
			mismatch(send("T1", "C", "m2", "D2")).with(wantExpected("T1", *h)),
			req(send("T2", "C2", "m1", "D3"), KindNewContext),
			ev(pause("T2", "D3", authReq, h)),
			req(send("T2", "C2", "m2", "D4"), KindResume),
		})
	})

	t.Run("no hint: seed 000 as before (a new task while another waits, any answer)", func(t *testing.T) {
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(pause("T1", "D1", inputReq, nil)),
			req(send("T2", "C", "m2", "D2"), KindNewTask),
			req(send("T1", "C", "m3", "D3"), KindResume),
		})
	})

	t.Run("a refused resume by the agent brings the hint back", func(t *testing.T) {
		h := &Continuation{ExpectedInput: ExpectApproval}
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			ev(pause("T1", "D1", inputReq, h)),
			req(approval(send("T1", "C", "m2", "D2")), KindResume),
			ev(Event{Kind: EventError, TaskID: "T1", Correlation: []byte("D2")}),
			mismatch(send("T1", "C", "m3", "D3")),
		})
	})

	t.Run("the hint and the digest are kept with the task, durable with it", func(t *testing.T) {
		h := &Continuation{ExpectedInput: ExpectApproval, AcceptedHistoryDigest: "sha256:" + string(bytes.Repeat([]byte("ab"), 32))}
		run(t, p, []step{
			req(send("T1", "C", "m1", "D1"), KindNewContext),
			{ev: ptr(pause("T1", "D1", inputReq, h)), freed: yes(), ended: yes(), check: func(t *testing.T, a *Agent, _ Decision, o Outcome, _ []Expiration) {
				if got := a.Context("C").Task("T1").Continuation; got == nil || *got != *h || !o.Changed {
					t.Fatalf("hint %+v (changed %v)", got, o.Changed)
				}
			}},
		})
	})
}

// TestOpeningSnapshotAndAcknowledgement: a core A2A server opens every stream
// with the Task as it stands (on a resume still input-required) and may
// report "submitted": both acknowledge the run and neither pauses nor ends
// it (the service-side twin of issue 12 item 6).
func TestOpeningSnapshotAndAcknowledgement(t *testing.T) {
	p := basePolicy()
	p.MaxConcurrentTasksPerContext = 1
	stream := func(r Request) Request { r.Method = MethodSendStreamingMessage; return r }
	snap := func(task, corr string, s a2a.TaskState) *Event {
		return &Event{Kind: EventTask, Snapshot: true, TaskID: task, State: s, Correlation: []byte(corr)}
	}
	run(t, p, []step{
		req(stream(send("T1", "C", "m1", "D1")), KindNewContext),
		{ev: snap("T1", "D1", a2a.TaskStateSubmitted), ended: no(), check: wantState("T1", working)},
		{ev: ptr(status("T1", "D1", inputReq)), ended: yes(), freed: yes()},
		req(stream(send("T1", "C", "m2", "D2")), KindResume),
		{ev: snap("T1", "D2", inputReq), ended: no(), freed: no(), check: wantState("T1", working)},
		{ev: ptr(status("T1", "D2", working)), ended: no()},
		{ev: ptr(status("T1", "D2", completed)), ended: yes(), freed: yes()},
		// A terminal snapshot (subscribe to a task that just finished) ends it.
		req(stream(send("T2", "C", "m3", "D3")), KindNewTask),
		{ev: ptr(status("T2", "D3", a2a.TaskStateSubmitted)), check: wantState("T2", working)},
		{ev: snap("T2", "D3", completed), ended: yes(), freed: yes()},
	})
}

func TestAgentIDsAreRecorded(t *testing.T) {
	run(t, basePolicy(), []step{
		req(send("T1", "C", "m1", "D1"), KindNewContext),
		{ev: &Event{Kind: EventTask, Snapshot: true, TaskID: "T1", State: a2a.TaskStateSubmitted, Correlation: []byte("D1"), AgentTaskID: "agent-7"},
			check: func(t *testing.T, a *Agent, _ Decision, o Outcome, _ []Expiration) {
				if tk := a.Context("C").Task("T1"); tk.AgentTaskID != "agent-7" || !o.Changed || o.Task.AgentTaskID != "agent-7" {
					t.Fatalf("task %+v", tk)
				}
			}},
		// Later events keep the mapping; a resume's decision carries it.
		ev(status("T1", "D1", inputReq)),
		req(send("T1", "C", "m2", "D2"), KindResume).with(func(t *testing.T, _ *Agent, d Decision, _ Outcome, _ []Expiration) {
			if d.Task.AgentTaskID != "agent-7" {
				t.Fatalf("resume decision task %+v", d.Task)
			}
		}),
	})
}

// TestContinuationMismatchGolden pins the error as the service sends it
// (testdata/golden/error_continuation_mismatch.json; go test -update
// rewrites it).
func TestContinuationMismatchGolden(t *testing.T) {
	h := &Continuation{ExpectedInput: ExpectApproval, ResumeScope: ResumeSameTask, HistoryPolicy: "agent_fetched",
		AcceptedHistoryDigest: "sha256:9f2c1e0b7a4d3c6e5f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f"}
	a := NewAgent()
	p := basePolicy()
	a.Decide(p, t0, send("0b8f5c3a-6d2e-4f7b-8a91-3c5d7e9f1a2b", "6f1c2c7e-2b1a-4d55-9a38-0c6f0d1e9b21", "m1", "D1"))
	a.Observe(p, t0, pause("0b8f5c3a-6d2e-4f7b-8a91-3c5d7e9f1a2b", "D1", inputReq, h))
	d := a.Decide(p, t0, send("0b8f5c3a-6d2e-4f7b-8a91-3c5d7e9f1a2b", "6f1c2c7e-2b1a-4d55-9a38-0c6f0d1e9b21", "m2", "D2"))
	if d.Kind != KindReject || !errors.Is(d.Err, ErrContinuationMismatch) {
		t.Fatalf("decision %s %v", d.Kind, d.Err)
	}
	data := d.Err.Data
	got, err := json.MarshalIndent(map[string]any{"jsonrpc": "2.0", "id": "req-7",
		"error": map[string]any{"code": d.Err.Code, "message": d.Err.Message, "data": json.RawMessage(data)}}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "golden", "error_continuation_mismatch.json")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update once)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("error differs from %s:\n%s", path, got)
	}
}
