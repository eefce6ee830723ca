package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// TestStreamRelayed: an HTTP caller's SendStreamingMessage gets, over SSE, every event of a
// plain-paho agent in order, as the agent encoded it (a member a2a-go does not know is kept),
// each with the caller's own JSON-RPC id and an event id, in a burst (the agent publishes them
// back to back); an event the agent indented arrives on one data line; an agent's error after
// its first events ends the stream with the error's code, message and data; an error before any
// event is the stream's only event.
func TestStreamRelayed(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind, startHTTPAgent(t))
		agent := st.plainPahoAgent(t, "direct")
		go serveStreams(agent)
		gw, _ := st.gateway(t, ctx)
		endpoint := fmt.Sprintf("%s/agents/%s/%s/direct/", gw, org, unit)
		token := st.token(t, ctx, "caller")

		events := streamRaw(t, ctx, endpoint, token, "call-9", "burst")
		if len(events) != 7 {
			t.Fatalf("burst: %d events, want 7: %+v", len(events), events)
		}
		for i, ev := range events {
			if ev.id == "" || ev.resp.ID != "call-9" || ev.resp.Error != nil {
				t.Fatalf("event %d: %+v", i, ev)
			}
			if i >= 1 && i <= 5 && !bytes.Contains(ev.resp.Result, []byte(fmt.Sprintf(`"text":"chunk %d"`, i-1))) {
				t.Fatalf("event %d out of order: %s", i, ev.resp.Result)
			}
		}
		if !bytes.Contains(events[1].resp.Result, []byte(`"xVendorNote":"kept"`)) || !bytes.Contains(events[6].resp.Result, []byte("TASK_STATE_COMPLETED")) {
			t.Fatalf("events not as the agent sent them: %s … %s", events[1].resp.Result, events[6].resp.Result)
		}

		events = streamRaw(t, ctx, endpoint, token, "call-12", "indented")
		if len(events) != 1 || events[0].resp.Error != nil || !bytes.Contains(events[0].resp.Result, []byte("TASK_STATE_COMPLETED")) {
			t.Fatalf("an indented event: %+v", events)
		}

		events = streamRaw(t, ctx, endpoint, token, "call-10", "fail after two")
		last := events[len(events)-1]
		if len(events) != 3 || last.resp.Error == nil || last.resp.Error.Code != -32001 || last.resp.Error.Message != "gave up" || !bytes.Contains(last.resp.Error.Data, []byte("try later")) {
			t.Fatalf("an error after two events: %+v", events)
		}
		if events[0].resp.Error != nil || events[1].resp.Error != nil {
			t.Fatalf("the events before the error: %+v", events)
		}

		events = streamRaw(t, ctx, endpoint, token, "call-11", "fail")
		if len(events) != 1 || events[0].resp.Error == nil || events[0].resp.Error.Code != -32001 || events[0].resp.ID != "call-11" {
			t.Fatalf("an error before any event: %+v", events)
		}
	})
}

// serveStreams answers each request on agent: "burst" with a working status, five artifact
// updates and a completed status, published back to back; "fail after two" with two events and
// an error; "fail" with an error.
func serveStreams(agent *brokertest.Client) {
	for p := range agent.Messages() {
		var req struct {
			ID     any `json:"id"`
			Params struct {
				Message struct {
					TaskID    string `json:"taskId"`
					ContextID string `json:"contextId"`
					Parts     []struct {
						Text string `json:"text"`
					} `json:"parts"`
				} `json:"message"`
			} `json:"params"`
		}
		_ = json.Unmarshal(p.Payload, &req)
		id, _ := json.Marshal(req.ID)
		m := req.Params.Message
		text := ""
		if len(m.Parts) > 0 {
			text = m.Parts[0].Text
		}
		result := func(r string) string { return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":%s}`, id, r) }
		status := func(state string) string {
			return result(fmt.Sprintf(`{"statusUpdate":{"taskId":%q,"contextId":%q,"status":{"state":%q}}}`, m.TaskID, m.ContextID, state))
		}
		artifact := func(i int) string {
			return result(fmt.Sprintf(`{"artifactUpdate":{"taskId":%q,"contextId":%q,"xVendorNote":"kept","artifact":{"artifactId":"a%d","parts":[{"text":"chunk %d"}]}}}`, m.TaskID, m.ContextID, i, i))
		}
		failure := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32001,"message":"gave up","data":{"hint":"try later"}}}`, id)
		var replies []string
		switch text {
		case "burst":
			replies = append(replies, status("TASK_STATE_WORKING"))
			for i := range 5 {
				replies = append(replies, artifact(i))
			}
			replies = append(replies, status("TASK_STATE_COMPLETED"))
		case "indented":
			// An agent whose encoder indents its JSON: the relay keeps each event on one data line.
			replies = []string{result("{\n  \"statusUpdate\": {\n    \"taskId\": \"" + m.TaskID + "\",\n    \"contextId\": \"" + m.ContextID + "\",\n    \"status\": {\"state\": \"TASK_STATE_COMPLETED\"}\n  }\n}")}
		case "fail after two":
			replies = []string{status("TASK_STATE_WORKING"), artifact(0), failure}
		default:
			replies = []string{failure}
		}
		for _, body := range replies {
			_, _ = agent.PublishWith(&paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: []byte(body),
				Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData}})
		}
	}
}

// sseEvent is one event of an SSE response: its id and its data, a JSON-RPC response.
type sseEvent struct {
	id   string
	resp struct {
		JSONRPC string `json:"jsonrpc"`
		ID      any    `json:"id"`
		rpcResponse
	}
}

// streamRaw posts a SendStreamingMessage with JSON-RPC id rpcID and reads the SSE response to
// its end.
func streamRaw(t *testing.T, ctx context.Context, endpoint, token, rpcID, text string) []sseEvent {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": rpcID, "method": "SendStreamingMessage", "params": userMsg("", "", text)})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", endpoint, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("POST %s: %d %s", endpoint, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var events []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			cur.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.resp); err != nil {
				t.Fatalf("event %q: %v", line, err)
			}
		case line == "" && cur.resp.JSONRPC != "":
			events = append(events, cur)
			cur = sseEvent{}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read the stream: %v", err)
	}
	return events
}

// TestStreamLoneEventFlushed: an event with nothing queued behind it reaches the HTTP caller at
// once, not with the stream's next write: the agent publishes its first event, then holds the
// rest of the stream until the caller has read that event over SSE (or until it gives up, which
// fails the test).
func TestStreamLoneEventFlushed(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind, startHTTPAgent(t))
		agent := st.plainPahoAgent(t, "direct")
		release := make(chan struct{})
		gaveUp := make(chan bool, 1)
		go func() {
			p := <-agent.Messages()
			var req struct {
				ID     json.RawMessage `json:"id"`
				Params struct {
					Message struct {
						TaskID    string `json:"taskId"`
						ContextID string `json:"contextId"`
					} `json:"message"`
				} `json:"params"`
			}
			_ = json.Unmarshal(p.Payload, &req)
			m := req.Params.Message
			publish := func(state string) {
				body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"statusUpdate":{"taskId":%q,"contextId":%q,"status":{"state":%q}}}}`, req.ID, m.TaskID, m.ContextID, state)
				_, _ = agent.PublishWith(&paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: []byte(body),
					Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData}})
			}
			publish("TASK_STATE_WORKING")
			select {
			case <-release:
				gaveUp <- false
			case <-time.After(20 * time.Second):
				gaveUp <- true
			}
			publish("TASK_STATE_COMPLETED")
		}()
		gw, _ := st.gateway(t, ctx)
		endpoint := fmt.Sprintf("%s/agents/%s/%s/direct/", gw, org, unit)
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "SendStreamingMessage", "params": userMsg("", "", "one")})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+st.token(t, ctx, "caller"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var states []string
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var ev struct {
				Result struct {
					StatusUpdate struct {
						Status struct {
							State string `json:"state"`
						} `json:"status"`
					} `json:"statusUpdate"`
				} `json:"result"`
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatalf("event %q: %v", data, err)
			}
			states = append(states, ev.Result.StatusUpdate.Status.State)
			if len(states) == 1 {
				close(release) // the first event arrived while the agent holds the rest
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		if <-gaveUp {
			t.Fatalf("the first event reached the caller only after the stream went on (%v): a lone event was held back", states)
		}
		if len(states) != 2 || states[0] != "TASK_STATE_WORKING" || states[1] != "TASK_STATE_COMPLETED" {
			t.Fatalf("events %v, want working then completed", states)
		}
	})
}
