package a2amqtt_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TestV03WithoutTaskIDOnSampleAgents (issue 12 item 7): an A2A v0.3 caller that sends
// message/send without a taskId (v0.3 lets the server create it) gets a task from the sample
// confirm agent, whose executor starts with a status update, not a Task (a2a-go's default
// handler used to answer -32006 "first event must be a Task"), and resumes it with the id it
// was given; under both request handlers, on both brokers.
func TestV03WithoutTaskIDOnSampleAgents(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, direct bool) {
		startAgentMode(t, b, agents.KindConfirm, bRef, 0, direct)
		conn, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{BrokerURL: b.URL(), Agent: aRef, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(tctx(t, 5*time.Second)) })
		replyTopic := aRef.ReplyTopic("v03")
		replies := make(chan []byte, 10)
		if _, err := conn.Subscribe(tctx(t, 5*time.Second), replyTopic, func(p *paho.Publish) { replies <- p.Payload }); err != nil {
			t.Fatal(err)
		}
		type v03Result struct {
			Result struct {
				Kind      string `json:"kind"`
				ID        string `json:"id"`
				ContextID string `json:"contextId"`
				Status    struct {
					State   string `json:"state"`
					Message struct {
						Parts []struct {
							Text string `json:"text"`
						} `json:"parts"`
					} `json:"message"`
				} `json:"status"`
			} `json:"result"`
			Error *a2amqtt.RPCError `json:"error"`
		}
		call := func(id int, message string) v03Result {
			t.Helper()
			body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"message/send","params":{"message":%s}}`, id, message)
			if _, err := conn.Publish(tctx(t, 5*time.Second), &paho.Publish{Topic: bRef.RequestTopic(), QoS: 1, Payload: []byte(body),
				Properties: &paho.PublishProperties{ResponseTopic: replyTopic, CorrelationData: []byte(fmt.Sprint(id))}}); err != nil {
				t.Fatal(err)
			}
			select {
			case raw := <-replies:
				var r v03Result
				if err := json.Unmarshal(raw, &r); err != nil || r.Error != nil {
					t.Fatalf("v0.3 reply %d: %v %s", id, err, raw)
				}
				return r
			case <-time.After(10 * time.Second):
				t.Fatalf("no reply to v0.3 request %d", id)
			}
			return v03Result{}
		}
		first := call(1, `{"kind":"message","messageId":"m-1","role":"user","parts":[{"kind":"text","text":"rename the bucket"}]}`)
		if first.Result.Kind != "task" || first.Result.ID == "" || first.Result.Status.State != "input-required" ||
			len(first.Result.Status.Message.Parts) == 0 || first.Result.Status.Message.Parts[0].Text != agents.ConfirmPrompt("do rename the bucket") {
			t.Fatalf("v0.3 send without taskId: %+v", first.Result)
		}
		next := call(2, fmt.Sprintf(`{"kind":"message","messageId":"m-2","role":"user","taskId":%q,"contextId":%q,"parts":[{"kind":"text","text":"go ahead"}]}`,
			first.Result.ID, first.Result.ContextID))
		if next.Result.ID != first.Result.ID || next.Result.Status.State != "completed" {
			t.Fatalf("v0.3 resume: %+v", next.Result)
		}
	})
}
