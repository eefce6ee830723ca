package a2amqtt

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// TestRequestDeliveredAgainRunsOnce, on both brokers: the kick of a credentials rotation seen from
// a responder with a persistent session. The responder receives a request and runs it, but its
// PUBACK and its reply never reach the broker (the relay swallows them) before the connection is
// cut. The broker then resends the request to the resumed session, and paho resends the reply.
// The request must run once and be answered once: the responder drops the copy (before, the copy
// was answered a second time from the task store). A copy from the publisher's side:
// TestQoS1DuplicateDelivery.
func TestRequestDeliveredAgainRunsOnce(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		ctx := ctxT(t, 30*time.Second)
		rl := startRelay(t, b.Addr())
		me := AgentRef{Org: "acme", Unit: "ops", Agent: "again-" + randomHex(3)}
		conn, err := Connect(ctx, Config{BrokerURL: "mqtt://" + rl.addr(), Agent: me, SessionExpiry: time.Minute, Logger: testLogger(t), KeepAlive: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		var runs executions
		started := make(chan a2a.TaskID, 4)
		release := make(chan struct{})
		resp, err := NewResponder(ctx, conn, ResponderOptions{Executor: gatedExec(&runs, started, release)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Close(context.Background()) })
		peer := newRawPeer(t, b)

		rl.hold()
		first := uuid.NewString()
		peer.publish(me.RequestTopic(), sendReq(MethodSendMessage, first, "", "once"), []byte("once"))
		if id := <-started; string(id) != first {
			t.Fatalf("started %s, want %s", id, first)
		}
		waitFor(t, 5*time.Second, "the PUBACK swallowed", func() bool { return rl.swallowed() > 0 })
		acked := rl.swallowed()
		close(release)
		waitFor(t, 5*time.Second, "the reply swallowed", func() bool { return rl.swallowed() > acked })
		rl.cut()

		peer.await(1, 15*time.Second)
		// The broker resends on the resumed session before anything newer: once the sentinel is
		// answered, the copy has been through the responder.
		sentinel := uuid.NewString()
		peer.publish(me.RequestTopic(), sendReq(MethodSendMessage, sentinel, "", "sentinel"), []byte("sentinel"))
		peer.await(2, 10*time.Second)
		if got := repliesByCorrelation(peer); got["once"] != 1 || got["sentinel"] != 1 || len(got) != 2 {
			t.Fatalf("replies: %v, want each request answered once", got)
		}
		if got := runs.list(); !slices.Equal(got, []string{first, sentinel}) {
			t.Fatalf("runs: %v, want %s then %s, once each", got, first, sentinel)
		}
		if n := resp.CopiesDropped(); n != 1 {
			t.Fatalf("copies dropped: %d, want 1", n)
		}
	})
}
