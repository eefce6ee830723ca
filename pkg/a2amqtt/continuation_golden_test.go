package a2amqtt

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// TestGoldenContinuation pins the wire shapes of issue 12 (docs/protocol.md): the
// input-required status update with a continuation hint, the approval answer, a request that
// supplies history (client_supplied), the -32063 continuation_mismatch error and the agent card
// entry of the extension. The first three are captured from a real exchange over the broker.
func TestGoldenContinuation(t *testing.T) {
	b := brokertest.StartMochi(t)
	exec := &scriptExec{fn: func(_ context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
		if approved, reason, ok := ApprovalOf(ec.Message); ok {
			text := "done"
			state := a2a.TaskStateCompleted
			if !approved {
				text, state = "not done: "+reason, a2a.TaskStateCanceled
			}
			yield(a2a.NewStatusUpdateEvent(ec, state, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart(text))), nil)
			return
		}
		if ec.StoredTask != nil && ec.StoredTask.Status.State == a2a.TaskStateSubmitted && messageText(ec.Message) == "rename the bucket" {
			yield(InputRequired(ec, a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart("Rename the bucket?")),
				Continuation{ExpectedInput: ExpectApproval, ResumeScope: ResumeSameTask, HistoryPolicy: HistoryNone}), nil)
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("ok"))), nil)
	}}
	serveT(t, b, agentB, exec, nil)
	sniff := newSniffer(t, b, agentB.RequestTopic())
	req := requesterT(t, b, agentA, nil)
	var replies [][]byte
	req.dropReply = func(p *paho.Publish) bool {
		replies = append(replies, bytes.Clone(p.Payload))
		return false
	}
	conv := NewConversation(req.Transport(agentB))
	ctx := ctxT(t, 15*time.Second)
	for _, err := range conv.Stream(ctx, a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("rename the bucket"))) {
		if err != nil {
			t.Fatal(err)
		}
	}
	checkGolden(t, "stream_input_required_continuation.json", replies...)
	p, ok := conv.Pending()
	if !ok || p.Continuation == nil || p.Continuation.ExpectedInput != ExpectApproval {
		t.Fatalf("pending: %+v", p)
	}
	if _, err := conv.SendMessage(ctx, ApprovalMessage(true, "looks right")); err != nil {
		t.Fatal(err)
	}
	conv.SetSupplyHistory(true)
	if _, err := conv.Send(ctx, "and now?"); err != nil {
		t.Fatal(err)
	}
	reqs := sniff.wait(3, 5*time.Second)
	checkGolden(t, "send_message_request_approval.json", reqs[1].Payload)
	checkGolden(t, "send_message_request_supplied_history.json", reqs[2].Payload)

	mismatch := NewContinuationMismatch(Continuation{ExpectedInput: ExpectApproval, ResumeScope: ResumeSameTask, HistoryPolicy: HistoryAgentFetched,
		AcceptedHistoryDigest: "sha256:b94753e3f8bf6f04ec05775d90de7ab421b8ad7bbab52fbe7750c9bef95869ae"},
		"0b8f5c3a-6d2e-4f7b-8a91-3c5d7e9f1a2b", "6f1c2c7e-2b1a-4d55-9a38-0c6f0d1e9b21",
		`task 0b8f5c3a-6d2e-4f7b-8a91-3c5d7e9f1a2b waits for an approval (expected_input approval); answer with a data part {"decision": "approve"|"deny"}`)
	checkGolden(t, "error_continuation_mismatch.json", encodeError("req-7", mismatch))

	card, err := json.Marshal(DeclareContinuation(testCard(agentB)))
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "agent_card_continuation.json", card)
}
