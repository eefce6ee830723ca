package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/gateway"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

func userMsg(contextID string, taskID a2a.TaskID, text string) *a2a.SendMessageRequest {
	m := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
	m.ContextID, m.TaskID = contextID, taskID
	return &a2a.SendMessageRequest{Message: m}
}

// taskOf is the Task a SendMessage answered with.
func taskOf(t testing.TB) func(a2a.SendMessageResult, error) *a2a.Task {
	return func(res a2a.SendMessageResult, err error) *a2a.Task {
		t.Helper()
		if err != nil {
			t.Fatalf("send: %v", err)
		}
		task, ok := res.(*a2a.Task)
		if !ok {
			t.Fatalf("result %T, want a Task", res)
		}
		return task
	}
}

// said is the text of a task's status message.
func said(task *a2a.Task) string {
	if task.Status.Message == nil {
		return ""
	}
	return a2amqtt.TextOf(task.Status.Message)
}

// rpcResponse is a JSON-RPC response as an HTTP caller reads it.
type rpcResponse struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

// post sends a raw body to an agent's endpoint and returns the HTTP status and the response.
func post(t testing.TB, ctx context.Context, url, token string, body []byte) (int, rpcResponse) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out rpcResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("POST %s: status %d, body %q is not JSON-RPC: %v", url, resp.StatusCode, raw, err)
	}
	return resp.StatusCode, out
}

func sendBody(contextID string, taskID a2a.TaskID, text string) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": userMsg(contextID, taskID, text)})
	return b
}

// TestHTTPClientCallsAnMQTTAgent: a2a-go's HTTP client calls the memory agent (the SDK's
// responder on the bus, governed by a ConversationPolicy) through the gateway, as the Agent its
// ServiceAccount acts as: the card, follow-ups in one context, input-required and resume, a
// stream over SSE, GetTask and ListTasks, and a mismatched context refused with -32602 as on MQTT.
func TestHTTPClientCallsAnMQTTAgent(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind, startHTTPAgent(t))
		st.startMQTTAgent(t, ctx, "memory", true)
		gw, _ := st.gateway(t, ctx)
		token := st.token(t, ctx, "caller")
		c, card := httpClient(t, ctx, gw, "memory", token)

		endpoint := gw + "/agents/acme/sales/memory/"
		if len(card.SupportedInterfaces) != 1 || card.SupportedInterfaces[0].URL != endpoint ||
			card.SupportedInterfaces[0].ProtocolBinding != a2a.TransportProtocolJSONRPC {
			t.Fatalf("card interfaces %+v, want the JSON-RPC endpoint %s", card.SupportedInterfaces, endpoint)
		}
		if _, ok := card.SecuritySchemes[gateway.SecuritySchemeName]; !ok || card.Name != "memory" {
			t.Fatalf("card %s security schemes %+v, want %s", card.Name, card.SecuritySchemes, gateway.SecuritySchemeName)
		}

		ctxID := uuid.NewString()
		first := taskOf(t)(c.SendMessage(ctx, userMsg(ctxID, "", "hello")))
		if first.Status.State != a2a.TaskStateCompleted || first.ContextID != ctxID || !strings.Contains(said(first), "Turn 1") {
			t.Fatalf("turn 1: %s %q in %s", first.Status.State, said(first), first.ContextID)
		}
		second := taskOf(t)(c.SendMessage(ctx, userMsg(ctxID, "", "what did I say?")))
		if second.Status.State != a2a.TaskStateCompleted || !strings.Contains(said(second), "Turn 2") || !strings.Contains(said(second), `"hello"`) {
			t.Fatalf("turn 2: %s %q", second.Status.State, said(second))
		}

		remind := taskOf(t)(c.SendMessage(ctx, userMsg(ctxID, "", "remind me to call Bob")))
		if remind.Status.State != a2a.TaskStateInputRequired || said(remind) != agents.MemoryQuestion {
			t.Fatalf("remind: %s %q, want input-required %q", remind.Status.State, said(remind), agents.MemoryQuestion)
		}
		resumed := taskOf(t)(c.SendMessage(ctx, userMsg(ctxID, remind.ID, "tomorrow")))
		if resumed.ID != remind.ID || resumed.Status.State != a2a.TaskStateCompleted || said(resumed) != "OK, I will remind you to call Bob tomorrow." {
			t.Fatalf("resume: %s %s %q", resumed.ID, resumed.Status.State, said(resumed))
		}

		// A message for a task of this context, sent in another context: -32602 from the bus,
		// as the HTTP response (a2a-go's client reads it as InvalidParams, the raw body shows the code).
		_, err := c.SendMessage(ctx, userMsg(uuid.NewString(), remind.ID, "again"))
		if !errors.Is(err, a2a.ErrInvalidParams) {
			t.Fatalf("mismatched context: %v, want InvalidParams", err)
		}
		status, resp := post(t, ctx, endpoint, token, sendBody(uuid.NewString(), remind.ID, "again"))
		if status != http.StatusOK || resp.Error == nil || resp.Error.Code != -32602 {
			t.Fatalf("mismatched context over raw HTTP: %d %+v, want -32602", status, resp.Error)
		}

		var last a2a.Event
		n := 0
		for ev, err := range c.SendStreamingMessage(ctx, userMsg(ctxID, "", "stream it")) {
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			last, n = ev, n+1
		}
		if su, ok := last.(*a2a.TaskStatusUpdateEvent); !ok || su.Status.State != a2a.TaskStateCompleted || su.ContextID != ctxID || n < 2 {
			t.Fatalf("stream: %d events, last %#v, want a completed status update", n, last)
		}

		paused := taskOf(t)(c.SendMessage(ctx, userMsg(ctxID, "", "remind me to stop")))
		canceled, err := c.CancelTask(ctx, &a2a.CancelTaskRequest{ID: paused.ID})
		if err != nil || canceled.ID != paused.ID || canceled.Status.State != a2a.TaskStateCanceled {
			t.Fatalf("CancelTask: %+v %v", canceled, err)
		}

		got, err := c.GetTask(ctx, &a2a.GetTaskRequest{ID: first.ID})
		if err != nil || got.ID != first.ID || got.Status.State != a2a.TaskStateCompleted {
			t.Fatalf("GetTask: %+v %v", got, err)
		}
		list, err := c.ListTasks(ctx, &a2a.ListTasksRequest{ContextID: ctxID})
		if err != nil || len(list.Tasks) < 5 {
			t.Fatalf("ListTasks in the context: %+v %v, want the 5 tasks", list, err)
		}
	})
}

// TestMQTTRequesterCallsAnHTTPAgent: the SDK's requester calls an agent served by a2a-go's HTTP
// server, which the gateway holds on the bus; the agent is governed, so the call goes through
// the conversation service like any other. The HTTP agent makes its own task and context ids; the
// requester sees its own, and follow-ups reach the same task and context on the HTTP agent.
func TestMQTTRequesterCallsAnHTTPAgent(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		agent, url := startPlanner(t)
		st := newStack(t, ctx, kind, url)
		gw := st.gatewayReplica(t, ctx)
		tr := st.requesterAs(t, ctx, "mqttclient").Transport(ref("httpagent"))

		ctxID := uuid.NewString()
		plan := taskOf(t)(tr.SendMessage(ctx, nil, userMsg(ctxID, "", "deploy v2")))
		if plan.Status.State != a2a.TaskStateInputRequired || plan.ContextID != ctxID || said(plan) != "Turn 1. Plan: deploy v2. Say 'go ahead'." {
			t.Fatalf("turn 1: %s %q in %s", plan.Status.State, said(plan), plan.ContextID)
		}
		done := taskOf(t)(tr.SendMessage(ctx, nil, userMsg(ctxID, plan.ID, "go ahead")))
		if done.ID != plan.ID || done.Status.State != a2a.TaskStateCompleted || said(done) != "Done: deploy v2" {
			t.Fatalf("resume: %s %s %q", done.ID, done.Status.State, said(done))
		}
		if len(done.Artifacts) != 1 || a2amqtt.TextOf(&a2a.Message{Parts: done.Artifacts[0].Parts}) != "done: deploy v2" {
			t.Fatalf("artifacts %+v", done.Artifacts)
		}

		var last a2a.Event
		for ev, err := range tr.SendStreamingMessage(ctx, nil, userMsg(ctxID, "", "roll back v1")) {
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			last = ev
		}
		su, ok := last.(*a2a.TaskStatusUpdateEvent)
		if !ok || su.Status.State != a2a.TaskStateInputRequired || su.ContextID != ctxID || a2amqtt.TextOf(su.Status.Message) != "Turn 2. Plan: roll back v1. Say 'go ahead'." {
			t.Fatalf("stream: last %#v, want turn 2 of the same context asking for approval", last)
		}

		got, err := tr.GetTask(ctx, nil, &a2a.GetTaskRequest{ID: plan.ID})
		if err != nil || got.Status.State != a2a.TaskStateCompleted {
			t.Fatalf("GetTask: %+v %v", got, err)
		}
		if _, err := tr.SendMessage(ctx, nil, userMsg(uuid.NewString(), plan.ID, "again")); !errors.Is(err, a2a.ErrInvalidParams) {
			t.Fatalf("mismatched context: %v, want InvalidParams", err)
		}

		// CancelTask reaches the HTTP agent's task (the stream's task waits for approval there).
		canceled, err := tr.CancelTask(ctx, nil, &a2a.CancelTaskRequest{ID: su.TaskID})
		if err != nil || canceled.Status.State != a2a.TaskStateCanceled {
			t.Fatalf("CancelTask: %+v %v", canceled, err)
		}
		agent.mu.Lock()
		remote := slices.Clone(agent.canceled)
		agent.mu.Unlock()
		if len(remote) != 1 || remote[0] == su.TaskID {
			t.Fatalf("the HTTP agent canceled %v, want its own task for %s", remote, su.TaskID)
		}

		// Its presence is its HTTP server's: once the server stops answering, the gateway lets
		// the identity go, and a caller finds nobody on its (delivery) topic.
		agent.srv.Close()
		if err := gw.out.Sync(ctx); err != nil || len(gw.out.Held()) != 0 {
			t.Fatalf("after the HTTP agent stopped: held %v (%v)", gw.out.Held(), err)
		}
		callCtx, cancelCall := context.WithTimeout(ctx, 3*time.Second)
		defer cancelCall()
		if res, err := tr.SendMessage(callCtx, nil, userMsg(ctxID, "", "anyone?")); err == nil {
			t.Fatalf("a call to the stopped HTTP agent was answered: %v", res)
		}
	})
}

// TestRefusals: every HTTP caller is authenticated and mapped; a caller the target's callers
// rules do not admit is refused as on MQTT; an oversized or malformed body gets a clear error.
func TestRefusals(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind, startHTTPAgent(t))
		gw, pool := st.gateway(t, ctx)
		endpoint := gw + "/agents/acme/sales/direct/"
		body := sendBody(uuid.NewString(), "", "hello")
		token := st.token(t, ctx, "caller")

		// No agent process on the bus: the profile's binding error, whole (a2a-go alone would
		// send -32004 as UnsupportedOperation, without error.data.a2a_error).
		status, resp := post(t, ctx, endpoint, token, body)
		if status != http.StatusOK || resp.Error == nil || resp.Error.Code != a2amqtt.CodeResponderUnavailable ||
			!strings.Contains(string(resp.Error.Data), `"a2a_error":"`+a2amqtt.A2AErrorResponderUnavailable+`"`) {
			t.Fatalf("no agent on the bus: %d %+v, want -32004 responder_unavailable", status, resp.Error)
		}
		st.startMQTTAgent(t, ctx, "direct", false)

		for name, token := range map[string]string{"no token": "", "not a token": "garbage"} {
			status, resp := post(t, ctx, endpoint, token, body)
			if status != http.StatusUnauthorized || resp.Error == nil || resp.Error.Code != -31401 {
				t.Fatalf("%s: %d %+v, want 401 with -31401", name, status, resp.Error)
			}
		}
		res, err := http.Get(endpoint + ".well-known/agent-card.json")
		if err != nil || res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("card without a token: %v %v, want 401", res.StatusCode, err)
		}
		_ = res.Body.Close()

		status, resp = post(t, ctx, endpoint, st.token(t, ctx, "nobody"), body)
		if status != http.StatusForbidden || resp.Error == nil || resp.Error.Code != -31403 || !strings.Contains(resp.Error.Message, "acts as no Agent") {
			t.Fatalf("unmapped ServiceAccount: %d %+v, want 403", status, resp.Error)
		}

		status, resp = post(t, ctx, gw+"/agents/acme/sales/mqttclient/", token, body)
		if status != http.StatusNotFound || resp.Error == nil {
			t.Fatalf("agent not exposed: %d %+v, want 404", status, resp.Error)
		}

		// The outsider (another unit) is not among direct's callers: on MQTT the broker refuses
		// its request (PUBACK 0x87); over HTTP it gets that refusal as A2A's -31403.
		mq := st.requesterAs(t, ctx, "outsider")
		_, err = mq.Transport(ref("direct")).SendMessage(ctx, nil, userMsg(uuid.NewString(), "", "hello"))
		if err == nil || !strings.Contains(err.Error(), "not authorized") {
			t.Fatalf("outsider on MQTT: %v, want the broker's refusal", err)
		}
		_ = mq.Conn().Close(ctx) // the gateway connects as the outsider next (one client ID per identity)
		status, resp = post(t, ctx, endpoint, st.token(t, ctx, "outsider"), body)
		if status != http.StatusOK || resp.Error == nil || resp.Error.Code != -31403 {
			t.Fatalf("outsider over HTTP: %d %+v, want -31403", status, resp.Error)
		}

		status, resp = post(t, ctx, endpoint, token, bytes.Repeat([]byte("x"), 100<<10))
		if status != http.StatusRequestEntityTooLarge || resp.Error == nil || !strings.Contains(resp.Error.Message, "larger than the gateway accepts") {
			t.Fatalf("oversized body: %d %+v, want 413", status, resp.Error)
		}
		status, resp = post(t, ctx, endpoint, token, []byte(`{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {`))
		if status != http.StatusOK || resp.Error == nil || resp.Error.Code != -32700 {
			t.Fatalf("malformed body: %d %+v, want -32700", status, resp.Error)
		}

		// And the admitted caller gets through.
		status, resp = post(t, ctx, endpoint, token, body)
		if status != http.StatusOK || resp.Error != nil || !strings.Contains(string(resp.Result), "Turn 1") {
			t.Fatalf("admitted caller: %d %+v %s", status, resp.Error, resp.Result)
		}

		// Idle caller connections are let go (the outsider's and the caller's), and made again
		// at the next request.
		if n := sweepIdle(ctx, pool, 2); n != 2 || pool.Size() != 0 {
			t.Fatalf("sweep closed %d, %d left; want 2 and 0", n, pool.Size())
		}
		status, resp = post(t, ctx, endpoint, token, sendBody(uuid.NewString(), "", "after the sweep"))
		if status != http.StatusOK || resp.Error != nil || pool.Size() != 1 {
			t.Fatalf("after the sweep: %d %+v, %d connections", status, resp.Error, pool.Size())
		}
	})
}

// TestServiceRefusalReachesTheHTTPCallerWhole: the conversation service's own refusal (-32070
// rate_limited, with retry_after) reaches an HTTP caller with the code and data an MQTT caller
// gets (a2a-go's server alone would send -32603), naming the caller's Agent identity. (The SSE
// framing of a kept error is TestReplaceError's; a rate-limited stream gets no answer from the
// service on MQTT either, so it is not compared here.)
func TestServiceRefusalReachesTheHTTPCallerWhole(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind, startHTTPAgent(t), func(c *convservice.Config) { c.CallerRate, c.CallerBurst = 0.1, 1 })
		st.startMQTTAgent(t, ctx, "memory", true)
		gw, _ := st.gateway(t, ctx)
		endpoint, token := gw+"/agents/acme/sales/memory/", st.token(t, ctx, "caller")

		// On MQTT (the SDK's waits for retry_after turned off): the first call passes, the next is refused.
		conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: st.brokerURL, Username: st.usernames["mqttclient"], Password: st.passwords["mqttclient"], Agent: ref("mqttclient")})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		mq, err := a2amqtt.NewRequester(ctx, conn, a2amqtt.RequesterOptions{Retry: a2amqtt.RetryPolicy{MaxAttempts: 1, RateLimitRetries: -1}})
		if err != nil {
			t.Fatal(err)
		}
		var onMQTT *rpcerr.Error
		for range 2 {
			_, err = mq.Transport(ref("memory")).SendMessage(ctx, nil, userMsg(uuid.NewString(), "", "hello"))
		}
		if !errors.As(err, &onMQTT) || onMQTT.Code != a2amqtt.CodeRateLimited {
			t.Fatalf("on MQTT: %v, want -32070", err)
		}

		status, first := post(t, ctx, endpoint, token, sendBody(uuid.NewString(), "", "hello"))
		if status != http.StatusOK || first.Error != nil {
			t.Fatalf("first call over HTTP: %d %+v", status, first.Error)
		}
		_, second := post(t, ctx, endpoint, token, sendBody(uuid.NewString(), "", "hello"))
		// The same refusal, naming the HTTP caller's Agent identity (the service judged it as that Agent).
		if e := second.Error; e == nil || e.Code != onMQTT.Code || !strings.HasPrefix(e.Message, "too many requests from acme/sales/client:") ||
			!strings.Contains(string(e.Data), `"a2a_error":"`+onMQTT.A2AError()+`"`) || !strings.Contains(string(e.Data), `"caller":"acme/sales/client"`) ||
			!strings.Contains(string(e.Data), "retry_after") {
			t.Fatalf("over HTTP: %+v %s, want what MQTT got: %d %q %s", e, e.Data, onMQTT.Code, onMQTT.Message, onMQTT.Data)
		}

	})
}

// TestStreamSurvivesAGatewayReplica: a replica dies during an HTTP stream (its connections cut, as
// a killed pod's); the task goes on with the agent, and the caller reads it to its end with
// GetTask through another replica: the gateway holds no task state.
func TestStreamSurvivesAGatewayReplica(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind, startHTTPAgent(t))
		st.startMQTTAgent(t, ctx, "memory", true, 2*time.Second)
		a := st.gatewayReplica(t, ctx)
		gwA, stopA := a.url, a.stop
		token := st.token(t, ctx, "caller")
		viaA, _ := httpClient(t, ctx, gwA, "memory", token)

		var taskID a2a.TaskID
		var streamErr error
		for ev, err := range viaA.SendStreamingMessage(ctx, userMsg(uuid.NewString(), "", "a long one")) {
			if err != nil {
				streamErr = err
				break
			}
			if taskID == "" {
				taskID = ev.TaskInfo().TaskID
				stopA() // the replica dies after the first event
			}
		}
		if taskID == "" || streamErr == nil {
			t.Fatalf("stream: task %q, error %v; want the first event, then the stream cut", taskID, streamErr)
		}

		gwB, _ := st.gateway(t, ctx)
		viaB, _ := httpClient(t, ctx, gwB, "memory", token)
		testenv.Eventually(t, 30*time.Second, "the task completes, read through the other replica", func() error {
			task, err := viaB.GetTask(ctx, &a2a.GetTaskRequest{ID: taskID})
			if err != nil {
				return err
			}
			if task.Status.State != a2a.TaskStateCompleted || !strings.Contains(said(task), "a long one") {
				return fmt.Errorf("%s %q", task.Status.State, said(task))
			}
			return nil
		})
	})
}
