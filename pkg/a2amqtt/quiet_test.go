package a2amqtt_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/a2amqtttest"
)

// TestQuietReconnect (issue 9.7): an expected reconnect (the broker restarts) logs no WARN or
// ERROR, only INFO lines that say what happened; the agent serves again afterwards.
func TestQuietReconnect(t *testing.T) {
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
	logs := &a2amqtttest.Logs{}
	a, err := agents.Start(tctx(t, 10*time.Second), agents.KindEcho, agents.Options{BrokerURL: m.URL(), Agent: bRef, Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !logs.Has("mqtt connection restored") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	req := newRequester(t, m, aRef)
	res, err := req.Transport(bRef).SendMessage(tctx(t, 10*time.Second), nil, userText("after restart"))
	if err != nil || a2amqtt.ResultText(res) != "echo: after restart" {
		t.Fatalf("after the restart: %v", err)
	}
	if !logs.Has("mqtt connection lost; reconnecting") || !logs.Has("mqtt connection restored") {
		t.Fatalf("the reconnect is not reported at INFO: %v", logs.AtLeast(slog.LevelInfo))
	}
	if loud := logs.AtLeast(slog.LevelWarn); len(loud) > 0 {
		t.Fatalf("an expected reconnect logged WARN/ERROR: %v", loud)
	}
}
