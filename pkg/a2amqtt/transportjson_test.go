package a2amqtt

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// SendMessageJSON hands a reply of one Task on as the agent encoded it (a plain-paho agent's
// member a2a-go does not know is still there), folds a reply of several events as SendMessage
// does (plain-paho user story), returns an SDK agent's task, and returns an agent's error as the
// error.
func TestSendMessageJSON(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		ctx := ctxT(t, 20*time.Second)
		r := requesterT(t, b, agentA, nil)

		// A plain-paho agent answering with one Task carrying an extension member, or an error.
		raw := brokertest.MustDial(t, b.Addr(), brokertest.Options{ClientID: agentB.ClientID()})
		if rc := raw.Subscribe(agentB.RequestTopic()); rc >= 0x80 {
			t.Fatalf("subscribe: %#x", rc)
		}
		task := `{"task":{"id":"t-1","contextId":"c-1","status":{"state":"TASK_STATE_COMPLETED"},"xVendorNote":"kept"}}`
		go func() {
			for p := range raw.Messages() {
				var req struct {
					ID     any `json:"id"`
					Params struct {
						Message struct {
							Parts []struct {
								Text string `json:"text"`
							} `json:"parts"`
						} `json:"message"`
					} `json:"params"`
				}
				_ = json.Unmarshal(p.Payload, &req)
				body := []byte(`{"jsonrpc":"2.0","id":` + idJSON(req.ID) + `,"result":` + task + `}`)
				if len(req.Params.Message.Parts) > 0 && req.Params.Message.Parts[0].Text == "fail" {
					body = []byte(`{"jsonrpc":"2.0","id":` + idJSON(req.ID) + `,"error":{"code":-32001,"message":"no such task"}}`)
				}
				_, _ = raw.PublishWith(&paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: body,
					Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData}})
			}
		}()
		got, err := r.Transport(agentB).SendMessageJSON(ctx, nil, userText("hello"))
		if err != nil || !bytes.Equal(got, []byte(task)) {
			t.Fatalf("one Task: %s (%v), want the agent's bytes %s", got, err, task)
		}
		var rpcErr *RPCError
		if _, err := r.Transport(agentB).SendMessageJSON(ctx, nil, userText("fail")); !errors.As(err, &rpcErr) || rpcErr.Code != -32001 {
			t.Fatalf("an agent's error: %v", err)
		}

		// A plain-paho agent streaming events for the unary method: folded.
		story := AgentRef{Org: agentB.Org, Unit: agentB.Unit, Agent: "story"}
		brokertest.ServeUserStory(t, brokertest.MustDial(t, b.Addr(), brokertest.Options{ClientID: story.ClientID()}), story.RequestTopic())
		got, err = r.Transport(story).SendMessageJSON(ctx, nil, userText("hello"))
		if err != nil {
			t.Fatal(err)
		}
		ev, err := decodeEvent(got)
		folded, ok := ev.(*a2a.Task)
		if err != nil || !ok || folded.Status.State != a2a.TaskStateCompleted || ResultText(folded) != "echo: hello" {
			t.Fatalf("folded stream: %s (%v)", got, err)
		}

		// An SDK agent.
		sdk := AgentRef{Org: agentB.Org, Unit: agentB.Unit, Agent: "sdk"}
		serveT(t, b, sdk, echoExec(), nil)
		got, err = r.Transport(sdk).SendMessageJSON(ctx, nil, userText("hi"))
		if err != nil {
			t.Fatal(err)
		}
		ev, err = decodeEvent(got)
		if res, ok := ev.(*a2a.Task); err != nil || !ok || ResultText(res) != "echo: hi" {
			t.Fatalf("SDK agent: %s (%v)", got, err)
		}
	})
}

func idJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestIsSingleResult(t *testing.T) {
	for in, want := range map[string]bool{
		`{"task":{"id":"t"}}`:                      true,
		` {"message" : {"parts":[{"text":"}"}]}} `: true,
		`{"task":{"id":"t","x":{"task":1}}}`:       true,
		`{"statusUpdate":{"taskId":"t"}}`:          false,
		`{"task":{"id":"t"},"message":{}}`:         false,
		`{"Task":{"id":"t"}}`:                      false,
		`{"task":"t"}`:                             false,
		`{"task":null}`:                            false,
		`{"ta\"sk":{}}`:                            false,
		`{"kind":"task","id":"t"}`:                 false,
		`[{"task":{}}]`:                            false,
		`{}`:                                       false,
		`{"task":{"s":"a \" quote, \"message\""}}`: true,
	} {
		if got := isSingleResult(json.RawMessage(in)); got != want {
			t.Errorf("isSingleResult(%s) = %v, want %v", in, got, want)
		}
	}
}

func TestRawReplyItem(t *testing.T) {
	for in, want := range map[string]*ReplyItem{
		`{"statusUpdate":{"taskId":"t","status":{"state":"TASK_STATE_WORKING"}}}`:         {Kind: ReplyStatusUpdate, State: a2a.TaskStateWorking},
		`{"statusUpdate":{"status":{"state":"TASK_STATE_COMPLETED"},"final":true}}`:       {Kind: ReplyStatusUpdate, State: a2a.TaskStateCompleted},
		`{"task":{"id":"t","status":{"state":"TASK_STATE_INPUT_REQUIRED"},"history":[]}}`: {Kind: ReplyTask, State: a2a.TaskStateInputRequired},
		`{"artifactUpdate":{"taskId":"t","artifact":{"parts":[{"text":"}"}]}}}`:           {Kind: ReplyArtifactUpdate},
		`{"message":{"parts":[]}}`:              {Kind: ReplyMessage},
		`{"statusUpdate":{},"task":{}}`:         nil,
		`{"kind":"status-update","taskId":"t"}`: nil,
		`{"artifactUpdate":[]}`:                 nil,
	} {
		got, ok := rawReplyItem(json.RawMessage(in), true)
		if want == nil {
			if ok {
				t.Errorf("rawReplyItem(%s) = %+v, want none", in, got)
			}
			continue
		}
		want.First = true
		if !ok || got != *want {
			t.Errorf("rawReplyItem(%s) = %+v %v, want %+v", in, got, ok, *want)
		}
	}
}
