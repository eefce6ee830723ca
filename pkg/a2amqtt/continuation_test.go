package a2amqtt

import (
	"encoding/json"
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
