package a2amqtt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// rawPeer is a bare MQTT client speaking the wire format by hand, to send
// requests the SDK requester would never produce.
type rawPeer struct {
	t     *testing.T
	conn  *Conn
	reply string
	mu    sync.Mutex
	got   []*paho.Publish
	ch    chan struct{}
}

func newRawPeer(t *testing.T, b brokertest.Broker) *rawPeer {
	t.Helper()
	ref := AgentRef{Org: "acme", Unit: "ops", Agent: "raw-" + randomHex(4)}
	p := &rawPeer{t: t, conn: connectT(t, b, ref, nil), reply: ref.ReplyTopic("r" + randomHex(4)), ch: make(chan struct{}, 100)}
	if _, err := p.conn.Subscribe(ctxT(t, 5*time.Second), p.reply, func(m *paho.Publish) {
		p.mu.Lock()
		p.got = append(p.got, m)
		p.mu.Unlock()
		p.ch <- struct{}{}
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *rawPeer) publish(topic string, payload []byte, corr []byte, user ...paho.UserProperty) {
	p.t.Helper()
	props := &paho.PublishProperties{ResponseTopic: p.reply, CorrelationData: corr, User: user}
	if _, err := p.conn.Publish(ctxT(p.t, 5*time.Second), &paho.Publish{Topic: topic, QoS: 1, Payload: payload, Properties: props}); err != nil {
		p.t.Fatalf("raw publish: %v", err)
	}
}

// await returns once n replies arrived (or fails after d).
func (p *rawPeer) await(n int, d time.Duration) []*paho.Publish {
	p.t.Helper()
	deadline := time.After(d)
	for {
		p.mu.Lock()
		if len(p.got) >= n {
			out := append([]*paho.Publish(nil), p.got...)
			p.mu.Unlock()
			return out
		}
		p.mu.Unlock()
		select {
		case <-p.ch:
		case <-deadline:
			p.mu.Lock()
			defer p.mu.Unlock()
			p.t.Fatalf("got %d replies, want %d", len(p.got), n)
			return nil
		}
	}
}

func decodeResp(t *testing.T, m *paho.Publish) rpcResponse {
	t.Helper()
	var r rpcResponse
	if err := json.Unmarshal(m.Payload, &r); err != nil {
		t.Fatalf("reply not JSON-RPC: %v: %s", err, m.Payload)
	}
	return r
}

func sendReq(method, taskID, contextID, text string) []byte {
	msg := map[string]any{"messageId": uuid.NewString(), "role": "ROLE_USER", "parts": []any{map[string]any{"text": text}}}
	if taskID != "" {
		msg["taskId"] = taskID
	}
	if contextID != "" {
		msg["contextId"] = contextID
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "req-1", "method": method, "params": map[string]any{"message": msg}})
	return b
}

func TestBindingErrors(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		serveT(t, b, agentB, echoExec(), func(o *ResponderOptions) { o.MaxPayloadBytes = 4096 })
		peer := newRawPeer(t, b)
		topic := agentB.RequestTopic()
		cases := []struct {
			name     string
			payload  []byte
			user     []paho.UserProperty
			code     int
			a2aError string
		}{
			{"missing task id", sendReq(MethodSendMessage, "", uuid.NewString(), "x"), nil, CodeTransportProtocolError, A2AErrorTransportProtocolError},
			{"malformed task id", sendReq(MethodSendMessage, "not-a-uuid", uuid.NewString(), "x"), nil, CodeTransportProtocolError, A2AErrorTransportProtocolError},
			{"context property mismatch", sendReq(MethodSendMessage, uuid.NewString(), "ctx-a", "x"), []paho.UserProperty{{Key: PropContextID, Value: "ctx-b"}}, CodeTransportProtocolError, A2AErrorTransportProtocolError},
			{"malformed json", []byte(`{"jsonrpc":"2.0","id":1,"method":`), nil, -32700, ""},
			{"not an object", []byte(`42`), nil, -32600, ""},
			{"unknown method", []byte(`{"jsonrpc":"2.0","id":1,"method":"Nope","params":{}}`), nil, -32601, ""},
			{"oversized", append([]byte(`{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"x":"`), append([]byte(strings.Repeat("a", 5000)), '"', '}', '}')...), nil, -32600, ""},
			{"wrong params type", []byte(`{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":7}}`), nil, -32602, ""},
		}
		for i, tc := range cases {
			corr := []byte(fmt.Sprintf("corr-%d", i))
			peer.publish(topic, tc.payload, corr, tc.user...)
			replies := peer.await(i+1, 5*time.Second)
			m := replies[i]
			if string(m.Properties.CorrelationData) != string(corr) {
				t.Fatalf("%s: correlation %q not echoed (got %q)", tc.name, corr, m.Properties.CorrelationData)
			}
			r := decodeResp(t, m)
			if r.Error == nil || r.Error.Code != tc.code || r.Error.A2AError() != tc.a2aError {
				t.Fatalf("%s: got %s, want code %d a2a_error %q", tc.name, m.Payload, tc.code, tc.a2aError)
			}
		}

		// Missing Correlation Data: rejected with -32005 on the reply path.
		peer.publish(topic, sendReq(MethodSendMessage, uuid.NewString(), "", "x"), nil)
		m := peer.await(len(cases)+1, 5*time.Second)[len(cases)]
		if r := decodeResp(t, m); r.Error == nil || r.Error.A2AError() != A2AErrorTransportProtocolError {
			t.Fatalf("missing correlation: %s", m.Payload)
		}
	})
}

func TestOverloadAndExpiry(t *testing.T) {
	b := brokertest.StartMochi(t)
	release := make(chan struct{})
	exec := &scriptExec{fn: func(ctx context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
		select {
		case <-release:
		case <-time.After(1500 * time.Millisecond):
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, nil), nil)
	}}
	serveT(t, b, agentB, exec, func(o *ResponderOptions) { o.MaxConcurrent = 1; o.QueueTimeout = 100 * time.Millisecond })
	peer := newRawPeer(t, b)
	peer.publish(agentB.RequestTopic(), sendReq(MethodSendMessage, uuid.NewString(), "", "slow"), []byte("c1"))
	waitRuns(t, exec, 1) // c1 holds the only slot before c2 arrives
	peer.publish(agentB.RequestTopic(), sendReq(MethodSendMessage, uuid.NewString(), "", "rejected"), []byte("c2"))
	got := peer.await(1, 3*time.Second)
	r := decodeResp(t, got[0])
	if string(got[0].Properties.CorrelationData) != "c2" || r.Error == nil || r.Error.Code != CodeResponderUnavailable || r.Error.A2AError() != A2AErrorResponderUnavailable || !r.Error.Retryable() {
		t.Fatalf("want -32004 responder_unavailable for c2, got %s %s", got[0].Properties.CorrelationData, got[0].Payload)
	}
	close(release)
	peer.await(2, 3*time.Second)

	// Expiry: a request whose Message Expiry runs out while it waits for a
	// slot is answered -32003 instead of being processed.
	b2 := brokertest.StartMochi(t)
	exec2 := &scriptExec{fn: func(ctx context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
		time.Sleep(2 * time.Second)
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, nil), nil)
	}}
	serveT(t, b2, agentB, exec2, func(o *ResponderOptions) { o.MaxConcurrent = 1; o.QueueTimeout = 5 * time.Second })
	peer2 := newRawPeer(t, b2)
	peer2.publish(agentB.RequestTopic(), sendReq(MethodSendMessage, uuid.NewString(), "", "slow"), []byte("e1"))
	waitRuns(t, exec2, 1)
	one := uint32(1)
	if _, err := peer2.conn.Publish(ctxT(t, 5*time.Second), &paho.Publish{Topic: agentB.RequestTopic(), QoS: 1,
		Payload:    sendReq(MethodSendMessage, uuid.NewString(), "", "stale"),
		Properties: &paho.PublishProperties{ResponseTopic: peer2.reply, CorrelationData: []byte("e2"), MessageExpiry: &one}}); err != nil {
		t.Fatal(err)
	}
	replies := peer2.await(2, 8*time.Second)
	var expired bool
	for _, m := range replies {
		if string(m.Properties.CorrelationData) == "e2" {
			r := decodeResp(t, m)
			expired = r.Error != nil && r.Error.Code == CodeRequestExpired && r.Error.A2AError() == A2AErrorRequestExpired
		}
	}
	if !expired {
		t.Fatalf("want -32003 request_expired for e2; replies: %s / %s", replies[0].Payload, replies[1].Payload)
	}
	if exec2.runs.Load() != 1 {
		t.Fatalf("expired request was executed: runs=%d", exec2.runs.Load())
	}
}

// TestQoS1DuplicateDelivery publishes the same request twice (same Response Topic and
// Correlation Data, as paho resends an unacknowledged PUBLISH after its own reconnect and the
// broker forwards both): one task, one execution, one reply; the copy is dropped
// (Responder.CopiesDropped). A retry carries new Correlation Data and is answered, from the task
// store (the profile's Task.id deduplication), without a second execution.
func TestQoS1DuplicateDelivery(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, mode func(*ResponderOptions)) {
		exec := echoExec()
		r, _ := serveT(t, b, agentB, exec, mode)
		peer := newRawPeer(t, b)
		taskID, ctxID := uuid.NewString(), uuid.NewString()
		payload := sendReq(MethodSendMessage, taskID, ctxID, "once")
		peer.publish(agentB.RequestTopic(), payload, []byte("dup"))
		peer.publish(agentB.RequestTopic(), payload, []byte("dup"))
		peer.await(1, 5*time.Second)
		peer.publish(agentB.RequestTopic(), payload, []byte("retry"))
		replies := peer.await(2, 5*time.Second)
		if got := repliesByCorrelation(peer); got["dup"] != 1 || got["retry"] != 1 || len(got) != 2 {
			t.Fatalf("replies by correlation: %v, want the copy dropped and the retry answered", got)
		}
		for _, m := range replies {
			resp := decodeResp(t, m)
			if resp.Error != nil {
				t.Fatalf("answered with error: %s", m.Payload)
			}
			ev, err := decodeEvent(resp.Result)
			if err != nil {
				t.Fatal(err)
			}
			if task, ok := ev.(*a2a.Task); !ok || string(task.ID) != taskID {
				t.Fatalf("reply is not task %s: %s", taskID, m.Payload)
			}
		}
		if n := exec.runs.Load(); n != 1 {
			t.Fatalf("executor ran %d times for one Task.id/message, want 1", n)
		}
		if n := r.CopiesDropped(); n != 1 {
			t.Fatalf("copies dropped: %d, want 1", n)
		}
		list, err := r.Store().List(context.Background(), &a2a.ListTasksRequest{ContextID: ctxID})
		if err != nil || len(list.Tasks) != 1 {
			t.Fatalf("store holds %+v (%v), want exactly one task", list, err)
		}
	})
}

// TestRetryAfterDroppedReply loses the first reply on the requester side:
// the requester republishes with fresh Correlation Data and the same
// JSON-RPC id and Task.id; the responder dedupes by Task.id and answers
// with the task state instead of running it again.
func TestRetryAfterDroppedReply(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, mode func(*ResponderOptions)) {
		exec := echoExec()
		serveT(t, b, agentB, exec, mode)
		sniff := newSniffer(t, b, agentB.RequestTopic())
		req := requesterT(t, b, agentA, nil)
		var dropped sync.Once
		req.dropReply = func(p *paho.Publish) bool {
			drop := false
			dropped.Do(func() { drop = true })
			return drop
		}
		res, err := req.Transport(agentB).SendMessage(ctxT(t, 10*time.Second), nil, userText("retry me"))
		if err != nil {
			t.Fatalf("SendMessage with a dropped first reply: %v", err)
		}
		task := res.(*a2a.Task)
		if task.Status.State != a2a.TaskStateCompleted {
			t.Fatalf("state %s", task.Status.State)
		}
		reqs := sniff.wait(2, 5*time.Second)
		var ids [2]struct{ rpc, task, corr string }
		for i, m := range reqs[:2] {
			var env struct {
				ID     string `json:"id"`
				Params struct {
					Message struct {
						TaskID string `json:"taskId"`
					} `json:"message"`
				} `json:"params"`
			}
			_ = json.Unmarshal(m.Payload, &env)
			ids[i].rpc, ids[i].task, ids[i].corr = env.ID, env.Params.Message.TaskID, string(m.Properties.CorrelationData)
		}
		if ids[0].rpc != ids[1].rpc || ids[0].task != ids[1].task || ids[0].task != string(task.ID) {
			t.Fatalf("retry must keep JSON-RPC id and Task.id: %+v", ids)
		}
		if ids[0].corr == ids[1].corr {
			t.Fatal("retry reused Correlation Data")
		}
		if n := exec.runs.Load(); n != 1 {
			t.Fatalf("executor ran %d times, want 1 (dedupe by Task.id)", n)
		}
	})
}

// TestNoRetryAfterFirstStreamItem: once a stream item arrived the request
// is never republished; a stalled stream is recovered with GetTask.
func TestNoRetryAfterFirstStreamItem(t *testing.T) {
	b := brokertest.StartMochi(t)
	exec := &scriptExec{fn: func(ctx context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateWorking, nil), nil)
		time.Sleep(900 * time.Millisecond) // longer than the idle timeout below
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, nil), nil)
	}}
	serveT(t, b, agentB, exec, nil)
	sniff := newSniffer(t, b, agentB.RequestTopic())
	req := requesterT(t, b, agentA, func(o *RequesterOptions) {
		o.Retry.StreamIdleTimeout = 300 * time.Millisecond
		o.Retry.FirstReplyTimeout = 2 * time.Second
	})
	var states []a2a.TaskState
	var lastErr error
	for ev, err := range req.Transport(agentB).SendStreamingMessage(ctxT(t, 10*time.Second), nil, userText("stall")) {
		if err != nil {
			lastErr = err
			break
		}
		switch v := ev.(type) {
		case *a2a.TaskStatusUpdateEvent:
			states = append(states, v.Status.State)
		case *a2a.Task:
			states = append(states, v.Status.State)
		}
	}
	// working, then the GetTask snapshot (still working) and an idle error.
	if len(states) < 2 || states[0] != a2a.TaskStateWorking || lastErr == nil {
		t.Fatalf("states %v err %v", states, lastErr)
	}
	time.Sleep(200 * time.Millisecond)
	methods := sniff.methods()
	if len(methods) != 2 || methods[0] != MethodSendStreamingMessage || methods[1] != MethodGetTask {
		t.Fatalf("requests on the wire %v, want [SendStreamingMessage GetTask]", methods)
	}
}

// sniffer records requests on a topic (a passive extra subscriber).
type sniffer struct {
	t   *testing.T
	mu  sync.Mutex
	got []*paho.Publish
}

func newSniffer(t *testing.T, b brokertest.Broker, filter string) *sniffer {
	s := &sniffer{t: t}
	conn := connectT(t, b, AgentRef{Org: "acme", Unit: "ops", Agent: "sniffer-" + randomHex(3)}, nil)
	if _, err := conn.Subscribe(ctxT(t, 5*time.Second), filter, func(p *paho.Publish) {
		s.mu.Lock()
		s.got = append(s.got, p)
		s.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *sniffer) wait(n int, d time.Duration) []*paho.Publish {
	s.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		if len(s.got) >= n {
			out := append([]*paho.Publish(nil), s.got...)
			s.mu.Unlock()
			return out
		}
		s.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	s.t.Fatalf("sniffer saw %d messages, want %d", len(s.got), n)
	return nil
}

func (s *sniffer) methods() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, p := range s.got {
		var env struct {
			Method string `json:"method"`
		}
		_ = json.Unmarshal(p.Payload, &env)
		out = append(out, env.Method)
	}
	return out
}

// waitRuns blocks until the executor has started n executions.
func waitRuns(t *testing.T, e *scriptExec, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.runs.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("executor started %d executions, want %d", e.runs.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConversationErrorsUnwrap(t *testing.T) {
	raw := []byte(`{"code":-32061,"message":"context has 1 working task (limit 1)","data":{"a2a_error":"concurrency_limit","limit":1}}`)
	var e RPCError
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(&e, ErrConcurrencyLimit) || errors.Is(&e, a2a.ErrInternalError) {
		t.Fatalf("concurrency_limit must unwrap to ErrConcurrencyLimit, not an internal error: %v", e.Unwrap())
	}
}

// TestBindingCodesVsCoreA2A (issue 12 item 8): the profile's binding codes -32003/-32004/-32005
// are also A2A v1.0's PushNotificationNotSupported/UnsupportedOperation/ContentTypeNotSupported.
// error.data.a2a_error is what tells them apart: with it the error is the binding condition
// (retry rules of the profile), without it (no data, or a2a-go's typed-details array) the core
// A2A error.
func TestBindingCodesVsCoreA2A(t *testing.T) {
	typed := `[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"CONTENT_TYPE_NOT_SUPPORTED","domain":"a2a-protocol.org"}]`
	for _, tc := range []struct {
		name      string
		raw       string
		is, isNot error
		retryable bool
	}{
		{"-32005 with a2a_error is the binding's transport_protocol_error",
			`{"code":-32005,"message":"missing Task.id","data":{"a2a_error":"transport_protocol_error"}}`, ErrTransportProtocol, a2a.ErrUnsupportedContentType, false},
		{"-32005 with typed details is core A2A ContentTypeNotSupported",
			`{"code":-32005,"message":"image/png not supported","data":` + typed + `}`, a2a.ErrUnsupportedContentType, ErrTransportProtocol, false},
		{"-32005 without data is core A2A ContentTypeNotSupported",
			`{"code":-32005,"message":"image/png not supported"}`, a2a.ErrUnsupportedContentType, ErrTransportProtocol, false},
		{"-32004 with a2a_error is responder_unavailable (retry-eligible)",
			`{"code":-32004,"message":"overloaded","data":{"a2a_error":"responder_unavailable"}}`, ErrResponderUnavailable, a2a.ErrUnsupportedOperation, true},
		{"-32004 without a2a_error is UnsupportedOperation",
			`{"code":-32004,"message":"task is completed"}`, a2a.ErrUnsupportedOperation, ErrResponderUnavailable, false},
		{"-32003 with a2a_error is request_expired (retry-eligible)",
			`{"code":-32003,"message":"expired","data":{"a2a_error":"request_expired"}}`, ErrRequestExpired, a2a.ErrPushNotificationNotSupported, true},
		{"-32003 without a2a_error is PushNotificationNotSupported",
			`{"code":-32003,"message":"no push"}`, a2a.ErrPushNotificationNotSupported, ErrRequestExpired, false},
		{"an a2a_error that does not belong to the code is ignored",
			`{"code":-32005,"message":"odd","data":{"a2a_error":"request_expired"}}`, a2a.ErrUnsupportedContentType, ErrRequestExpired, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e RPCError
			if err := json.Unmarshal([]byte(tc.raw), &e); err != nil {
				t.Fatal(err)
			}
			if !errors.Is(&e, tc.is) || errors.Is(&e, tc.isNot) {
				t.Fatalf("unwraps to %v; want %v and not %v", e.Unwrap(), tc.is, tc.isNot)
			}
			if e.Retryable() != tc.retryable {
				t.Fatalf("Retryable() = %v", e.Retryable())
			}
			if binding := tc.is == ErrTransportProtocol || tc.is == ErrResponderUnavailable || tc.is == ErrRequestExpired; e.IsBindingError() != binding {
				t.Fatalf("IsBindingError() = %v", e.IsBindingError())
			}
		})
	}
	// What the responder sends for a binding error carries exactly that marker.
	sent := NewBindingError(A2AErrorTransportProtocolError, "x")
	if sent.Code != CodeTransportProtocolError || sent.A2AError() != A2AErrorTransportProtocolError {
		t.Fatalf("binding error on the wire: %+v", sent)
	}
}
