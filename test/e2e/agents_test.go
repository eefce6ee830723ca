package e2e

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// rawAgent is an A2A-over-MQTT responder written against plain paho with
// hand-rolled JSON-RPC: proof that a gated agent needs no code from this
// project, only the identity and delivery topic the operator gives it. It
// echoes; "slow ..." takes 300ms; "ask ..." stops at input-required and the
// next message of that task completes it.
type rawAgent struct {
	c      *paho.Client
	mu     sync.Mutex
	tasks  map[string]rawTask
	topic  string
	closed chan struct{}
	// seen are the requests as the agent received them.
	seen []*paho.Publish
	// tracer, when set, makes the agent continue the request's trace (as an
	// instrumented agent would) and propagate it in its replies.
	tracer trace.Tracer
	// held receives one value per request whose text starts with "hold":
	// the agent replies to it only once the test sends on it (at most 30 s).
	held chan struct{}
	// story makes the agent answer SendMessage as the A2A-over-MQTT profile's user story 08
	// has it: a stream of events (storyReplies), as it answers SendStreamingMessage.
	story bool
	// sent are the replies the agent published, by task (replayOf).
	sent map[string][]*paho.Publish
}

// rawAgentOption sets a rawAgent up before it subscribes.
type rawAgentOption func(*rawAgent)

// answersWithAStream makes the agent answer SendMessage with a stream of events (user story 08).
func answersWithAStream(a *rawAgent) { a.story = true }

type rawTask struct {
	contextID, state string
}

func startRawAgent(t testing.TB, ctx context.Context, addr, username, password string, id a2amqtt.AgentRef, topic string, opts ...rawAgentOption) *rawAgent {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("raw agent dial: %v", err)
	}
	a := &rawAgent{tasks: map[string]rawTask{}, topic: topic, closed: make(chan struct{}), held: make(chan struct{}), sent: map[string][]*paho.Publish{}}
	for _, o := range opts {
		o(a)
	}
	a.c = paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			go a.serve(pr.Packet)
			return true, nil
		}},
	})
	ack, err := a.c.Connect(ctx, &paho.Connect{ClientID: id.ClientID(), CleanStart: true, KeepAlive: 30,
		Username: username, UsernameFlag: true, Password: []byte(password), PasswordFlag: true})
	if err != nil || ack.ReasonCode != 0 {
		t.Fatalf("raw agent connect: %v %v", err, ack)
	}
	sa, err := a.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}})
	if err != nil || sa.Reasons[0] >= 0x80 {
		t.Fatalf("raw agent subscribe %s: %v %v", topic, err, sa)
	}
	t.Cleanup(func() { _ = a.c.Disconnect(&paho.Disconnect{}) })
	return a
}

func (a *rawAgent) reply(p *paho.Publish, body map[string]any) {
	a.replyFor(p, "", body)
}

// replyFor replies to p and records the reply under task (replayOf).
func (a *rawAgent) replyFor(p *paho.Publish, task string, body map[string]any) {
	b, _ := json.Marshal(body)
	props := &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData, ContentType: "application/json"}
	a.mu.Lock()
	tracer := a.tracer
	if task != "" {
		a.sent[task] = append(a.sent[task], &paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: b, Properties: props})
	}
	a.mu.Unlock()
	ctx := context.Background()
	if tracer != nil {
		var sp trace.Span
		ctx, sp = tracer.Start(a2amqtt.ExtractTraceContext(ctx, p), "agent.handle", trace.WithSpanKind(trace.SpanKindServer))
		defer sp.End()
		out := &paho.Publish{Properties: props}
		a2amqtt.InjectTraceContext(ctx, out)
	}
	_, _ = a.c.Publish(ctx, &paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: b, Properties: props})
}

func (a *rawAgent) received() []*paho.Publish {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*paho.Publish(nil), a.seen...)
}

func (a *rawAgent) serve(p *paho.Publish) {
	var req struct {
		ID     any    `json:"id"`
		Method string `json:"method"`
		Params struct {
			ID      string `json:"id"`
			Message struct {
				TaskID    string `json:"taskId"`
				ContextID string `json:"contextId"`
				Parts     []struct {
					Text string `json:"text"`
				} `json:"parts"`
			} `json:"message"`
		} `json:"params"`
	}
	if p.Properties == nil || p.Properties.ResponseTopic == "" {
		return
	}
	a.mu.Lock()
	a.seen = append(a.seen, p)
	a.mu.Unlock()
	if err := json.Unmarshal(p.Payload, &req); err != nil {
		a.reply(p, map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": -32700, "message": err.Error()}})
		return
	}
	task := func(id, ctxID, state, text string) map[string]any {
		return map[string]any{"id": id, "contextId": ctxID, "status": map[string]any{"state": state,
			"message": map[string]any{"messageId": uuid.NewString(), "role": "ROLE_AGENT", "parts": []any{map[string]any{"text": text}}}}}
	}
	switch req.Method {
	case "SendMessage", "SendStreamingMessage":
		m := req.Params.Message
		text := ""
		if len(m.Parts) > 0 {
			text = m.Parts[0].Text
		}
		a.mu.Lock()
		prev, known := a.tasks[m.TaskID]
		if known && prev.contextID != m.ContextID {
			a.mu.Unlock()
			a.reply(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": -32602, "message": "context mismatch"}})
			return
		}
		state := "TASK_STATE_COMPLETED"
		answer := "echo: " + text
		if strings.HasPrefix(text, "ask") && !known {
			state, answer = "TASK_STATE_INPUT_REQUIRED", "what else?"
		}
		a.tasks[m.TaskID] = rawTask{contextID: m.ContextID, state: state}
		a.mu.Unlock()
		if strings.HasPrefix(text, "slow") {
			time.Sleep(300 * time.Millisecond)
		}
		if strings.HasPrefix(text, "hold") {
			select {
			case <-a.held:
			case <-time.After(30 * time.Second):
			}
		}
		if a.story {
			a.storyReplies(p, req.ID, m.TaskID, m.ContextID, state, answer)
			return
		}
		if req.Method == "SendMessage" {
			a.reply(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"task": task(m.TaskID, m.ContextID, state, answer)}})
			return
		}
		a.reply(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"statusUpdate": map[string]any{
			"taskId": m.TaskID, "contextId": m.ContextID, "status": map[string]any{"state": "TASK_STATE_WORKING"}}}})
		a.reply(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"statusUpdate": map[string]any{
			"taskId": m.TaskID, "contextId": m.ContextID, "final": true,
			"status": task(m.TaskID, m.ContextID, state, answer)["status"]}}})
	case "GetTask", "CancelTask":
		a.mu.Lock()
		tk, ok := a.tasks[req.Params.ID]
		if ok && req.Method == "CancelTask" && tk.state != "TASK_STATE_COMPLETED" {
			tk.state = "TASK_STATE_CANCELED"
			a.tasks[req.Params.ID] = tk
		}
		a.mu.Unlock()
		if !ok {
			a.reply(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": -32001, "message": "task not found"}})
			return
		}
		a.reply(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": task(req.Params.ID, tk.contextID, tk.state, "")})
	default:
		a.reply(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": -32601, "message": "method not found"}})
	}
}

// storyReplies answers a message, SendMessage or SendStreamingMessage alike, as user story 08
// has the agent do (brokertest.UserStoryEvents): WORKING, then an artifact and COMPLETED, or
// INPUT_REQUIRED with its question, each its own reply on the request's correlation; the state
// alone says which event ends the stream.
func (a *rawAgent) storyReplies(p *paho.Publish, id any, taskID, contextID, state, answer string) {
	for _, ev := range brokertest.UserStoryEvents(taskID, contextID, answer, state == "TASK_STATE_INPUT_REQUIRED") {
		a.replyFor(p, taskID, map[string]any{"jsonrpc": "2.0", "id": id, "result": ev})
	}
}

// replayOf publishes again every reply the agent sent for task, as a gated agent replaying its
// own replies (sealed routes and all) would.
func (a *rawAgent) replayOf(task string) int {
	a.mu.Lock()
	sent := append([]*paho.Publish(nil), a.sent[task]...)
	a.mu.Unlock()
	for _, p := range sent {
		_, _ = a.c.Publish(context.Background(), p)
	}
	return len(sent)
}

// startSDKAgent runs an examples/agents executor with the SDK Responder, connected as the agent
// with its operator-issued credentials and reading the delivery topic the operator assigned
// (ResponderOptions.RequestTopic, A2A_REQUEST_TOPIC in a workload): nothing else in the agent
// knows that the conversation service stands in front of it.
func startSDKAgent(t testing.TB, ctx context.Context, st *stack, kind agents.Kind, name string, delay time.Duration) *a2amqtt.Conn {
	t.Helper()
	id := ref(name)
	a, err := agents.Start(ctx, kind, agents.Options{
		BrokerURL: st.brokerURL, Username: st.usernames[name], Password: st.passwords[name],
		Agent: id, RequestTopic: identity.DeliveryTopic(id), Delay: delay, Direct: true,
	})
	if err != nil {
		t.Fatalf("start %s agent: %v", kind, err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	return a.Conn
}
