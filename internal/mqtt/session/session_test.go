package session_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/session"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/a2amqtttest"
)

// A session outlives broker restarts: it reconnects by itself, renews its subscriptions before
// it is used again, runs OnReady once per connection, and its health says the truth (down
// beyond the grace period fails, naming how long).
func TestSessionReconnectsAndReportsHealth(t *testing.T) {
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan string, 16)
	var readies, downs atomic.Int32
	s, err := session.Start(ctx, session.Config{
		Name: "test", URL: m.URL(), ClientID: "session-test",
		Subscriptions: []paho.SubscribeOptions{{Topic: "t/#", QoS: 1}},
		OnMessage:     func(p *paho.Publish) { got <- string(p.Payload) },
		OnReady:       func(context.Context, *session.Link) { readies.Add(1) },
		OnDown:        func() { downs.Add(1) },
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	wait, done := context.WithTimeout(ctx, 10*time.Second)
	defer done()
	if _, err := s.Await(wait); err != nil {
		t.Fatal(err)
	}
	if err := s.Healthy(0); err != nil {
		t.Fatalf("healthy while connected: %v", err)
	}
	if pr, err := s.Publish(wait, &paho.Publish{Topic: "t/1", QoS: 1, Payload: []byte("one")}); err != nil || pr.ReasonCode >= 0x80 {
		t.Fatalf("publish: %v %v", pr, err)
	}
	if p := <-got; p != "one" {
		t.Fatalf("got %q", p)
	}

	m.Stop()
	// Down: healthy within the grace, unhealthy beyond it.
	deadline := time.Now().Add(10 * time.Second)
	for s.Healthy(time.Hour) != nil || s.Healthy(0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("health while down: grace=1h %v, grace=0 %v", s.Healthy(time.Hour), s.Healthy(0))
		}
		time.Sleep(20 * time.Millisecond) // polling the drop being noticed
	}
	if err := s.Healthy(0); !strings.Contains(err.Error(), "connection down for") {
		t.Errorf("health error does not say how long the connection is down: %v", err)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	// Publish waits for the reconnect; the subscription is renewed before.
	if pr, err := s.Publish(wait, &paho.Publish{Topic: "t/2", QoS: 1, Payload: []byte("two")}); err != nil || pr.ReasonCode >= 0x80 {
		t.Fatalf("publish after the restart: %v %v", pr, err)
	}
	if p := <-got; p != "two" {
		t.Fatalf("got %q after the restart", p)
	}
	if readies.Load() != 2 || downs.Load() != 1 {
		t.Errorf("OnReady ran %d times and OnDown %d times, want 2 and 1", readies.Load(), downs.Load())
	}
	cancel()
	<-s.Done()
	if err := s.Healthy(time.Hour); err == nil {
		t.Error("a closed session reports healthy")
	}
}

// Health before the first connection: not connected is fine during the grace, then fails.
func TestSessionNeverConnected(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := session.Start(ctx, session.Config{Name: "test", URL: "mqtt://127.0.0.1:1", ClientID: "x", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Healthy(time.Hour); err != nil {
		t.Errorf("within the grace: %v", err)
	}
	if err := s.Healthy(0); err == nil || !strings.Contains(err.Error(), "not connected after") {
		t.Errorf("beyond the grace: %v", err)
	}
	// Once an attempt has failed (the first one may still be under way on a loaded machine),
	// Await's error names it.
	var err2 error
	for range 20 {
		wait, done := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err2 = s.Await(wait)
		done()
		if err2 != nil && strings.Contains(err2.Error(), "last attempt") {
			return
		}
	}
	t.Errorf("Await names the last connect error: %v", err2)
}

// The operator's connections use the SDK's autopaho setup (a2amqtt.ClientSetup), so they log
// like the SDK: a broker restart is INFO ("mqtt connection lost; reconnecting", "mqtt
// connection restored"), never WARN or ERROR; and the password is asked for at every attempt.
func TestSessionQuietReconnectWithSharedSetup(t *testing.T) {
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &a2amqtttest.Logs{}
	var asked atomic.Int32
	s, err := session.Start(ctx, session.Config{
		Name: "quiet", URL: m.URL(), ClientID: "session-quiet",
		Password: func() []byte { asked.Add(1); return nil },
		Logger:   logs.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	wait, done := context.WithTimeout(ctx, 20*time.Second)
	defer done()
	if _, err := s.Await(wait); err != nil {
		t.Fatal(err)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if pr, err := s.Publish(wait, &paho.Publish{Topic: "t/after", QoS: 1}); err != nil || pr.ReasonCode >= 0x80 {
		t.Fatalf("publish after the restart: %v %v", pr, err)
	}
	for !logs.Has("mqtt connection restored") {
		if wait.Err() != nil {
			t.Fatalf("no restore logged: %v", logs.AtLeast(slog.LevelDebug))
		}
		time.Sleep(10 * time.Millisecond) // the log line follows the reconnect the publish waited for
	}
	if logs.Count(slog.LevelInfo, "mqtt connection lost; reconnecting") != 1 {
		t.Errorf("the drop is not logged once at INFO: %v", logs.AtLeast(slog.LevelDebug))
	}
	if loud := logs.AtLeast(slog.LevelWarn); len(loud) > 0 {
		t.Errorf("an expected reconnect logged WARN/ERROR: %v", loud)
	}
	if asked.Load() < 2 {
		t.Errorf("the password was asked for %d times over two connections", asked.Load())
	}
}
