package a2amqtt_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// recordingHandler keeps every log record.
type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Clone())
	h.mu.Unlock()
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordingHandler) atLeast(level slog.Level) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.records {
		if r.Level >= level {
			line := r.Level.String() + " " + r.Message
			r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
			out = append(out, line)
		}
	}
	return out
}

func (h *recordingHandler) has(msg string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if strings.Contains(r.Message, msg) {
			return true
		}
	}
	return false
}

// TestQuietReconnect (issue 9.7): an expected reconnect (the broker restarts) logs no WARN or
// ERROR, only INFO lines that say what happened; the agent serves again afterwards.
func TestQuietReconnect(t *testing.T) {
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
	logs := &recordingHandler{}
	a, err := agents.Start(tctx(t, 10*time.Second), agents.KindEcho, agents.Options{BrokerURL: m.URL(), Agent: bRef, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !logs.has("mqtt connection restored") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	req := newRequester(t, m, aRef)
	res, err := req.Transport(bRef).SendMessage(tctx(t, 10*time.Second), nil, userText("after restart"))
	if err != nil || a2amqtt.ResultText(res) != "echo: after restart" {
		t.Fatalf("after the restart: %v", err)
	}
	if !logs.has("mqtt connection lost; reconnecting") || !logs.has("mqtt connection restored") {
		t.Fatalf("the reconnect is not reported at INFO: %v", logs.atLeast(slog.LevelInfo))
	}
	if loud := logs.atLeast(slog.LevelWarn); len(loud) > 0 {
		t.Fatalf("an expected reconnect logged WARN/ERROR: %v", loud)
	}
}
