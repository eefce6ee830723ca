package convservice

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// The engine's rule values are the extension's wire values (the engine does
// not import pkg/a2amqtt; this pins them together).
func TestHintValuesMatchTheExtension(t *testing.T) {
	for got, want := range map[string]string{
		conversation.ExpectApproval:         string(a2amqtt.ExpectApproval),
		conversation.ExpectCredential:       string(a2amqtt.ExpectCredential),
		conversation.ResumeSameTask:         string(a2amqtt.ResumeSameTask),
		conversation.ResumeNewTaskInContext: string(a2amqtt.ResumeNewTaskInContext),
	} {
		if got != want {
			t.Errorf("engine value %q, extension %q", got, want)
		}
	}
	h := conversation.Continuation{ExpectedInput: "approval", ResumeScope: "same_task", HistoryPolicy: "none", AcceptedHistoryDigest: "sha256:00"}
	a, _ := json.Marshal(h)
	b, _ := json.Marshal(wireHint(h))
	if string(a) != string(b) || engineHint(wireHint(h)) != h {
		t.Errorf("engine hint %s, wire hint %s", a, b)
	}
}

func TestHintOf(t *testing.T) {
	m := a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart("approve?"))
	a2amqtt.SetContinuation(m, a2amqtt.Continuation{ExpectedInput: a2amqtt.ExpectApproval, ResumeScope: a2amqtt.ResumeSameTask})
	raw, _ := json.Marshal(m)
	h, err := hintOf(raw)
	if err != nil || h == nil || h.ExpectedInput != "approval" || h.ResumeScope != "same_task" {
		t.Fatalf("hint %+v %v", h, err)
	}
	if h, err := hintOf([]byte(`{"messageId":"m","role":"ROLE_AGENT","parts":[]}`)); h != nil || err != nil {
		t.Fatalf("no hint: %+v %v", h, err)
	}
	bad := `{"metadata":{"` + a2amqtt.ContinuationExtensionURI + `":{"expected_input":"telepathy"}}}`
	if h, err := hintOf([]byte(bad)); h != nil || err == nil {
		t.Fatalf("malformed hint accepted: %+v %v", h, err)
	}
	if got := withDigest(nil, "sha256:ab"); got == nil || got.AcceptedHistoryDigest != "sha256:ab" {
		t.Fatalf("digest without a hint: %+v", got)
	}
	agentSaid := &conversation.Continuation{ExpectedInput: "approval", AcceptedHistoryDigest: "sha256:agent"}
	if got := withDigest(agentSaid, "sha256:service"); got.AcceptedHistoryDigest != "sha256:service" || got.ExpectedInput != "approval" || agentSaid.AcceptedHistoryDigest != "sha256:agent" {
		t.Fatalf("withDigest %+v (agent's %+v)", got, agentSaid)
	}
}

func TestIsApproval(t *testing.T) {
	send := func(parts string, extra string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","taskId":"t","contextId":"c","role":"ROLE_USER","parts":[` + parts + `]` + extra + `}}}`)
	}
	for _, c := range []struct {
		name    string
		payload []byte
		dialect a2amqtt.Dialect
		want    bool
	}{
		{"text only", send(`{"text":"yes"}`, ""), a2amqtt.DialectV1, false},
		{"approve part", send(`{"text":"ok"},{"data":{"decision":"approve"}}`, ""), a2amqtt.DialectV1, true},
		{"deny part", send(`{"data":{"decision":"deny","reason":"no"}}`, ""), a2amqtt.DialectV1, true},
		{"other decision", send(`{"data":{"decision":"maybe"}}`, ""), a2amqtt.DialectV1, false},
		{"kagent tool_approval_response", send(`{"text":"ok"}`, `,"extensions":["`+kagentHITLExtension+`"],"metadata":{"`+kagentHITLExtension+`":{"type":"tool_approval_response","decisions":{"x":"approve"}}}`), a2amqtt.DialectV1, true},
		{"v0.3 data part", []byte(`{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"kind":"message","messageId":"m","role":"user","parts":[{"kind":"data","data":{"decision":"approve"}}]}}}`), a2amqtt.DialectV03, true},
	} {
		if got := isApproval(c.payload, c.dialect); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestStampHint: the service's digest goes into the relayed status message
// (metadata under the extension URI, the URI in extensions), whatever shape
// the reply has, and nothing else of the reply changes.
func TestStampHint(t *testing.T) {
	h := conversation.Continuation{ExpectedInput: "approval", AcceptedHistoryDigest: "sha256:ab"}
	msg := `{"messageId":"m","role":"ROLE_AGENT","parts":[{"text":"approve?"}],"metadata":{"other":1}}`
	for _, payload := range []string{
		`{"jsonrpc":"2.0","id":7,"result":{"statusUpdate":{"taskId":"t","contextId":"c","status":{"state":"TASK_STATE_INPUT_REQUIRED","message":` + msg + `}}}}`,
		`{"jsonrpc":"2.0","id":7,"result":{"task":{"id":"t","contextId":"c","status":{"state":"TASK_STATE_INPUT_REQUIRED","message":` + msg + `},"history":[]}}}`,
		`{"jsonrpc":"2.0","id":7,"result":{"kind":"status-update","taskId":"t","contextId":"c","final":true,"status":{"state":"input-required","message":` + msg + `}}}`,
	} {
		out, err := stampHint([]byte(payload), h)
		if err != nil {
			t.Fatalf("%s: %v", payload, err)
		}
		pr, err := parseReply(out)
		if err != nil {
			t.Fatal(err)
		}
		got, err := hintOf(pr.statusMessage)
		if err != nil || got == nil || *got != h || !strings.Contains(string(pr.statusMessage), `"other":1`) ||
			!strings.Contains(string(pr.statusMessage), `"extensions":["`+a2amqtt.ContinuationExtensionURI+`"]`) {
			t.Fatalf("stamped %s: hint %+v %v", out, got, err)
		}
		var before, after map[string]any
		_ = json.Unmarshal([]byte(payload), &before)
		_ = json.Unmarshal(out, &after)
		if before["id"] != after["id"] || before["jsonrpc"] != after["jsonrpc"] {
			t.Fatalf("envelope changed: %s", out)
		}
	}
	if _, err := stampHint([]byte(`{"jsonrpc":"2.0","id":7,"result":{"statusUpdate":{"taskId":"t","status":{"state":"TASK_STATE_INPUT_REQUIRED"}}}}`), h); err == nil {
		t.Fatal("stamped a status without a message")
	}
}

func TestTaskIDTranslation(t *testing.T) {
	send := []byte(`{"jsonrpc":"2.0","id":"r1","method":"SendStreamingMessage","params":{"message":{"messageId":"m","taskId":"req-task","contextId":"req-ctx","role":"ROLE_USER","parts":[{"text":"req-task"}]}}}`)
	out, err := withoutTaskID(send)
	if err != nil || strings.Contains(string(out), `"taskId"`) || !strings.Contains(string(out), `"contextId":"req-ctx"`) || !strings.Contains(string(out), `"text":"req-task"`) {
		t.Fatalf("withoutTaskID: %s %v", out, err)
	}
	task := &conversation.Task{ID: "req-task", AgentTaskID: "agent-task", AgentContextID: "agent-ctx"}
	out, err = toAgentIDs(send, conversation.MethodSendStreamingMessage, task)
	if err != nil || !strings.Contains(string(out), `"taskId":"agent-task"`) || !strings.Contains(string(out), `"contextId":"agent-ctx"`) ||
		!strings.Contains(string(out), `"text":"req-task"`) {
		t.Fatalf("toAgentIDs send: %s %v", out, err)
	}
	out, err = toAgentIDs([]byte(`{"jsonrpc":"2.0","id":2,"method":"CancelTask","params":{"id":"req-task"}}`), conversation.MethodCancelTask, task)
	if err != nil || !strings.Contains(string(out), `"id":"agent-task"`) {
		t.Fatalf("toAgentIDs cancel: %s %v", out, err)
	}
	// Replies: whole JSON strings equal to the agent's ids are translated,
	// text that mentions them is not.
	reply := `{"jsonrpc":"2.0","id":"r1","result":{"task":{"id":"agent-task","contextId":"agent-ctx","status":{"state":"TASK_STATE_WORKING"},` +
		`"history":[{"messageId":"m","taskId":"agent-task","role":"ROLE_USER","parts":[{"text":"I am agent-task, see \"agent-task\""}]}]}}}`
	rt := route{TaskID: "req-task", ContextID: "req-ctx"}
	pr, err := parseReply([]byte(reply))
	if err != nil {
		t.Fatal(err)
	}
	pairs := replyPairs(rt, pr)
	got := string(toRequesterIDs([]byte(reply), pairs))
	if strings.Count(got, `"req-task"`) != 2 || !strings.Contains(got, `"contextId":"req-ctx"`) ||
		!strings.Contains(got, `I am agent-task, see \"agent-task\"`) || strings.Contains(got, `"agent-task"`) {
		t.Fatalf("translated reply %s (pairs %+v)", got, pairs)
	}
}

func TestReplyItems(t *testing.T) {
	for _, c := range []struct {
		payload string
		want    []string // kind:key
	}{
		{`{"result":{"statusUpdate":{"taskId":"t","status":{"state":"TASK_STATE_WORKING","message":{"messageId":"a1","role":"ROLE_AGENT","parts":[{"text":"w"}]}}}}}`, []string{"1:a1"}},
		{`{"result":{"artifactUpdate":{"taskId":"t","append":true,"artifact":{"artifactId":"r","parts":[{"text":"x"}]}}}}`, []string{"2:r+"}},
		{`{"result":{"task":{"id":"t","status":{"state":"TASK_STATE_COMPLETED","message":{"messageId":"a2","role":"ROLE_AGENT","parts":[{"text":"d"}]}},"history":[{"messageId":"u1","role":"ROLE_USER","parts":[{"text":"q"}]}],"artifacts":[{"artifactId":"r","parts":[{"text":"x"}]}]}}}`, []string{"1:u1", "1:a2", "2:r"}},
		{`{"result":{"message":{"messageId":"a3","role":"ROLE_AGENT","parts":[{"text":"hi"}]}}}`, []string{"1:a3"}},
		{`{"result":{"kind":"status-update","taskId":"t","contextId":"c","final":true,"status":{"state":"input-required","message":{"kind":"message","messageId":"a4","role":"agent","parts":[{"kind":"text","text":"?"}]}}}}`, []string{"1:a4"}},
		{`{"result":{"kind":"artifact-update","taskId":"t","contextId":"c","artifact":{"artifactId":"r2","parts":[{"kind":"text","text":"x"}]}}}`, []string{"2:r2"}},
	} {
		pr, err := parseReply([]byte(c.payload))
		if err != nil {
			t.Fatal(err)
		}
		items, err := replyItems([]byte(c.payload), pr)
		if err != nil {
			t.Fatalf("%s: %v", c.payload, err)
		}
		var got []string
		for _, it := range items {
			k := string(rune('0'+it.Kind)) + ":" + it.Key
			if it.Append {
				k += "+"
			}
			got = append(got, k)
			// Whatever the dialect, what is kept is A2A v1.0 JSON.
			var probe struct {
				Role string `json:"role"`
			}
			_ = json.Unmarshal(it.Data, &probe)
			if it.Kind == convstore.ItemMessage && !strings.HasPrefix(probe.Role, "ROLE_") {
				t.Errorf("%s: kept %s", c.payload, it.Data)
			}
		}
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("%s: items %v, want %v", c.payload, got, c.want)
		}
	}
	items, err := requestItems([]byte(`{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"kind":"message","messageId":"u9","role":"user","parts":[{"kind":"text","text":"hi"}]}}}`), a2amqtt.DialectV03, "u9")
	if err != nil || len(items) != 1 || !strings.Contains(string(items[0].Data), `"ROLE_USER"`) {
		t.Fatalf("v0.3 request item: %+v %v", items, err)
	}
}

// TestRunDigest: the digest of a run is a2amqtt.HistoryDigest over the
// forwarded message, the served messages oldest first (by history order,
// not by the order they were served in) and the served artifact ids.
func TestRunDigest(t *testing.T) {
	r := newRuns()
	payload := []byte(`{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m9","taskId":"t","contextId":"c","role":"ROLE_USER","parts":[{"text":"go"}]}}}`)
	r.start("a", "t", &inbound{payload: payload}, a2amqtt.DialectV1, false)
	m1 := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("first"))
	m2 := a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart("second"))
	r.servedHistory("a", []string{"t", "other"}, map[uint64]*a2a.Message{7: m2}, []string{"z"})
	r.servedHistory("a", []string{"t"}, map[uint64]*a2a.Message{3: m1}, []string{"a", "z"})
	got, ok, err := r.digest("a", "t")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	msg, _ := requestMessage(payload, a2amqtt.DialectV1)
	want, _ := a2amqtt.HistoryDigest(msg, []*a2a.Message{m1, m2}, []string{"a", "z"})
	if got != want {
		t.Fatalf("digest %s, want %s", got, want)
	}
	r.end("a", "t")
	if _, ok, _ := r.digest("a", "t"); ok {
		t.Fatal("an ended run still has a digest")
	}
}
