package brokertest

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"
)

// ServeUserStory makes c an A2A agent that is not built on the project's SDK: plain paho and
// hand-written JSON-RPC in A2A v1.0 shapes, answering every message on topic (SendMessage and
// SendStreamingMessage alike) as the A2A-over-MQTT profile's user story 08 has Agent B do: a
// status update WORKING, an artifact ("echo: " and the message's text), then COMPLETED, each its
// own reply on the request's correlation, with no v0.3 "final" marker. A task's first message
// starting with "ask" stops at INPUT_REQUIRED ("when?") after WORKING instead; the next message of
// that task completes it. It answers until c closes.
func ServeUserStory(t testing.TB, c *Client, topic string) {
	t.Helper()
	if rc := c.Subscribe(topic); rc >= 0x80 {
		t.Fatalf("brokertest: user-story agent: subscribe %s: %#x", topic, rc)
	}
	var mu sync.Mutex
	asked := map[string]bool{}
	go func() {
		for p := range c.Messages() {
			if p.Properties == nil || p.Properties.ResponseTopic == "" {
				continue
			}
			mu.Lock()
			events, id := storyEvents(p.Payload, asked)
			mu.Unlock()
			for _, ev := range events {
				body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "result": ev})
				if _, err := c.PublishWith(&paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: body,
					Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData, ContentType: "application/json"}}); err != nil {
					t.Logf("brokertest: user-story agent: publish: %v", err)
				}
			}
		}
	}()
}

// storyEvents are the replies to one request (none for what is not a message).
func storyEvents(payload []byte, asked map[string]bool) ([]map[string]any, any) {
	var req struct {
		ID     any `json:"id"`
		Params struct {
			Message *struct {
				TaskID    string `json:"taskId"`
				ContextID string `json:"contextId"`
				Parts     []struct {
					Text string `json:"text"`
				} `json:"parts"`
			} `json:"message"`
		} `json:"params"`
	}
	if json.Unmarshal(payload, &req) != nil || req.Params.Message == nil {
		return nil, nil
	}
	m := req.Params.Message
	text := ""
	if len(m.Parts) > 0 {
		text = m.Parts[0].Text
	}
	asks := strings.HasPrefix(text, "ask") && !asked[m.TaskID]
	if asks {
		asked[m.TaskID] = true
		return UserStoryEvents(m.TaskID, m.ContextID, "when?", true), req.ID
	}
	return UserStoryEvents(m.TaskID, m.ContextID, "echo: "+text, false), req.ID
}

// UserStoryEvents are the JSON-RPC results, in order, with which an agent of user story 08
// answers a message of task taskID: a status update WORKING, then an artifact holding text and
// COMPLETED with text as its status message, or, when it asks, INPUT_REQUIRED with the question
// text. A2A v1.0 shapes, no v0.3 "final" marker.
func UserStoryEvents(taskID, contextID, text string, asks bool) []map[string]any {
	with := func(kv map[string]any) map[string]any {
		kv["taskId"], kv["contextId"] = taskID, contextID
		return kv
	}
	status := func(state, text string) map[string]any {
		st := map[string]any{"state": state}
		if text != "" {
			st["message"] = map[string]any{"messageId": uuid.NewString(), "role": "ROLE_AGENT", "taskId": taskID, "contextId": contextID,
				"parts": []any{map[string]any{"text": text}}}
		}
		return map[string]any{"statusUpdate": with(map[string]any{"status": st})}
	}
	events := []map[string]any{status("TASK_STATE_WORKING", "")}
	if asks {
		return append(events, status("TASK_STATE_INPUT_REQUIRED", text))
	}
	return append(events,
		map[string]any{"artifactUpdate": with(map[string]any{"artifact": map[string]any{"artifactId": "answer-" + taskID,
			"parts": []any{map[string]any{"text": text}}}})},
		status("TASK_STATE_COMPLETED", text))
}
