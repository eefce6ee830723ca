package a2amqtt

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

func TestContinuationRoundTripThroughJSON(t *testing.T) {
	m := &a2a.Message{ID: "m1", Role: a2a.MessageRoleAgent, Parts: a2a.ContentParts{a2a.NewTextPart("approve?")}}
	want := Continuation{ExpectedInput: ExpectApproval, ResumeScope: ResumeSameTask, HistoryPolicy: HistoryAgentFetched}
	SetContinuation(m, want)
	SetContinuation(m, want)
	if len(m.Extensions) != 1 || m.Extensions[0] != ContinuationExtensionURI {
		t.Fatalf("extensions = %v", m.Extensions)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back a2a.Message
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	got, ok, err := ContinuationOf(&back)
	if !ok || err != nil || got != want {
		t.Fatalf("ContinuationOf = %+v %v %v (json %s)", got, ok, err, b)
	}
	back.Metadata[ContinuationExtensionURI] = map[string]any{"expected_input": "telepathy"}
	if _, ok, err := ContinuationOf(&back); !ok || err == nil {
		t.Fatalf("an unknown expected_input must be reported, got ok=%v err=%v", ok, err)
	}
	if _, ok, _ := ContinuationOf(&a2a.Message{}); ok {
		t.Fatal("no metadata means no hint")
	}
}

func TestApprovalPart(t *testing.T) {
	m := &a2a.Message{Parts: a2a.ContentParts{a2a.NewTextPart("ok"), ApprovalPart(false, "not today")}}
	b, _ := json.Marshal(m)
	var back a2a.Message
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	approved, reason, ok := ApprovalOf(&back)
	if !ok || approved || reason != "not today" {
		t.Fatalf("ApprovalOf = %v %q %v", approved, reason, ok)
	}
	if _, _, ok := ApprovalOf(&a2a.Message{Parts: a2a.ContentParts{a2a.NewTextPart("go ahead")}}); ok {
		t.Fatal("text is not a structured approval")
	}
}

// TestHistoryDigestVector pins the digest of a fixed input: any change to the preimage's
// encoding changes it, and docs/protocol.md quotes the same vector. It was reproduced outside Go:
// python3 json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) gives the
// same canonical bytes for this input (no numbers, so JCS and sorted compact JSON agree).
func TestHistoryDigestVector(t *testing.T) {
	msg := &a2a.Message{ID: "m3", ContextID: "c1", TaskID: "t2", Role: a2a.MessageRoleUser, Parts: a2a.ContentParts{a2a.NewTextPart("and <now> in EUR?")}}
	h1 := &a2a.Message{ID: "m1", ContextID: "c1", TaskID: "t1", Role: a2a.MessageRoleUser, Parts: a2a.ContentParts{a2a.NewTextPart("price of X")}}
	h2 := &a2a.Message{ID: "m2", ContextID: "c1", TaskID: "t1", Role: a2a.MessageRoleAgent, Parts: a2a.ContentParts{a2a.NewTextPart("12 USD")}}
	d1, err := HistoryDigest(msg, []*a2a.Message{h1, h2}, []string{"a2", "a1", "a2"})
	if err != nil {
		t.Fatal(err)
	}
	d2, _ := HistoryDigest(msg, []*a2a.Message{h1, h2}, []string{"a1", "a2"})
	if d1 != d2 {
		t.Fatalf("artifact order/duplicates must not matter: %s vs %s", d1, d2)
	}
	d3, _ := HistoryDigest(msg, []*a2a.Message{h2, h1}, []string{"a1", "a2"})
	if d3 == d1 {
		t.Fatal("history order must matter")
	}
	const want = "sha256:b94753e3f8bf6f04ec05775d90de7ab421b8ad7bbab52fbe7750c9bef95869ae"
	if d1 != want {
		t.Logf("digest vector: %s", d1)
		t.Fatalf("digest changed: got %s want %s", d1, want)
	}
}

func TestInputRequiredHelper(t *testing.T) {
	info := a2a.TaskInfo{TaskID: "t1", ContextID: "c1"}
	question := a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart("deploy?"))
	hint := Continuation{ExpectedInput: ExpectApproval, ResumeScope: ResumeSameTask, HistoryPolicy: HistoryNone}
	ev := InputRequired(info, question, hint)
	if ev.Status.State != a2a.TaskStateInputRequired || ev.TaskID != "t1" || ev.ContextID != "c1" {
		t.Fatalf("event: %+v", ev)
	}
	m := ev.Status.Message
	if m == question || question.Metadata != nil || len(question.Extensions) != 0 {
		t.Fatal("the caller's message must not be modified")
	}
	if m.TaskID != "t1" || m.ContextID != "c1" || m.Role != a2a.MessageRoleAgent || TextOf(m) != "deploy?" {
		t.Fatalf("status message: %+v", m)
	}
	i, ok := InterruptionOf(ev)
	if !ok || i.Continuation == nil || *i.Continuation != hint || !i.ExpectsApproval() || i.Question() != "deploy?" || i.HintError != nil {
		t.Fatalf("InterruptionOf: %+v %v", i, ok)
	}
	checkInterruptionKinds(t, info, ev)
}

// checkInterruptionKinds: auth-required has a default question; a Task in input-required is an
// interruption with its hint, working is none, and a malformed hint is reported.
func checkInterruptionKinds(t *testing.T, info a2a.TaskInfo, ev *a2a.TaskStatusUpdateEvent) {
	t.Helper()
	auth := AuthRequired(info, nil, Continuation{ExpectedInput: ExpectCredential})
	if auth.Status.State != a2a.TaskStateAuthRequired || TextOf(auth.Status.Message) != "Credentials expected." {
		t.Fatalf("auth-required: %+v", auth.Status)
	}
	// A Task result in input-required carries the same hint; other states are no interruption.
	task := &a2a.Task{ID: "t1", ContextID: "c1", Status: ev.Status}
	if i, ok := InterruptionOf(task); !ok || i.Continuation == nil || i.TaskID != "t1" {
		t.Fatalf("task interruption: %+v %v", i, ok)
	}
	if _, ok := InterruptionOf(a2a.NewStatusUpdateEvent(info, a2a.TaskStateWorking, nil)); ok {
		t.Fatal("working is no interruption")
	}
	bad := InputRequired(info, nil, Continuation{})
	bad.Status.Message.Metadata[ContinuationExtensionURI] = map[string]any{"resume_scope": "sometime"}
	if i, ok := InterruptionOf(bad); !ok || i.Continuation != nil || i.HintError == nil {
		t.Fatalf("a malformed hint must be reported: %+v", i)
	}
}

func TestDeclareContinuation(t *testing.T) {
	card := &a2a.AgentCard{Name: "x"}
	DeclareContinuation(DeclareContinuation(card))
	if len(card.Capabilities.Extensions) != 1 || !DeclaresExtension(card, ContinuationExtensionURI) || card.Capabilities.Extensions[0].Required {
		t.Fatalf("extensions: %+v", card.Capabilities.Extensions)
	}
	if DeclaresExtension(nil, ContinuationExtensionURI) || DeclaresExtension(card, KagentHITLExtensionURI) {
		t.Fatal("DeclaresExtension")
	}
}

// TestApprovalForms: the extension's data part, kagent's decision_type data part and kagent
// hitl/v1's tool_approval_response are all approval answers; text is not.
func TestApprovalForms(t *testing.T) {
	roundTrip := func(m *a2a.Message) *a2a.Message {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var back a2a.Message
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		return &back
	}
	kagent := func(approvals ...map[string]any) *a2a.Message {
		m := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("decided"))
		m.Extensions = []string{KagentHITLExtensionURI}
		m.Metadata = map[string]any{KagentHITLExtensionURI: map[string]any{"type": "tool_approval_response", "approvals": approvals}}
		return m
	}
	for _, tc := range []struct {
		name     string
		msg      *a2a.Message
		ok, yes  bool
		reasonIs string
	}{
		{"approval message", ApprovalMessage(true, ""), true, true, ""},
		{"deny with reason", ApprovalMessage(false, "too risky"), true, false, "too risky"},
		{"kagent decision_type approve", a2a.NewMessage(a2a.MessageRoleUser, a2a.NewDataPart(map[string]any{"decision_type": "approve"})), true, true, ""},
		{"kagent decision_type reject", a2a.NewMessage(a2a.MessageRoleUser, a2a.NewDataPart(map[string]any{"decision_type": "reject"})), true, false, ""},
		{"kagent hitl all approved", kagent(map[string]any{"id": "a", "approved": true}, map[string]any{"id": "b", "approved": true}), true, true, ""},
		{"kagent hitl one rejected", kagent(map[string]any{"id": "a", "approved": true}, map[string]any{"id": "b", "approved": false, "rejection_reason": "not prod"}), true, false, "not prod"},
		{"kagent hitl without approved", kagent(map[string]any{"id": "a"}), false, false, ""},
		{"text only", a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("go ahead")), false, false, ""},
		{"other data", a2a.NewMessage(a2a.MessageRoleUser, a2a.NewDataPart(map[string]any{"decision": "maybe"})), false, false, ""},
	} {
		approved, reason, ok := ApprovalOf(roundTrip(tc.msg))
		if ok != tc.ok || approved != tc.yes || reason != tc.reasonIs {
			t.Errorf("%s: ApprovalOf = %v %q %v, want %v %q %v", tc.name, approved, reason, ok, tc.yes, tc.reasonIs, tc.ok)
		}
	}
	// kagent's rule: the metadata counts only when the message lists the extension.
	m := kagent(map[string]any{"id": "a", "approved": true})
	m.Extensions = nil
	if _, _, ok := ApprovalOf(m); ok {
		t.Fatal("a hitl payload without the URI in extensions is not an answer")
	}
	if TextOf(ApprovalMessage(false, "no")) != "deny: no" {
		t.Fatal("the approval message says its decision in text too")
	}
}

func TestContinuationMismatchError(t *testing.T) {
	hint := Continuation{ExpectedInput: ExpectApproval, ResumeScope: ResumeSameTask}
	e := NewContinuationMismatch(hint, "t1", "c1", "approve or deny")
	var err error = e
	if !errors.Is(err, ErrContinuationMismatch) || e.IsBindingError() || e.Retryable() || e.Code != -32063 {
		t.Fatalf("classification: %v", e)
	}
	got, reason, ok := ContinuationMismatchOf(fmt.Errorf("wrapped: %w", err))
	if !ok || got != hint || reason != "approve or deny" {
		t.Fatalf("ContinuationMismatchOf = %+v %q %v", got, reason, ok)
	}
	if _, _, ok := ContinuationMismatchOf(NewBindingError(A2AErrorTransportProtocolError, "x")); ok {
		t.Fatal("other errors are no mismatch")
	}
}
