package convservice

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

func TestSealIsEncryptedAndAuthenticated(t *testing.T) {
	s, err := newSealer([]byte("secret-one"))
	if err != nil {
		t.Fatal(err)
	}
	r := route{Agent: "acme/sales/memory", TaskID: "task-1", ContextID: "ctx-1", Method: conversation.MethodSendMessage,
		Correlation: []byte("requester-correlation-0123"), ResponseTopic: "$a2a/v1/reply/acme/sales/client/abc"}
	sealed := s.seal(r)
	for _, secret := range [][]byte{[]byte(r.ResponseTopic), r.Correlation, []byte(r.TaskID), []byte("acme/sales")} {
		if bytes.Contains(sealed, secret) {
			t.Fatalf("sealed route reveals %q", secret)
		}
	}
	if bytes.Equal(sealed, s.seal(r)) {
		t.Fatal("two seals of one route are equal: nonce reused")
	}
	got, err := s.open(sealed)
	if err != nil || got.ResponseTopic != r.ResponseTopic || !bytes.Equal(got.Correlation, r.Correlation) ||
		got.Agent != r.Agent || got.TaskID != r.TaskID || got.ContextID != r.ContextID || got.Method != r.Method || got.Internal || got.Retry {
		t.Fatalf("open: %+v %v", got, err)
	}
	for _, flags := range []route{{Internal: true}, {Retry: true}, {Internal: true, Retry: true}} {
		f := r
		f.Internal, f.Retry = flags.Internal, flags.Retry
		if got, err := s.open(s.seal(f)); err != nil || got.Internal != f.Internal || got.Retry != f.Retry {
			t.Fatalf("flags internal=%v retry=%v: opened %+v %v", f.Internal, f.Retry, got, err)
		}
	}
	for i := range sealed {
		forged := bytes.Clone(sealed)
		forged[i] ^= 0x01
		if _, err := s.open(forged); err == nil {
			t.Fatalf("a route with byte %d flipped opened", i)
		}
	}
	if _, err := s.open(sealed[:len(sealed)-1]); err == nil {
		t.Fatal("truncated route opened")
	}
	other, _ := newSealer([]byte("secret-two"))
	if _, err := other.open(sealed); err == nil {
		t.Fatal("a route opened under another key")
	}
	// Rotation: the new key is current, the old one still opens.
	rotated, err := newSealer([]byte("secret-two"), []byte("secret-one"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rotated.open(sealed); err != nil {
		t.Fatalf("previous key does not open: %v", err)
	}
	if _, err := s.open(rotated.seal(r)); err == nil {
		t.Fatal("a route sealed with the new key opened with the old one only")
	}
	if _, err := newSealer(nil); err == nil {
		t.Fatal("empty secret accepted")
	}
}

func TestClientIDIsNotDerivable(t *testing.T) {
	a, b := clientRef([]byte("s"), "r1"), clientRef([]byte("s"), "r1")
	if a != b {
		t.Fatal("client id not stable for one replica")
	}
	if a == clientRef([]byte("s"), "r2") || a == clientRef([]byte("t"), "r1") {
		t.Fatal("client id does not depend on replica and secret")
	}
	if err := a.Validate(); err != nil || a.Org != identity.ReservedOrg {
		t.Fatalf("client ref %v: %v", a, err)
	}
	if a.ClientID() == identity.Service.ClientID()+"-r1" {
		t.Fatal("client id is derivable from the replica id")
	}
}

func TestReplyPathAdmission(t *testing.T) {
	in := func(sender, respTo string) *inbound {
		i := &inbound{respTo: respTo}
		if sender != "" {
			i.user = paho.UserProperties{{Key: identity.SenderProperty, Value: sender}}
		}
		return i
	}
	if ref, present, ok := senderIdentity(in("a2a:acme/sales/client", "")); !present || !ok || ref.Agent != "client" {
		t.Fatalf("sender %v %v %v", ref, present, ok)
	}
	if _, present, ok := senderIdentity(in("a2a:conversation-service", "")); !present || ok {
		t.Fatal("a non-agent sender parsed as an agent")
	}
	if _, present, _ := senderIdentity(in("", "")); present {
		t.Fatal("absent sender present")
	}
	if id, ok := replyIdentity("$a2a/v1/reply/acme/sales/client/x"); !ok || id.Agent != "client" {
		t.Fatalf("reply identity %v %v", id, ok)
	}
	if _, ok := replyIdentity("$a2a/v1/request/acme/sales/client"); ok {
		t.Fatal("a request topic taken for a reply topic")
	}
}

func TestAssignIDsKeepsTheRequest(t *testing.T) {
	in := []byte(`{"jsonrpc":"2.0","id":7,"method":"message/send","params":{"message":{"kind":"message","messageId":"m1","role":"user","parts":[{"kind":"text","text":"hi"}]},"metadata":{"k":1}}}`)
	tid, cid := "0b8f5c3a-6d2e-4f7b-8a91-3c5d7e9f1a2b", "6f1c2c7e-2b1a-4d55-9a38-0c6f0d1e9b21"
	out, err := assignIDs(in, tid, cid)
	if err != nil {
		t.Fatal(err)
	}
	req, err := a2amqtt.DecodeRequest(out, a2amqtt.DecodeLimits{})
	if err != nil || req.TaskID != tid || req.ContextID != cid || req.MessageID != "m1" || req.Method != "message/send" {
		t.Fatalf("decoded %+v %v", req, err)
	}
	var v map[string]any
	_ = json.Unmarshal(out, &v)
	if v["params"].(map[string]any)["metadata"].(map[string]any)["k"].(float64) != 1 {
		t.Fatalf("metadata lost: %s", out)
	}
}

func TestReplyEvent(t *testing.T) {
	for _, c := range []struct {
		payload string
		kind    conversation.EventKind
		task    string
		state   string
		final   bool
	}{
		{`{"jsonrpc":"2.0","id":1,"result":{"statusUpdate":{"taskId":"t","contextId":"c","status":{"state":"TASK_STATE_WORKING"}}}}`, conversation.EventStatus, "t", "TASK_STATE_WORKING", false},
		{`{"jsonrpc":"2.0","id":1,"result":{"statusUpdate":{"taskId":"t","final":true,"status":{"state":"TASK_STATE_COMPLETED"}}}}`, conversation.EventStatus, "t", "TASK_STATE_COMPLETED", true},
		{`{"jsonrpc":"2.0","id":1,"result":{"artifactUpdate":{"taskId":"t","artifact":{"parts":[]}}}}`, conversation.EventArtifact, "t", "", false},
		{`{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t","status":{"state":"TASK_STATE_INPUT_REQUIRED"}}}}`, conversation.EventTask, "t", "TASK_STATE_INPUT_REQUIRED", false},
		{`{"jsonrpc":"2.0","id":1,"result":{"message":{"taskId":"t","role":"ROLE_AGENT","parts":[]}}}`, conversation.EventMessage, "t", "", false},
		{`{"jsonrpc":"2.0","id":1,"result":{"kind":"status-update","taskId":"t","status":{"state":"input-required"},"final":true}}`, conversation.EventStatus, "t", "TASK_STATE_INPUT_REQUIRED", true},
		{`{"jsonrpc":"2.0","id":1,"result":{"kind":"task","id":"t","status":{"state":"completed"}}}`, conversation.EventTask, "t", "TASK_STATE_COMPLETED", false},
		{`{"jsonrpc":"2.0","id":1,"result":{"id":"t","status":{"state":"TASK_STATE_CANCELED"}}}`, conversation.EventTask, "t", "TASK_STATE_CANCELED", false},
		{`{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"nope"}}`, conversation.EventError, "", "", false},
		{`{"jsonrpc":"2.0","id":1,"result":{"tasks":[]}}`, "", "", "", false},
	} {
		pr, err := parseReply([]byte(c.payload))
		ev := pr.ev
		if err != nil || ev.Kind != c.kind || ev.TaskID != c.task || string(ev.State) != c.state || ev.Final != c.final {
			t.Errorf("%s: %+v %v", c.payload, ev, err)
		}
	}
	pr, err := parseReply([]byte(`{"jsonrpc":"2.0","id":1,"error":{"code":-32005,"message":"x","data":{"a2a_error":"transport_protocol_error"}}}`))
	if err != nil || pr.errCode != -32005 || pr.errKind != "transport_protocol_error" {
		t.Errorf("binding error: %+v %v", pr, err)
	}
	pr, err = parseReply([]byte(`{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t","contextId":"c","status":{"state":"TASK_STATE_INPUT_REQUIRED","message":{"messageId":"m","role":"ROLE_AGENT","parts":[{"text":"?"}]}}}}}`))
	if err != nil || !pr.isTask || pr.v03 || !strings.Contains(string(pr.statusMessage), `"messageId":"m"`) {
		t.Errorf("task with status message: %+v %v", pr, err)
	}
	if _, err := parseReply([]byte(`{"jsonrpc":"2.0","id":1}`)); err == nil {
		t.Error("a reply without result or error classified")
	}
	if _, err := parseReply([]byte(`{"result":"text"}`)); err == nil {
		t.Error("a non-object result classified")
	}
}
