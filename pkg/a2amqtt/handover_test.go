package a2amqtt

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// fakeResponder answers every request on topic with a completed task for
// the request's Task.id, adding the given user properties. Before that it
// sends decoy replies with unknown and with missing Correlation Data, which
// the requester must ignore.
func fakeResponder(t *testing.T, b brokertest.Broker, ref AgentRef, topic string, user paho.UserProperties) {
	t.Helper()
	conn := connectT(t, b, ref, nil)
	if _, err := conn.Subscribe(ctxT(t, 5*time.Second), topic, func(p *paho.Publish) {
		var env struct {
			ID     string `json:"id"`
			Params struct {
				ID      string `json:"id"`
				Message struct {
					TaskID    string `json:"taskId"`
					ContextID string `json:"contextId"`
				} `json:"message"`
			} `json:"params"`
		}
		_ = json.Unmarshal(p.Payload, &env)
		id := env.Params.Message.TaskID
		if id == "" {
			id = env.Params.ID
		}
		ctxID := env.Params.Message.ContextID
		if ctxID == "" {
			ctxID = "ctx"
		}
		task := &a2a.Task{ID: a2a.TaskID(id), ContextID: ctxID, Status: a2a.TaskStatus{State: a2a.TaskStateCompleted}}
		result, _ := json.Marshal(a2a.StreamResponse{Event: task})
		body, _ := json.Marshal(rpcResponse{JSONRPC: "2.0", ID: env.ID, Result: result})
		// A decoy with a different outcome: accepting it would fail the test.
		decoyTask := *task
		decoyTask.Status.State = a2a.TaskStateFailed
		decoyResult, _ := json.Marshal(a2a.StreamResponse{Event: &decoyTask})
		decoy, _ := json.Marshal(rpcResponse{JSONRPC: "2.0", ID: env.ID, Result: decoyResult})
		respTo, corr := p.Properties.ResponseTopic, p.Properties.CorrelationData
		go func() {
			ctx := ctxT(t, 5*time.Second)
			_, _ = conn.Publish(ctx, &paho.Publish{Topic: respTo, QoS: 1, Payload: decoy, Properties: &paho.PublishProperties{CorrelationData: []byte("unknown-correlation")}})
			_, _ = conn.Publish(ctx, &paho.Publish{Topic: respTo, QoS: 1, Payload: decoy})
			_, _ = conn.Publish(ctx, &paho.Publish{Topic: respTo, QoS: 1, Payload: body, Properties: &paho.PublishProperties{CorrelationData: corr, User: user}})
		}()
	}); err != nil {
		t.Fatal(err)
	}
}

// TestHandover: a reply naming another agent in a2a-responder-agent-id
// reroutes follow-ups for that task to the named agent's direct topic.
func TestHandover(t *testing.T) {
	b := brokertest.StartMochi(t)
	agentC := AgentRef{Org: "acme", Unit: "ops", Agent: "agent-c"}
	fakeResponder(t, b, agentB, agentB.RequestTopic(), paho.UserProperties{{Key: PropResponderAgentID, Value: agentC.Agent}})
	fakeResponder(t, b, agentC, agentC.RequestTopic(), nil)
	sniff := newSniffer(t, b, "$a2a/v1/request/acme/ops/+")
	req := requesterT(t, b, agentA, nil)
	tr := req.Transport(agentB)
	res, err := tr.SendMessage(ctxT(t, 5*time.Second), nil, userText("hand me over"))
	if err != nil {
		t.Fatal(err)
	}
	task := res.(*a2a.Task)
	if task.Status.State != a2a.TaskStateCompleted {
		t.Fatalf("accepted a reply with unknown/missing Correlation Data: state %s", task.Status.State)
	}
	if who, _ := req.ResponderFor(task.ID); who != agentC.Agent {
		t.Fatalf("responder for %s = %q, want %q", task.ID, who, agentC.Agent)
	}
	if _, err := tr.GetTask(ctxT(t, 5*time.Second), nil, &a2a.GetTaskRequest{ID: task.ID}); err != nil {
		t.Fatal(err)
	}
	got := sniff.wait(2, 3*time.Second)
	if got[0].Topic != agentB.RequestTopic() || got[1].Topic != agentC.RequestTopic() {
		t.Fatalf("topics %s, %s; want follow-up on %s", got[0].Topic, got[1].Topic, agentC.RequestTopic())
	}
}

// TestPooledReplyWithoutResponderID: a pooled reply lacking
// a2a-responder-agent-id is a protocol error (-32005), not a result.
func TestPooledReplyWithoutResponderID(t *testing.T) {
	b := brokertest.StartMochi(t)
	pool := PoolRef{Org: "acme", Unit: "ops", Pool: "p"}
	fakeResponder(t, b, AgentRef{Org: "acme", Unit: "ops", Agent: "bad-member"}, pool.SharedSubscription(), nil)
	req := requesterT(t, b, agentA, nil)
	_, err := req.PoolTransport(pool).SendMessage(ctxT(t, 5*time.Second), nil, userText("x"))
	var rpcErr *RPCError
	if !errors.As(err, &rpcErr) || rpcErr.A2AError() != A2AErrorTransportProtocolError || !errors.Is(err, ErrTransportProtocol) {
		t.Fatalf("want transport_protocol_error, got %v", err)
	}
}

// TestDirectoryFollowsTheLatestCard: a discovery topic retains one message, so the effective
// presence is the latest card's, whoever published it. An agent that reconnects after the
// operator's broker-sourced "offline" card publishes its own "online" card: it is online (the
// Directory used to keep the broker's "offline", issue 26's "marked offline (source broker)"
// for a connected agent). The operator republishes the broker's view when it disagrees with the
// retained card, so a broker status that comes later wins in turn.
func TestDirectoryFollowsTheLatestCard(t *testing.T) {
	b := brokertest.StartMochi(t)
	conn := connectT(t, b, agentA, nil)
	dir, err := NewDirectory(ctxT(t, 5*time.Second), conn, DirectoryFilter("acme"))
	if err != nil {
		t.Fatal(err)
	}
	card, _ := json.Marshal(testCard(agentB))
	pub := func(status, source string) {
		t.Helper()
		if _, err := conn.Publish(ctxT(t, 5*time.Second), &paho.Publish{Topic: agentB.DiscoveryTopic(), QoS: 1, Retain: true, Payload: card,
			Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: PropStatus, Value: status}, {Key: PropStatusSource, Value: source}}}}); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(want Presence) {
		t.Helper()
		if err := dir.Wait(ctxT(t, 3*time.Second), func(d *Directory) bool {
			e, ok := d.Get(agentB)
			return ok && e.Presence == want
		}); err != nil {
			e, _ := dir.Get(agentB)
			t.Fatalf("want %+v, have %+v", want, e.Presence)
		}
	}
	pub(StatusOffline, SourceBroker) // the registration card
	wait(Presence{Status: StatusOffline, Source: SourceBroker})
	pub(StatusOnline, SourceAgent) // the agent connected
	wait(Presence{Status: StatusOnline, Source: SourceAgent})
	if e, _ := dir.Get(agentB); e.Broker.Status != StatusOffline || e.Reported.Status != StatusOnline {
		t.Fatalf("the latest of each source: %+v", e)
	}
	pub(StatusOffline, SourceBroker) // the broker saw it go (a kick: no Will)
	wait(Presence{Status: StatusOffline, Source: SourceBroker})
	// Retained delete: unregistered.
	if _, err := conn.Publish(ctxT(t, 5*time.Second), &paho.Publish{Topic: agentB.DiscoveryTopic(), QoS: 1, Retain: true}); err != nil {
		t.Fatal(err)
	}
	if err := dir.Wait(ctxT(t, 3*time.Second), func(d *Directory) bool { _, ok := d.Get(agentB); return !ok }); err != nil {
		t.Fatal("unregistered agent still listed")
	}
}
