package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// coreAgent answers the way a core A2A server does (the A2A JS SDK's
// DefaultRequestHandler, issue 12.5), on plain paho: a message without
// taskId starts a task whose id the agent creates; a message naming a task
// id it did not create is -32001 TaskNotFound; every stream opens with the
// Task as it stands (on a resume still input-required). A new task stops at
// input-required ("which version?"); the answer completes it with an
// artifact.
type coreAgent struct {
	rc    *rawClient
	mu    sync.Mutex
	tasks map[string]*coreTask
	seen  []coreRequest
}

type coreTask struct {
	id, contextID, state string
	history              []map[string]any
}

type coreRequest struct {
	method, taskID, contextID, paramsID string
}

func startCoreAgent(t testing.TB, ctx context.Context, st *stack, name string) *coreAgent {
	t.Helper()
	a := &coreAgent{rc: startRawClient(t, ctx, st, name), tasks: map[string]*coreTask{}}
	a.rc.serve(t, ctx, identity.DeliveryTopic(ref(name)), a.handle)
	return a
}

func (a *coreAgent) requests() []coreRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]coreRequest(nil), a.seen...)
}

func (a *coreAgent) snapshot(t *coreTask) map[string]any {
	return map[string]any{"id": t.id, "contextId": t.contextID, "status": map[string]any{"state": t.state},
		"history": append([]map[string]any(nil), t.history...)}
}

func (a *coreAgent) handle(p *paho.Publish) {
	var req struct {
		ID     any    `json:"id"`
		Method string `json:"method"`
		Params struct {
			ID      string         `json:"id"`
			Message map[string]any `json:"message"`
		} `json:"params"`
	}
	if err := json.Unmarshal(p.Payload, &req); err != nil {
		return
	}
	str := func(k string) string { s, _ := req.Params.Message[k].(string); return s }
	fail := func(code int, msg string) {
		a.rc.answer(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": code, "message": msg}})
	}
	a.mu.Lock()
	a.seen = append(a.seen, coreRequest{method: req.Method, taskID: str("taskId"), contextID: str("contextId"), paramsID: req.Params.ID})
	a.mu.Unlock()
	switch req.Method {
	case "GetTask", "CancelTask":
		a.mu.Lock()
		tk := a.tasks[req.Params.ID]
		if tk != nil && req.Method == "CancelTask" {
			tk.state = "TASK_STATE_CANCELED"
		}
		var snap map[string]any
		if tk != nil {
			snap = a.snapshot(tk)
		}
		a.mu.Unlock()
		if tk == nil {
			fail(-32001, "Task not found: "+req.Params.ID)
			return
		}
		a.rc.answer(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": snap})
		return
	case "SendMessage", "SendStreamingMessage":
	default:
		fail(-32601, "method not found")
		return
	}
	a.mu.Lock()
	var tk *coreTask
	if id := str("taskId"); id != "" {
		if tk = a.tasks[id]; tk == nil {
			a.mu.Unlock()
			fail(-32001, "Task not found: "+id)
			return
		}
	} else {
		ctxID := str("contextId")
		if ctxID == "" {
			ctxID = uuid.NewString()
		}
		tk = &coreTask{id: uuid.NewString(), contextID: ctxID, state: "TASK_STATE_SUBMITTED"}
		a.tasks[tk.id] = tk
	}
	msg := req.Params.Message
	msg["taskId"], msg["contextId"] = tk.id, tk.contextID
	tk.history = append(tk.history, msg)
	events := []map[string]any{{"task": a.snapshot(tk)}}
	status := func(state, text string) {
		tk.state = state
		m := map[string]any{"messageId": uuid.NewString(), "role": "ROLE_AGENT", "taskId": tk.id, "contextId": tk.contextID,
			"parts": []any{map[string]any{"text": text}}}
		tk.history = append(tk.history, m)
		events = append(events, map[string]any{"statusUpdate": map[string]any{"taskId": tk.id, "contextId": tk.contextID,
			"status": map[string]any{"state": state, "message": m}}})
	}
	if tk.state == "TASK_STATE_INPUT_REQUIRED" {
		status("TASK_STATE_WORKING", "deploying")
		events = append(events, map[string]any{"artifactUpdate": map[string]any{"taskId": tk.id, "contextId": tk.contextID,
			"artifact": map[string]any{"artifactId": "deploy-log", "parts": []any{map[string]any{"text": "deployed"}}}}})
		status("TASK_STATE_COMPLETED", "deployed")
	} else {
		status("TASK_STATE_INPUT_REQUIRED", "which version?")
	}
	final := a.snapshot(tk)
	a.mu.Unlock()
	if req.Method == "SendMessage" {
		a.rc.answer(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"task": final}})
		return
	}
	for _, ev := range events {
		a.rc.answer(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": ev})
	}
}

// TestAgentCreatedTaskIDs: a governed agent that creates its own task ids
// (core A2A, the A2A JS SDK's server) works through the service with
// requesters that create them (the profile), on both brokers: the service
// learns it from the agent's first answer, presents new tasks without a
// taskId, relays every event in the requester's ids, and names the agent's
// ids in resumes, GetTask and CancelTask. A profile agent beside it keeps
// getting the requester's ids.
func TestAgentCreatedTaskIDs(t *testing.T) {
	onBothBrokers(t, agentCreatedTaskIDs)
}

func agentCreatedTaskIDs(t *testing.T, kind string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := newStack(t, ctx, kind)
	st.startService(t, ctx, &clock{}, "ids")
	agent := startCoreAgent(t, ctx, st, "guarded")
	profile := startRawAgent(t, ctx, st.addr, st.usernames["raw"], st.passwords["raw"], ref("raw"), identity.DeliveryTopic(ref("raw")))
	client := startRawClient(t, ctx, st, "client")
	topic := ref("guarded").RequestTopic()
	agentIDs := func() map[string]bool {
		agent.mu.Lock()
		defer agent.mu.Unlock()
		ids := map[string]bool{}
		for id := range agent.tasks {
			ids[id] = true
		}
		return ids
	}
	// noAgentIDs checks that no relayed payload names an id the agent made.
	noAgentIDs := func(t *testing.T, replies []*paho.Publish) {
		t.Helper()
		for id := range agentIDs() {
			for _, p := range replies {
				if bytes.Contains(p.Payload, []byte(id)) {
					t.Fatalf("relayed reply names the agent's task id %s: %s", id, p.Payload)
				}
			}
		}
	}
	stream := func(msg map[string]any, want int) []*paho.Publish {
		t.Helper()
		return client.call(t, ctx, topic, "SendStreamingMessage", map[string]any{"message": msg}, want)
	}
	c, task := uuid.NewString(), uuid.NewString()

	t.Run("a new task is presented without the requester's id after the agent's TaskNotFound", func(t *testing.T) {
		got := stream(userMessage(task, c, "deploy"), 2)
		if len(got) != 2 {
			t.Fatalf("%d replies", len(got))
		}
		for _, p := range got {
			if w := resultTask(t, p); w.ID+w.TaskID != task || w.ContextID != c {
				t.Fatalf("relayed in other ids: %s", p.Payload)
			}
		}
		if w := resultTask(t, got[1]); w.Status.State != "TASK_STATE_INPUT_REQUIRED" {
			t.Fatalf("pause: %s", got[1].Payload)
		}
		noAgentIDs(t, got)
		seen := agent.requests()
		if len(seen) != 2 || seen[0].taskID != task || seen[1].taskID != "" || seen[1].contextID != c {
			t.Fatalf("the agent saw %+v: want the requester's id (refused), then the task without an id in context %s", seen, c)
		}
	})

	t.Run("the resume names the agent's id; the whole stream comes back in the requester's ids", func(t *testing.T) {
		got := stream(userMessage(task, c, "v2"), 4)
		if len(got) != 4 {
			t.Fatalf("%d replies: the stream was cut (the opening Task snapshot still shows input-required)", len(got))
		}
		if w := resultTask(t, got[3]); w.ID+w.TaskID != task || w.Status.State != "TASK_STATE_COMPLETED" {
			t.Fatalf("last event %s", got[3].Payload)
		}
		if !strings.Contains(string(got[2].Payload), `"taskId":"`+task+`"`) {
			t.Fatalf("artifact update not translated: %s", got[2].Payload)
		}
		noAgentIDs(t, got)
		seen := agent.requests()
		if last := seen[len(seen)-1]; !agentIDs()[last.taskID] {
			t.Fatalf("resume reached the agent with task id %q, not its own", last.taskID)
		}
	})

	t.Run("GetTask through the agent's topic is translated both ways", func(t *testing.T) {
		got := client.call(t, ctx, topic, "GetTask", map[string]any{"id": task}, 1)
		if len(got) != 1 {
			t.Fatal("no answer")
		}
		w := resultTask(t, got[0])
		if w.ID != task || w.Status.State != "TASK_STATE_COMPLETED" || len(w.History) != 5 {
			t.Fatalf("GetTask %s", got[0].Payload)
		}
		noAgentIDs(t, got)
	})

	t.Run("the next new task goes without an id at once; unary results and CancelTask too", func(t *testing.T) {
		before := len(agent.requests())
		t2 := uuid.NewString()
		got := client.call(t, ctx, topic, "SendMessage", map[string]any{"message": userMessage(t2, c, "deploy again")}, 1)
		if len(got) != 1 || resultTask(t, got[0]).ID != t2 || resultTask(t, got[0]).Status.State != "TASK_STATE_INPUT_REQUIRED" {
			t.Fatalf("unary new task: %v", got)
		}
		seen := agent.requests()
		if len(seen) != before+1 || seen[before].taskID != "" {
			t.Fatalf("the agent saw %+v for the second task", seen[before:])
		}
		got = client.call(t, ctx, topic, "CancelTask", map[string]any{"id": t2}, 1)
		if len(got) != 1 || resultTask(t, got[0]).ID != t2 || resultTask(t, got[0]).Status.State != "TASK_STATE_CANCELED" {
			t.Fatalf("cancel: %v", got)
		}
		if last := agent.requests()[len(agent.requests())-1]; !agentIDs()[last.paramsID] {
			t.Fatalf("CancelTask reached the agent with %q", last.paramsID)
		}
		noAgentIDs(t, got)
	})

	t.Run("a profile agent beside it keeps the requester's ids", func(t *testing.T) {
		t3 := uuid.NewString()
		got := client.call(t, ctx, ref("raw").RequestTopic(), "SendMessage", map[string]any{"message": userMessage(t3, uuid.NewString(), "hi")}, 1)
		if len(got) != 1 || resultTask(t, got[0]).ID != t3 {
			t.Fatalf("profile agent: %v", got)
		}
		seen := profile.received()
		if !strings.Contains(string(seen[len(seen)-1].Payload), `"taskId":"`+t3+`"`) {
			t.Fatalf("the profile agent got %s", seen[len(seen)-1].Payload)
		}
	})
}
