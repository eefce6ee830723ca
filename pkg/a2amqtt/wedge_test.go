package a2amqtt_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TestWedgeDetectionAndPanicRecovery covers the other ways a client could wedge on autopaho's
// goroutines: a handler that panics (recovered: the connection keeps delivering) and a handler
// that blocks the receive loop (reported by Alive and /healthz, so a liveness probe restarts a
// process that cannot recover by itself; readiness is not affected by it).
func TestWedgeDetectionAndPanicRecovery(t *testing.T) {
	b := brokertest.StartMochi(t)
	me := a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "wedge"}
	conn, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{BrokerURL: b.URL(), Agent: me, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	pub, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{BrokerURL: b.URL(), Agent: aRef, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(context.Background()) })
	send := func(topic, text string) {
		if _, err := pub.Publish(tctx(t, 5*time.Second), &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(text)}); err != nil {
			t.Fatal(err)
		}
	}

	// A panicking handler: recovered, and the next message is delivered.
	panicky := me.ReplyTopic("panic")
	c := newCollector()
	if _, err := conn.Subscribe(tctx(t, 5*time.Second), panicky, func(p *paho.Publish) {
		if string(p.Payload) == "boom" {
			panic("handler bug")
		}
		c.handle(p)
	}); err != nil {
		t.Fatal(err)
	}
	send(panicky, "boom")
	send(panicky, "after")
	if got := c.waitN(1, 5*time.Second); len(got) != 1 || got[0] != "after" {
		t.Fatalf("after a handler panic: %v", got)
	}

	// A blocking handler: Alive and /healthz report it; /readyz does not.
	addr, err := a2amqtt.ServeHealth(tctx(t, time.Minute), "127.0.0.1:0", conn, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr.(*net.TCPAddr).String()
	if err := conn.Alive(time.Second); err != nil {
		t.Fatalf("Alive before blocking: %v", err)
	}
	blocking := me.ReplyTopic("block")
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	if _, err := conn.Subscribe(tctx(t, 5*time.Second), blocking, func(*paho.Publish) {
		entered <- struct{}{}
		<-release
	}); err != nil {
		t.Fatal(err)
	}
	send(blocking, "stuck")
	<-entered
	deadline := time.Now().Add(5 * time.Second)
	for conn.Alive(100*time.Millisecond) == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := conn.Alive(100 * time.Millisecond); err == nil || !strings.Contains(err.Error(), blocking) {
		t.Fatalf("Alive with a blocked handler: %v", err)
	}
	if code, body := probe(t, base, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with a blocked handler: %d %s", code, body)
	}
	close(release)
	deadline = time.Now().Add(5 * time.Second)
	for conn.Alive(100*time.Millisecond) != nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := conn.Alive(100 * time.Millisecond); err != nil {
		t.Fatalf("Alive after the handler returned: %v", err)
	}
	if code, body := probe(t, base, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz after the handler returned: %d %s", code, body)
	}
}

// TestCloseWhileBrokerDown: Close of an agent (presence on) returns at once while the broker
// is away; it used to wait for a reconnect to publish the offline card, for ever with a
// context without deadline (a shutdown hanging as long as the outage).
func TestCloseWhileBrokerDown(t *testing.T) {
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
	a, err := agents.Start(tctx(t, 10*time.Second), agents.KindEcho, agents.Options{BrokerURL: m.URL(), Agent: bRef, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	m.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for a.Conn.Healthy(0) == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	done := make(chan error, 1)
	go func() { done <- a.Close(context.Background()) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs while the broker is down")
	}
}
