package a2amqtt

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// executions records which task ids an executor ran (across processes of one agent).
type executions struct {
	mu  sync.Mutex
	ids []string
}

func (e *executions) add(id a2a.TaskID) {
	e.mu.Lock()
	e.ids = append(e.ids, string(id))
	e.mu.Unlock()
}

func (e *executions) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.ids)
}

// gatedExec completes "done: <text>" once release is closed; started receives each task id
// as its execution begins.
func gatedExec(runs *executions, started chan<- a2a.TaskID, release <-chan struct{}) *scriptExec {
	return &scriptExec{fn: func(ctx context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
		runs.add(ec.TaskID)
		if started != nil {
			started <- ec.TaskID
		}
		if release != nil {
			<-release
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("done: "+messageText(ec.Message)))), nil)
	}}
}

// repliesByCorrelation counts the replies a raw peer received per Correlation Data.
func repliesByCorrelation(p *rawPeer) map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for _, m := range p.got {
		out[string(m.Properties.CorrelationData)]++
	}
	return out
}

// waitFor polls cond (state another goroutine changes) until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGracefulDrain is the agent side of a rolling restart or a credential rotation (SIGTERM):
// Responder.Shutdown lets a request in flight finish and publish its reply before the Conn
// disconnects, and with a persistent session a request that arrives during the drain is left
// in the session for the next process. Every request is executed once and answered once,
// counted on the wire (replies per Correlation Data) and in the executors, on both brokers.
func TestGracefulDrain(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		me := AgentRef{Org: "acme", Unit: "ops", Agent: "drain-" + randomHex(3)}
		var runs executions
		started := make(chan a2a.TaskID, 4)
		release := make(chan struct{})
		connect := func() *Conn {
			c, err := Connect(ctxT(t, 10*time.Second), Config{BrokerURL: b.URL(), Agent: me, Card: testCard(me), SessionExpiry: time.Minute, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		oldConn := connect()
		old, err := NewResponder(ctxT(t, 10*time.Second), oldConn, ResponderOptions{Executor: gatedExec(&runs, started, release)})
		if err != nil {
			t.Fatal(err)
		}
		peer := newRawPeer(t, b)

		inFlight, arriving := uuid.NewString(), uuid.NewString()
		peer.publish(me.RequestTopic(), sendReq(MethodSendMessage, inFlight, "", "in flight"), []byte("in-flight"))
		if id := <-started; string(id) != inFlight {
			t.Fatalf("started %s, want %s", id, inFlight)
		}

		// SIGTERM: the drain begins while the first request runs.
		drained := make(chan error, 1)
		go func() { drained <- old.Shutdown(ctxT(t, 30*time.Second)) }()
		waitFor(t, 5*time.Second, "the drain to begin", old.closing.Load)

		// A request during the drain is delivered to the old process, which leaves it
		// unacknowledged in the session instead of running or refusing it.
		peer.publish(me.RequestTopic(), sendReq(MethodSendMessage, arriving, "", "during the drain"), []byte("arriving"))
		waitFor(t, 5*time.Second, "the old process to withhold the new request", func() bool { return oldConn.leftInSession.Load() == 1 })
		select {
		case err := <-drained:
			t.Fatalf("Shutdown returned before the request in flight finished: %v", err)
		default:
		}

		close(release)
		if err := <-drained; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		peer.await(1, 5*time.Second)
		if got := repliesByCorrelation(peer); got["in-flight"] != 1 || len(got) != 1 {
			t.Fatalf("replies after the drain: %v, want the request in flight answered", got)
		}
		if err := oldConn.Close(ctxT(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		<-oldConn.Done()
		if got := runs.list(); !slices.Equal(got, []string{inFlight}) {
			t.Fatalf("the old process ran %v, want only %s", got, inFlight)
		}

		// The next process gets the request that arrived during the drain from its session.
		newConn := connect()
		t.Cleanup(func() { _ = newConn.Close(context.Background()) })
		next, err := NewResponder(ctxT(t, 10*time.Second), newConn, ResponderOptions{Executor: gatedExec(&runs, nil, nil)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = next.Close(context.Background()) })
		peer.await(2, 10*time.Second)

		// Nothing more comes: no duplicate reply, no second execution.
		peer.publish(me.RequestTopic(), sendReq(MethodSendMessage, uuid.NewString(), "", "sentinel"), []byte("sentinel"))
		peer.await(3, 10*time.Second)
		got := repliesByCorrelation(peer)
		if got["in-flight"] != 1 || got["arriving"] != 1 || got["sentinel"] != 1 || len(got) != 3 {
			t.Fatalf("replies per request: %v, want each exactly once", got)
		}
		for _, m := range peer.got {
			if r := decodeResp(t, m); r.Error != nil {
				t.Fatalf("reply %s is an error: %s", m.Properties.CorrelationData, m.Payload)
			}
		}
		if got := runs.list(); len(got) != 3 || got[0] != inFlight || got[1] != arriving {
			t.Fatalf("executions: %v, want %s, %s and the sentinel once each", got, inFlight, arriving)
		}
	})
}

// TestGracefulDrainCleanSession: without a persistent session nothing can keep a request for
// the next process. The drain still answers the request in flight exactly once; the broker
// subscription goes first, so a new request finds no subscriber (PUBACK 0x10, which the
// requester reports as ErrNoSubscribers) instead of being taken and dropped.
func TestGracefulDrainCleanSession(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		me := AgentRef{Org: "acme", Unit: "ops", Agent: "drain-clean-" + randomHex(3)}
		var runs executions
		started := make(chan a2a.TaskID, 4)
		release := make(chan struct{})
		conn := connectT(t, b, me, testCard(me))
		r, err := NewResponder(ctxT(t, 10*time.Second), conn, ResponderOptions{Executor: gatedExec(&runs, started, release)})
		if err != nil {
			t.Fatal(err)
		}
		peer := newRawPeer(t, b)
		inFlight := uuid.NewString()
		peer.publish(me.RequestTopic(), sendReq(MethodSendMessage, inFlight, "", "in flight"), []byte("in-flight"))
		<-started
		drained := make(chan error, 1)
		go func() { drained <- r.Shutdown(ctxT(t, 30*time.Second)) }()
		waitFor(t, 5*time.Second, "the drain to begin", r.closing.Load)
		close(release)
		if err := <-drained; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		resp, err := peer.conn.Publish(ctxT(t, 5*time.Second), &paho.Publish{Topic: me.RequestTopic(), QoS: 1,
			Payload:    sendReq(MethodSendMessage, uuid.NewString(), "", "after"),
			Properties: &paho.PublishProperties{ResponseTopic: peer.reply, CorrelationData: []byte("after")}})
		if err != nil {
			t.Fatal(err)
		}
		// Mosquitto says nobody subscribes; mochi 2.7.9 acknowledges 0x00 either way.
		if b.Name() == "mosquitto" && resp.ReasonCode != reasonNoMatchingSubscribers {
			t.Errorf("PUBACK of a request after the drain: %#x, want 0x10 (no subscribers)", resp.ReasonCode)
		}
		peer.await(1, 5*time.Second)
		time.Sleep(300 * time.Millisecond) // a window for a wrong reply to "after" to show up
		if got := repliesByCorrelation(peer); got["in-flight"] != 1 || len(got) != 1 {
			t.Fatalf("replies: %v, want only the request in flight, once", got)
		}
		if got := runs.list(); !slices.Equal(got, []string{inFlight}) {
			t.Fatalf("executions: %v", got)
		}
	})
}
