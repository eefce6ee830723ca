package conversation

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

func mustJSON(t *testing.T, e *Error) map[string]any {
	t.Helper()
	raw := e.Data
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("error.data %s is not an object: %v", raw, err)
	}
	return m
}

func TestConversationErrorData(t *testing.T) {
	p := basePolicy()
	p.IdleTTL = 30 * time.Minute
	exp := errContextExpired("C", Expiry{Reason: ExpiredIdleTTL, At: t0}, p)
	got := mustJSON(t, exp)
	want := map[string]any{
		"a2a_error": "context_expired", "contextId": "C", "reason": "idle_ttl",
		"expiredAt": "2026-05-01T12:00:00Z", "idleTTL": "30m0s",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("context_expired data %s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if exp.Code != -32060 || !errors.Is(exp, ErrContextExpired) {
		t.Errorf("context_expired: %v", exp)
	}

	c := &Context{ID: "C", Working: 1, Tasks: []*Task{{ID: "T1", State: working}}}
	busy := mustJSON(t, errContextBusy(c, 1))
	if busy["a2a_error"] != "concurrency_limit" || busy["limit"] != float64(1) || busy["scope"] != "context" {
		t.Errorf("concurrency_limit data %v", busy)
	}
	lim := mustJSON(t, errActiveContexts("C9", 5, 5))
	if lim["a2a_error"] != "active_contexts_limit" || lim["limit"] != float64(5) || lim["active"] != float64(5) {
		t.Errorf("active_contexts_limit data %v", lim)
	}
	// The SDK's A2A() view keeps the reason for a2a-go based handlers.
	if ae := exp.A2A(); !errors.Is(ae, a2a.ErrServerError) || ae.Details["a2a_error"] != "context_expired" {
		t.Errorf("A2A() = %#v", ae)
	}
}

// TestA2AErrorData pins the A2A v1.0 rejections to the shape of
// pkg/a2amqtt's golden files (testdata/golden/error_context_mismatch.json,
// error_terminal_task.json): a google.protobuf.Struct, then ErrorInfo.
func TestA2AErrorData(t *testing.T) {
	e := errContextMismatch(t0, "T1", "ctx-1", "ctx-2")
	if e.Code != -32602 || !errors.Is(e, a2a.ErrInvalidParams) {
		t.Fatalf("mismatch: %v", e)
	}
	if e.Message != `contextId "ctx-2" conflicts with task T1, which belongs to context "ctx-1"` {
		t.Errorf("message %q differs from the SDK bridge's", e.Message)
	}
	raw := e.Data
	var details []map[string]any
	if err := json.Unmarshal(raw, &details); err != nil {
		t.Fatalf("data %s: %v", raw, err)
	}
	if len(details) != 2 ||
		details[0]["@type"] != "type.googleapis.com/google.protobuf.Struct" || details[0]["taskContextId"] != "ctx-1" ||
		details[1]["@type"] != "type.googleapis.com/google.rpc.ErrorInfo" || details[1]["reason"] != "INVALID_PARAMS" ||
		details[1]["domain"] != "a2a-protocol.org" {
		t.Errorf("data %s", raw)
	}
	term := errTerminalTask(t0, &Task{ID: "T1", State: completed}, "ctx-1")
	if term.Code != -32004 || !errors.Is(term, a2a.ErrUnsupportedOperation) ||
		term.Message != "task T1 is in terminal state TASK_STATE_COMPLETED and accepts no further messages; start a new task in context ctx-1" {
		t.Errorf("terminal: %v", term)
	}
}

func TestNewPolicy(t *testing.T) {
	p, err := NewPolicy(nil)
	if err != nil || p != DefaultPolicy() {
		t.Fatalf("nil spec: %+v %v", p, err)
	}
	p, err = NewPolicy(&v1alpha1.ConversationPolicySpec{})
	if err != nil || p.IdleTTL != 30*time.Minute || p.HistoryTasksPerContext != 20 || p.MaxAge != 0 || p.MaxConcurrentTasksPerContext != 0 {
		t.Fatalf("empty spec: %+v %v", p, err)
	}
	p, err = NewPolicy(&v1alpha1.ConversationPolicySpec{
		ContextIdleTTL:               &metav1.Duration{Duration: time.Minute},
		ContextMaxAge:                &metav1.Duration{Duration: time.Hour},
		InputRequiredTimeout:         &metav1.Duration{Duration: 5 * time.Minute},
		MaxConcurrentTasksPerContext: 1,
		MaxActiveContextsPerAgent:    100,
		HistoryTasksPerContext:       3,
		FirstEventTimeout:            &metav1.Duration{Duration: 10 * time.Second},
		History:                      &v1alpha1.HistorySpec{Mode: v1alpha1.HistoryMessages, MaxBytesPerContext: 4096},
	})
	want := Policy{IdleTTL: time.Minute, MaxAge: time.Hour, InputRequiredTimeout: 5 * time.Minute, FirstEventTimeout: 10 * time.Second,
		MaxConcurrentTasksPerContext: 1, MaxActiveContextsPerAgent: 100, HistoryTasksPerContext: 3,
		TombstoneTTL: DefaultTombstoneTTL, MaxStreamsPerTask: DefaultMaxStreamsPerTask,
		History: v1alpha1.HistoryMessages, MaxHistoryBytes: 4096}
	if err != nil || p != want {
		t.Fatalf("full spec: %+v %v", p, err)
	}
	if _, err := NewPolicy(&v1alpha1.ConversationPolicySpec{MaxConcurrentTasksPerContext: -1}); err == nil {
		t.Fatal("negative limit accepted")
	}
	if _, err := NewPolicy(&v1alpha1.ConversationPolicySpec{History: &v1alpha1.HistorySpec{Mode: "Everything"}}); err == nil {
		t.Fatal("unknown history mode accepted")
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]Method{
		"SendMessage": MethodSendMessage, "message/send": MethodSendMessage, "message/stream": MethodSendStreamingMessage,
		"tasks/get": MethodGetTask, "tasks/cancel": MethodCancelTask, "tasks/resubscribe": MethodSubscribeToTask,
		"ListTasks": MethodListTasks,
	} {
		if m, ok := ParseMethod(in); !ok || m != want {
			t.Errorf("ParseMethod(%q) = %q %v", in, m, ok)
		}
	}
	if _, ok := ParseMethod("GetExtendedAgentCard"); ok {
		t.Error("unruled method parsed")
	}
	for in, want := range map[string]a2a.TaskState{
		"TASK_STATE_INPUT_REQUIRED": inputReq, "input-required": inputReq, "auth-required": authReq,
		"completed": completed, "canceled": canceled, "bogus": a2a.TaskStateUnspecified,
	} {
		if got := ParseState(in); got != want {
			t.Errorf("ParseState(%q) = %q", in, got)
		}
	}
}
