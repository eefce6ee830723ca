package a2amqtttest

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// CoreStyleQuestion is what a CoreStyleAgent asks on a new task.
const CoreStyleQuestion = "which version?"

// StartCoreStyleAgent serves ref on raw MQTT (no a2a-go request handler) the way core A2A
// servers such as the A2A JS SDK's answer streaming requests: every stream opens with a Task
// snapshot; a new task then stops at input-required (CoreStyleQuestion); on a resume the opening
// snapshot still shows input-required, then "working" and "completed" ("deployed <answer>")
// follow. Requesters must not end a resumed stream at its opening Task (issue 12 item 6).
func StartCoreStyleAgent(t testing.TB, brokerURL string, ref a2amqtt.AgentRef) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: brokerURL, Agent: ref, Card: &a2a.AgentCard{
		Name: ref.Agent, Description: "core-A2A-style test agent", Version: "0.0.1",
		SupportedInterfaces: []*a2a.AgentInterface{a2amqtt.AgentInterface(brokerURL, ref)},
		Capabilities:        a2a.AgentCapabilities{Streaming: true},
		DefaultInputModes:   []string{"text/plain"}, DefaultOutputModes: []string{"text/plain"},
	}})
	if err != nil {
		t.Fatalf("core-style agent: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var mu sync.Mutex
	tasks := map[a2a.TaskID]*a2a.Task{}
	if _, err := conn.Subscribe(ctx, ref.RequestTopic(), func(p *paho.Publish) {
		var env struct {
			ID     any                    `json:"id"`
			Params a2a.SendMessageRequest `json:"params"`
		}
		if err := json.Unmarshal(p.Payload, &env); err != nil || env.Params.Message == nil {
			return
		}
		msg := env.Params.Message
		mu.Lock()
		task := tasks[msg.TaskID]
		if task == nil {
			task = &a2a.Task{ID: msg.TaskID, ContextID: msg.ContextID, Status: a2a.TaskStatus{State: a2a.TaskStateSubmitted}}
			tasks[msg.TaskID] = task
		}
		task.History = append(task.History, msg)
		opening := *task
		events := []a2a.Event{&opening}
		status := func(s a2a.TaskState, text string) {
			task.Status = a2a.TaskStatus{State: s, Message: a2a.NewMessageForTask(a2a.MessageRoleAgent, task, a2a.NewTextPart(text))}
			events = append(events, &a2a.TaskStatusUpdateEvent{TaskID: task.ID, ContextID: task.ContextID, Status: task.Status})
		}
		if task.Status.State == a2a.TaskStateInputRequired {
			answer := strings.TrimSpace(a2amqtt.TextOf(msg))
			status(a2a.TaskStateWorking, "deploying "+answer)
			status(a2a.TaskStateCompleted, "deployed "+answer)
		} else {
			status(a2a.TaskStateInputRequired, CoreStyleQuestion)
		}
		mu.Unlock()
		respTo, corr := p.Properties.ResponseTopic, p.Properties.CorrelationData
		go func() {
			pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for _, ev := range events {
				body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": env.ID, "result": a2a.StreamResponse{Event: ev}})
				_, _ = conn.Publish(pctx, &paho.Publish{Topic: respTo, QoS: 1, Payload: body, Properties: &paho.PublishProperties{CorrelationData: corr}})
			}
		}()
	}); err != nil {
		t.Fatalf("core-style agent: %v", err)
	}
}
