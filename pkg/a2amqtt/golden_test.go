package a2amqtt

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/golden")

var (
	uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	tsRE   = regexp.MustCompile(`\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})`)
)

// normalize makes wire JSON comparable: ids and timestamps are replaced by
// placeholders and keys are sorted by re-encoding.
func normalize(t *testing.T, raw []byte) any {
	t.Helper()
	s := uuidRE.ReplaceAll(raw, []byte("<uuid>"))
	s = tsRE.ReplaceAll(s, []byte("<timestamp>"))
	var v any
	if err := json.Unmarshal(s, &v); err != nil {
		t.Fatalf("not JSON: %v: %s", err, raw)
	}
	return v
}

func checkGolden(t *testing.T, name string, payloads ...[]byte) {
	t.Helper()
	var items []any
	for _, p := range payloads {
		items = append(items, normalize(t, p))
	}
	var v any = items
	if len(items) == 1 {
		v = items[0]
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	got := buf.Bytes()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run go test -run Golden -update to create): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from the golden file:\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

// TestGoldenWire pins the A2A v1.0 ProtoJSON shapes on the wire: the
// SendMessage request, streamed status/artifact updates, and the error
// objects (binding errors with error.data.a2a_error, A2A errors with
// a2a-go's typed details).
// TestGoldenWire pins the wire format; both request handlers (the SDK's direct handler, the
// default, and a2a-go's reference handler) must produce the same bytes (after normalising ids
// and timestamps) as the golden files, which were first recorded through a2a-go's own
// JSON-RPC handler.
func TestGoldenWire(t *testing.T) {
	for _, reference := range []bool{false, true} {
		name := "direct-handler"
		if reference {
			name = "reference-handler"
		}
		t.Run(name, func(t *testing.T) { goldenWire(t, reference) })
	}
}

func goldenWire(t *testing.T, reference bool) {
	b := brokertest.StartMochi(t)
	serveT(t, b, agentB, echoExec(), func(o *ResponderOptions) { o.ReferenceHandler = reference })
	sniff := newSniffer(t, b, agentB.RequestTopic())
	req := requesterT(t, b, agentA, nil)
	var replies [][]byte
	tr := req.Transport(agentB)
	// Capture raw replies by wrapping the reply hook.
	req.dropReply = func(p *paho.Publish) bool {
		replies = append(replies, bytes.Clone(p.Payload))
		return false
	}
	msg := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("golden"))
	for _, err := range tr.SendStreamingMessage(ctxT(t, 10*time.Second), nil, &a2a.SendMessageRequest{Message: msg}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	reqs := sniff.wait(1, 3*time.Second)
	checkGolden(t, "send_streaming_message_request.json", reqs[0].Payload)
	checkGolden(t, "stream_replies.json", replies...)
	if reqs[0].Properties.ResponseTopic != req.ReplyTopic() || len(reqs[0].Properties.CorrelationData) != 16 || reqs[0].QoS != 1 || reqs[0].Retain {
		t.Fatalf("request MQTT properties: %+v qos %d retain %v", reqs[0].Properties, reqs[0].QoS, reqs[0].Retain)
	}

	peer := newRawPeer(t, b)
	// -32005 transport_protocol_error (binding).
	peer.publish(agentB.RequestTopic(), sendReq(MethodSendMessage, "", "", "no task id"), []byte("g1"))
	// -32602 invalid params (A2A): context mismatch for an existing task.
	taskID := uuid.NewString()
	peer.publish(agentB.RequestTopic(), sendReq(MethodSendMessage, taskID, "ctx-1", "first"), []byte("g2"))
	peer.await(2, 5*time.Second)
	peer.publish(agentB.RequestTopic(), sendReq(MethodSendMessage, taskID, "ctx-2", "second"), []byte("g3"))
	// UnsupportedOperation (A2A v1.0 -32004) for a completed task.
	peer.publish(agentB.RequestTopic(), sendReq(MethodSendMessage, taskID, "ctx-1", "third"), []byte("g4"))
	got := peer.await(4, 5*time.Second)
	byCorr := map[string][]byte{}
	for _, m := range got {
		byCorr[string(m.Properties.CorrelationData)] = m.Payload
	}
	checkGolden(t, "error_transport_protocol.json", byCorr["g1"])
	checkGolden(t, "send_message_result_task.json", byCorr["g2"])
	checkGolden(t, "error_context_mismatch.json", byCorr["g3"])
	checkGolden(t, "error_terminal_task.json", byCorr["g4"])
}

// TestV03Peer: an A2A v0.3 requester (message/send, kind-tagged parts,
// lowercase states) is answered in v0.3 shape through a2av0.
func TestV03Peer(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, mode func(*ResponderOptions)) {
		exec := &scriptExec{fn: confirmLike}
		serveT(t, b, agentB, exec, mode)
		peer := newRawPeer(t, b)
		first := []byte(`{"jsonrpc":"2.0","id":7,"method":"message/send","params":{"message":{"kind":"message","messageId":"m-1","role":"user","parts":[{"kind":"text","text":"deploy"}]}}}`)
		peer.publish(agentB.RequestTopic(), first, []byte("v1"))
		r1 := peer.await(1, 5*time.Second)[0]
		var resp struct {
			ID     float64 `json:"id"`
			Result struct {
				Kind      string `json:"kind"`
				ID        string `json:"id"`
				ContextID string `json:"contextId"`
				Status    struct {
					State string `json:"state"`
				} `json:"status"`
			} `json:"result"`
			Error *RPCError `json:"error"`
		}
		if err := json.Unmarshal(r1.Payload, &resp); err != nil || resp.Error != nil {
			t.Fatalf("v0.3 reply: %v %s", err, r1.Payload)
		}
		if resp.ID != 7 || resp.Result.Kind != "task" || resp.Result.Status.State != "input-required" || resp.Result.ID == "" {
			t.Fatalf("v0.3 reply shape: %s", r1.Payload)
		}
		if b.Name() == "mochi" && t.Name() == "TestV03Peer/mochi/a2a-go-handler" {
			checkGolden(t, "v03_message_send_input_required.json", r1.Payload)
		}
		next, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 8, "method": "message/send", "params": map[string]any{"message": map[string]any{
			"kind": "message", "messageId": "m-2", "role": "user", "taskId": resp.Result.ID, "contextId": resp.Result.ContextID,
			"parts": []any{map[string]any{"kind": "text", "text": "go ahead"}}}}})
		peer.publish(agentB.RequestTopic(), next, []byte("v2"))
		r2 := peer.await(2, 5*time.Second)[1]
		if err := json.Unmarshal(r2.Payload, &resp); err != nil || resp.Error != nil || resp.Result.Status.State != "completed" {
			t.Fatalf("v0.3 continuation: %s", r2.Payload)
		}
	})
}

// confirmLike asks once (input-required) and completes on "go ahead".
func confirmLike(_ context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
	if ec.StoredTask == nil || ec.StoredTask.Status.State == a2a.TaskStateSubmitted {
		yield(a2a.NewSubmittedTask(ec, ec.Message), nil)
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateInputRequired, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("go ahead?"))), nil)
		return
	}
	if messageText(ec.Message) == "go ahead" {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("done"))), nil)
		return
	}
	yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateInputRequired, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("Please confirm."))), nil)
}
