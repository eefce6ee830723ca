package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"
	"github.com/gowebpki/jcs"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// The continuation hint extension, written out here (not taken from
// pkg/a2amqtt) so the test checks the wire contract, not the SDK's constant.
const continuationURI = "https://a2a-fleet.dev/extensions/continuation/v1"

// hintAgent is a responder on plain paho (no SDK) that pauses tasks with
// continuation hints, as docs/protocol.md describes them. The first word of a
// new task's text picks what it does:
//
//	approve     input-required {expected_input: approval, resume_scope: same_task};
//	            the answer's approve/deny data part decides ("approved"/"denied")
//	newtask     input-required {resume_scope: new_task_in_context}
//	credential  input-required {expected_input: credential} (only auth-required takes credentials)
//	login       auth-required {expected_input: credential}
//	fetch       reads its context's history from the conversation service first
//	            (ListTasks, historyLength 10, includeArtifacts), then input-required
//	            {history_policy: agent_fetched}
//	artifact    completes with an artifact "report-<task>"
//	other       completes "echo: <text>"
//
// A resume of a waiting task completes it.
type hintAgent struct {
	rc *rawClient
	mu sync.Mutex
	// tasks: the state of every task it ran, by the task id it was given.
	tasks map[string]string
	// seen: the requests it received; fetched: the service's history
	// answers, as received.
	seen    []*paho.Publish
	fetched []json.RawMessage
}

type wireMessage struct {
	MessageID string           `json:"messageId"`
	TaskID    string           `json:"taskId"`
	ContextID string           `json:"contextId"`
	Parts     []map[string]any `json:"parts"`
}

func (m wireMessage) text() string {
	for _, p := range m.Parts {
		if s, ok := p["text"].(string); ok {
			return s
		}
	}
	return ""
}

func (m wireMessage) decision() string {
	for _, p := range m.Parts {
		if d, ok := p["data"].(map[string]any); ok {
			if s, ok := d["decision"].(string); ok {
				return s
			}
		}
	}
	return ""
}

func startHintAgent(t testing.TB, ctx context.Context, st *stack, name string) *hintAgent {
	t.Helper()
	a := &hintAgent{rc: startRawClient(t, ctx, st, name), tasks: map[string]string{}}
	a.rc.serve(t, ctx, identity.DeliveryTopic(ref(name)), a.handle)
	return a
}

func (a *hintAgent) received() []*paho.Publish {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.seen)
}

func agentMessage(text string, hint map[string]any) map[string]any {
	m := map[string]any{"messageId": uuid.NewString(), "role": "ROLE_AGENT", "parts": []any{map[string]any{"text": text}}}
	if hint != nil {
		m["metadata"] = map[string]any{continuationURI: hint}
		m["extensions"] = []string{continuationURI}
	}
	return m
}

func (a *hintAgent) handle(p *paho.Publish) {
	var req struct {
		ID     any    `json:"id"`
		Method string `json:"method"`
		Params struct {
			Message wireMessage `json:"message"`
		} `json:"params"`
	}
	a.mu.Lock()
	a.seen = append(a.seen, p)
	a.mu.Unlock()
	if err := json.Unmarshal(p.Payload, &req); err != nil || (req.Method != "SendMessage" && req.Method != "SendStreamingMessage") {
		a.rc.answer(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": -32601, "message": "method not found"}})
		return
	}
	m := req.Params.Message
	a.mu.Lock()
	prev := a.tasks[m.TaskID]
	a.mu.Unlock()
	state, text := "TASK_STATE_COMPLETED", "echo: "+m.text()
	var hint map[string]any
	var artifacts []any
	if prev == "TASK_STATE_INPUT_REQUIRED" || prev == "TASK_STATE_AUTH_REQUIRED" {
		text = "done: " + m.text()
		switch m.decision() {
		case "approve":
			text = "approved"
		case "deny":
			text = "denied"
		}
	} else {
		switch strings.Fields(m.text() + " x")[0] {
		case "approve":
			state, text, hint = "TASK_STATE_INPUT_REQUIRED", "approve?", map[string]any{"expected_input": "approval", "resume_scope": "same_task"}
		case "newtask":
			state, text, hint = "TASK_STATE_INPUT_REQUIRED", "tell me in a new task", map[string]any{"resume_scope": "new_task_in_context"}
		case "credential":
			state, text, hint = "TASK_STATE_INPUT_REQUIRED", "password?", map[string]any{"expected_input": "credential"}
		case "login":
			state, text, hint = "TASK_STATE_AUTH_REQUIRED", "log in", map[string]any{"expected_input": "credential", "resume_scope": "same_task"}
		case "fetch":
			a.fetchHistory(m.ContextID)
			state, text, hint = "TASK_STATE_INPUT_REQUIRED", "seen it; more?", map[string]any{"history_policy": "agent_fetched"}
		case "artifact":
			artifacts = []any{map[string]any{"artifactId": "report-" + m.TaskID, "name": "report", "parts": []any{map[string]any{"text": "the report"}}}}
		}
	}
	a.mu.Lock()
	a.tasks[m.TaskID] = state
	a.mu.Unlock()
	status := map[string]any{"state": state, "message": agentMessage(text, hint)}
	task := map[string]any{"id": m.TaskID, "contextId": m.ContextID, "status": status}
	if artifacts != nil {
		task["artifacts"] = artifacts
	}
	if req.Method == "SendMessage" {
		a.rc.answer(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"task": task}})
		return
	}
	a.rc.answer(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"statusUpdate": map[string]any{
		"taskId": m.TaskID, "contextId": m.ContextID, "status": map[string]any{"state": "TASK_STATE_WORKING"}}}})
	a.rc.answer(p, map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{"statusUpdate": map[string]any{
		"taskId": m.TaskID, "contextId": m.ContextID, "final": true, "status": status}}})
}

// fetchHistory asks the conversation service for the context's history, as
// an agent with history_policy agent_fetched does, and keeps the answer.
func (a *hintAgent) fetchHistory(contextID string) {
	corr := []byte("h-" + uuid.NewString())
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "hist", "method": "ListTasks",
		"params": map[string]any{"contextId": contextID, "historyLength": 10, "includeArtifacts": true}})
	_, _ = a.rc.c.Publish(context.Background(), &paho.Publish{Topic: identity.Service.RequestTopic(), QoS: 1, Payload: body,
		Properties: &paho.PublishProperties{ResponseTopic: a.rc.id.ReplyTopic("history"), CorrelationData: corr, ContentType: "application/json"}})
	if got := a.rc.wait(corr, 1, 10*time.Second); len(got) == 1 {
		a.mu.Lock()
		a.fetched = append(a.fetched, got[0].Payload)
		a.mu.Unlock()
	}
}

// userMessage is a requester's message as it goes on the wire (and as the
// test feeds it to the digest).
func userMessage(taskID, contextID, text string, parts ...map[string]any) map[string]any {
	ps := []any{map[string]any{"text": text}}
	for _, p := range parts {
		ps = append(ps, p)
	}
	return map[string]any{"messageId": uuid.NewString(), "taskId": taskID, "contextId": contextID, "role": "ROLE_USER", "parts": ps}
}

// call sends a JSON-RPC request with fresh correlation data and returns the
// replies once want of them arrived (or what came within the timeout).
func (rc *rawClient) call(t testing.TB, ctx context.Context, topic, method string, params map[string]any, want int) []*paho.Publish {
	t.Helper()
	corr := []byte("c-" + uuid.NewString())
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "r-" + uuid.NewString(), "method": method, "params": params})
	if err != nil {
		t.Fatal(err)
	}
	rc.publish(t, ctx, topic, rc.id.ReplyTopic("mt"), corr, nil, string(body))
	return rc.wait(corr, want, 10*time.Second)
}

// wireTask is the part of a Task (or status update) the test reads.
type wireTask struct {
	ID        string `json:"id"`
	TaskID    string `json:"taskId"`
	ContextID string `json:"contextId"`
	Status    struct {
		State   string `json:"state"`
		Message *struct {
			Parts      []map[string]any           `json:"parts"`
			Metadata   map[string]json.RawMessage `json:"metadata"`
			Extensions []string                   `json:"extensions"`
		} `json:"message"`
	} `json:"status"`
	Metadata  map[string]json.RawMessage `json:"metadata"`
	History   []json.RawMessage          `json:"history"`
	Artifacts []struct {
		ArtifactID string `json:"artifactId"`
	} `json:"artifacts"`
}

type hint struct {
	ExpectedInput         string `json:"expected_input"`
	ResumeScope           string `json:"resume_scope"`
	HistoryPolicy         string `json:"history_policy"`
	AcceptedHistoryDigest string `json:"accepted_history_digest"`
}

// resultTask reads result.task, result.statusUpdate or a bare Task result.
func resultTask(t testing.TB, p *paho.Publish) wireTask {
	t.Helper()
	var env struct {
		Result map[string]json.RawMessage `json:"result"`
		Error  json.RawMessage            `json:"error"`
	}
	if err := json.Unmarshal(p.Payload, &env); err != nil || env.Error != nil || env.Result == nil {
		t.Fatalf("not a result: %s (%v)", p.Payload, err)
	}
	raw, _ := json.Marshal(env.Result)
	for _, k := range []string{"task", "statusUpdate"} {
		if v, ok := env.Result[k]; ok {
			raw = v
		}
	}
	var w wireTask
	if err := json.Unmarshal(raw, &w); err != nil {
		t.Fatalf("task %s: %v", raw, err)
	}
	return w
}

// statusHint reads the continuation hint of a relayed status message.
func (w wireTask) statusHint(t testing.TB) hint {
	t.Helper()
	if w.Status.Message == nil || !slices.Contains(w.Status.Message.Extensions, continuationURI) {
		t.Fatalf("status message without the continuation extension: %+v", w.Status)
	}
	var h hint
	if err := json.Unmarshal(w.Status.Message.Metadata[continuationURI], &h); err != nil {
		t.Fatalf("hint: %v", err)
	}
	return h
}

type rpcErr struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	RawData json.RawMessage `json:"data"`
	// Data is error.data when it is an object (binding and conversation
	// errors; A2A errors carry an array).
	Data struct {
		A2AError  string `json:"a2a_error"`
		Expected  hint   `json:"expected"`
		Reason    string `json:"reason"`
		TaskID    string `json:"taskId"`
		ContextID string `json:"contextId"`
	} `json:"-"`
}

func replyError(t testing.TB, replies []*paho.Publish) rpcErr {
	t.Helper()
	if len(replies) != 1 {
		t.Fatalf("%d replies, want one error", len(replies))
	}
	var env struct {
		Error *rpcErr `json:"error"`
	}
	if err := json.Unmarshal(replies[0].Payload, &env); err != nil || env.Error == nil {
		t.Fatalf("not an error: %s (%v)", replies[0].Payload, err)
	}
	if len(env.Error.RawData) > 0 && env.Error.RawData[0] == '{' {
		if err := json.Unmarshal(env.Error.RawData, &env.Error.Data); err != nil {
			t.Fatalf("error.data %s: %v", env.Error.RawData, err)
		}
	}
	return *env.Error
}

// jcsDigest recomputes accepted_history_digest from JSON the test saw, with
// the RFC 8785 canonical form, independently of pkg/a2amqtt.
func jcsDigest(t testing.TB, message any, history []json.RawMessage, artifacts []string) string {
	t.Helper()
	if history == nil {
		history = []json.RawMessage{}
	}
	artifacts = slices.Compact(slices.Sorted(slices.Values(artifacts)))
	if artifacts == nil {
		artifacts = []string{}
	}
	b, err := json.Marshal(map[string]any{"v": 1, "message": message, "history": history, "artifacts": artifacts})
	if err != nil {
		t.Fatal(err)
	}
	canonical, err := jcs.Transform(b)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(canonical)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// TestContinuationThroughTheService: issue 12's seed-004 items through the
// conversation service, with a plain-paho requester and responder, on both
// brokers: each continuation rule accepted and refused (-32063
// continuation_mismatch naming the expectation), the accepted_history_digest
// reproduced from the JSON the test saw, history with content in A2A v1.0
// shapes within its byte bound, and an input-required timeout relayed on the
// stream that got the pause.
func TestContinuationThroughTheService(t *testing.T) {
	onBothBrokers(t, continuationFlows)
}

func continuationFlows(t *testing.T, kind string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := newStack(t, ctx, kind)
	const bound = 4096
	pol := &unstructuredPolicy{name: "governed", ns: st.ns}
	pol.patch(t, ctx, fmt.Sprintf(`{"spec":{"history":{"mode":"Messages","maxBytesPerContext":%d}}}`, bound))
	clk := &clock{}
	st.startService(t, ctx, clk, "mt")
	agent := startHintAgent(t, ctx, st, "raw")
	client := startRawClient(t, ctx, st, "client")
	topic := ref("raw").RequestTopic()
	send := func(msg map[string]any) []*paho.Publish {
		t.Helper()
		return client.call(t, ctx, topic, "SendMessage", map[string]any{"message": msg}, 1)
	}
	history := func(method string, params map[string]any) []*paho.Publish {
		t.Helper()
		params["tenant"] = ref("raw").String()
		return client.call(t, ctx, identity.Service.RequestTopic(), method, params, 1)
	}
	mismatch := func(t *testing.T, replies []*paho.Publish, waiting string, want hint) rpcErr {
		t.Helper()
		e := replyError(t, replies)
		if e.Code != -32063 || e.Data.A2AError != "continuation_mismatch" || e.Data.TaskID != waiting || e.Data.Expected != want || e.Data.Reason == "" {
			t.Fatalf("refusal %+v, want -32063 continuation_mismatch for %s expecting %+v", e, waiting, want)
		}
		return e
	}

	t.Run("approval: refused without an approve/deny part, accepted with one; same_task", func(t *testing.T) {
		c, task := uuid.NewString(), uuid.NewString()
		ask := userMessage(task, c, "approve the deploy")
		w := resultTask(t, send(ask)[0])
		h := w.statusHint(t)
		digest := jcsDigest(t, ask, nil, nil)
		want := hint{ExpectedInput: "approval", ResumeScope: "same_task", AcceptedHistoryDigest: digest}
		if w.Status.State != "TASK_STATE_INPUT_REQUIRED" || h != want {
			t.Fatalf("pause %s with hint %+v, want %+v", w.Status.State, h, want)
		}
		n := len(agent.received())
		mismatch(t, send(userMessage(uuid.NewString(), c, "unrelated")), task, want)
		mismatch(t, send(userMessage(task, c, "yes please")), task, want)
		if len(agent.received()) != n {
			t.Fatal("a refused message reached the agent")
		}
		w = resultTask(t, send(userMessage(task, c, "ok", map[string]any{"data": map[string]any{"decision": "approve"}}))[0])
		if w.Status.State != "TASK_STATE_COMPLETED" || w.Status.Message.Parts[0]["text"] != "approved" {
			t.Fatalf("approved resume: %+v", w.Status)
		}
		// The digest is recorded with the task: GetTask shows it.
		got := resultTask(t, history("GetTask", map[string]any{"id": task})[0])
		var recorded hint
		if err := json.Unmarshal(got.Metadata[continuationURI], &recorded); err != nil || recorded.AcceptedHistoryDigest != digest {
			t.Fatalf("GetTask metadata %s", got.Metadata[continuationURI])
		}
		// Once answered, the context takes new tasks again.
		if w := resultTask(t, send(userMessage(uuid.NewString(), c, "next"))[0]); w.Status.State != "TASK_STATE_COMPLETED" {
			t.Fatalf("new task after the answer: %+v", w.Status)
		}
	})

	t.Run("new_task_in_context: the waiting task refuses the answer, a new task takes it", func(t *testing.T) {
		c, task := uuid.NewString(), uuid.NewString()
		ask := userMessage(task, c, "newtask please")
		h := resultTask(t, send(ask)[0]).statusHint(t)
		want := hint{ResumeScope: "new_task_in_context", AcceptedHistoryDigest: jcsDigest(t, ask, nil, nil)}
		if h != want {
			t.Fatalf("hint %+v, want %+v", h, want)
		}
		mismatch(t, send(userMessage(task, c, "here")), task, want)
		if w := resultTask(t, send(userMessage(uuid.NewString(), c, "here"))[0]); w.Status.State != "TASK_STATE_COMPLETED" {
			t.Fatalf("answer in a new task: %+v", w.Status)
		}
	})

	t.Run("credential: refused by an input-required task, taken by an auth-required one", func(t *testing.T) {
		c, task := uuid.NewString(), uuid.NewString()
		ask := userMessage(task, c, "credential now")
		resultTask(t, send(ask)[0])
		mismatch(t, send(userMessage(task, c, "hunter2")), task, hint{ExpectedInput: "credential", AcceptedHistoryDigest: jcsDigest(t, ask, nil, nil)})
		c2, task2 := uuid.NewString(), uuid.NewString()
		if w := resultTask(t, send(userMessage(task2, c2, "login"))[0]); w.Status.State != "TASK_STATE_AUTH_REQUIRED" {
			t.Fatalf("login: %+v", w.Status)
		}
		if w := resultTask(t, send(userMessage(task2, c2, "hunter2"))[0]); w.Status.State != "TASK_STATE_COMPLETED" {
			t.Fatalf("credential to auth-required: %+v", w.Status)
		}
	})

	var reportCtx string
	t.Run("the digest covers the message and the history the service showed the agent", func(t *testing.T) {
		c := uuid.NewString()
		reportCtx = c
		report := userMessage(uuid.NewString(), c, "artifact please")
		if w := resultTask(t, send(report)[0]); len(w.Artifacts) != 1 {
			t.Fatalf("artifact task: %+v", w)
		}
		fetch := userMessage(uuid.NewString(), c, "fetch what we did")
		w := resultTask(t, send(fetch)[0])
		agent.mu.Lock()
		served := agent.fetched[len(agent.fetched)-1]
		agent.mu.Unlock()
		// Recompute from what the agent received: the tasks (newest first)
		// with their history and artifacts, oldest first for the digest.
		var list struct {
			Result struct {
				Tasks []wireTask `json:"tasks"`
			} `json:"result"`
		}
		if err := json.Unmarshal(served, &list); err != nil || len(list.Result.Tasks) != 2 {
			t.Fatalf("served history %s", served)
		}
		var msgs []json.RawMessage
		var arts []string
		for _, tk := range slices.Backward(list.Result.Tasks) {
			msgs = append(msgs, tk.History...)
			for _, a := range tk.Artifacts {
				arts = append(arts, a.ArtifactID)
			}
		}
		if len(msgs) < 3 || !slices.Equal(arts, []string{"report-" + report["taskId"].(string)}) {
			t.Fatalf("served %d messages, artifacts %v: %s", len(msgs), arts, served)
		}
		h := w.statusHint(t)
		if want := jcsDigest(t, fetch, msgs, arts); h.AcceptedHistoryDigest != want || h.HistoryPolicy != "agent_fetched" {
			t.Fatalf("digest %s, recomputed %s (hint %+v)", h.AcceptedHistoryDigest, want, h)
		}
		if h.AcceptedHistoryDigest == jcsDigest(t, fetch, nil, nil) {
			t.Fatal("the digest ignores what the agent was shown")
		}
	})

	t.Run("history with content: A2A v1.0 tasks with history and artifacts, historyLength, bounded", func(t *testing.T) {
		var list struct {
			Result *a2a.ListTasksResponse `json:"result"`
		}
		p := history("ListTasks", map[string]any{"contextId": reportCtx, "historyLength": 1, "includeArtifacts": true})[0]
		if err := json.Unmarshal(p.Payload, &list); err != nil || list.Result == nil || len(list.Result.Tasks) != 2 {
			t.Fatalf("ListTasks: %s (%v)", p.Payload, err)
		}
		oldest := list.Result.Tasks[1]
		if len(oldest.History) != 1 || oldest.History[0].Role != a2a.MessageRoleAgent || len(oldest.Artifacts) != 1 ||
			oldest.Artifacts[0].Parts[0].Text() != "the report" || oldest.Status.State != a2a.TaskStateCompleted {
			t.Fatalf("task with content: %s", p.Payload)
		}
		var one struct {
			Result *a2a.Task `json:"result"`
		}
		p = history("GetTask", map[string]any{"id": string(oldest.ID)})[0]
		if err := json.Unmarshal(p.Payload, &one); err != nil || one.Result == nil || len(one.Result.History) != 2 ||
			one.Result.History[0].Role != a2a.MessageRoleUser || one.Result.History[0].Parts[0].Text() != "artifact please" {
			t.Fatalf("GetTask: %s (%v)", p.Payload, err)
		}
		p = history("GetTask", map[string]any{"id": string(oldest.ID), "historyLength": 0})[0]
		var none struct {
			Result *a2a.Task `json:"result"`
		}
		if err := json.Unmarshal(p.Payload, &none); err != nil || none.Result == nil || len(none.Result.History) != 0 {
			t.Fatalf("GetTask historyLength 0: %s", p.Payload)
		}

		// Past the byte bound the oldest turns go first.
		c := uuid.NewString()
		var first, last string
		for i := range 8 {
			task := uuid.NewString()
			if i == 0 {
				first = task
			}
			last = task
			resultTask(t, send(userMessage(task, c, fmt.Sprintf("turn %d %s", i, strings.Repeat("x", 500))))[0])
		}
		p = history("ListTasks", map[string]any{"contextId": c})[0]
		var bounded struct {
			Result *a2a.ListTasksResponse `json:"result"`
		}
		if err := json.Unmarshal(p.Payload, &bounded); err != nil || bounded.Result == nil {
			t.Fatalf("ListTasks: %s", p.Payload)
		}
		size, byTask := 0, map[string]int{}
		for _, tk := range bounded.Result.Tasks {
			for _, m := range tk.History {
				b, _ := json.Marshal(m)
				size += len(b)
				byTask[string(tk.ID)]++
			}
		}
		if size > bound || byTask[first] != 0 || byTask[last] != 2 {
			t.Fatalf("history of %d bytes (bound %d), messages per task %v (first %s, last %s)", size, bound, byTask, first, last)
		}
	})

	t.Run("an input-required timeout is relayed on the stream that got the pause", func(t *testing.T) {
		pol.patch(t, ctx, `{"spec":{"inputRequiredTimeout":"1m"}}`)
		eventually(t, 30*time.Second, "timeout notice on the stream", func() error {
			c, task := uuid.NewString(), uuid.NewString()
			corr := []byte("s-" + uuid.NewString())
			body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "s1", "method": "SendStreamingMessage",
				"params": map[string]any{"message": userMessage(task, c, "approve later")}})
			client.publish(t, ctx, topic, client.id.ReplyTopic("stream"), corr, nil, string(body))
			got := client.wait(corr, 2, 10*time.Second)
			if len(got) != 2 || resultTask(t, got[1]).Status.State != "TASK_STATE_INPUT_REQUIRED" {
				return fmt.Errorf("stream before the timeout: %d replies", len(got))
			}
			clk.Advance(2 * time.Minute)
			got = client.wait(corr, 3, 5*time.Second)
			if len(got) != 3 {
				return fmt.Errorf("no timeout notice (policy not applied yet?)")
			}
			w := resultTask(t, got[2])
			if w.TaskID != task || w.Status.State != "TASK_STATE_FAILED" || !strings.Contains(fmt.Sprint(w.Status.Message.Parts), "input-required timeout") {
				t.Fatalf("timeout notice %s", got[2].Payload)
			}
			e := replyError(t, send(userMessage(task, c, "too late", map[string]any{"data": map[string]any{"decision": "approve"}})))
			if e.Code != -32004 || !strings.Contains(e.Message, "input-required timeout") {
				t.Fatalf("resume after the timeout: %+v", e)
			}
			return nil
		})
	})

	t.Run("the profile agent always got the requester's task ids", func(t *testing.T) {
		for _, p := range agent.received() {
			var req struct {
				Method string `json:"method"`
				Params struct {
					Message wireMessage `json:"message"`
				} `json:"params"`
			}
			if err := json.Unmarshal(p.Payload, &req); err != nil || (strings.Contains(req.Method, "Message") && req.Params.Message.TaskID == "") {
				t.Fatalf("request without the requester's task id: %s", p.Payload)
			}
		}
	})
}
