package a2amqtt

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// fastRetry keeps retry tests inside the package's time budget.
var fastRetry = RetryPolicy{FirstReplyTimeout: 700 * time.Millisecond, StreamIdleTimeout: 3 * time.Second, MaxAttempts: 3, BackoffBase: 50 * time.Millisecond}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func connectT(t testing.TB, b brokertest.Broker, ref AgentRef, card *a2a.AgentCard) *Conn {
	t.Helper()
	c, err := Connect(ctxT(t, 10*time.Second), Config{BrokerURL: b.URL(), Agent: ref, Card: card, Logger: testLogger(t), KeepAlive: 5 * time.Second})
	if err != nil {
		t.Fatalf("connect %s: %v", ref, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func serveT(t testing.TB, b brokertest.Broker, ref AgentRef, exec a2asrv.AgentExecutor, mod func(*ResponderOptions)) (*Responder, *Conn) {
	t.Helper()
	conn := connectT(t, b, ref, testCard(ref))
	opts := ResponderOptions{Executor: exec}
	if mod != nil {
		mod(&opts)
	}
	r, err := NewResponder(ctxT(t, 10*time.Second), conn, opts)
	if err != nil {
		t.Fatalf("responder %s: %v", ref, err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r, conn
}

func requesterT(t testing.TB, b brokertest.Broker, ref AgentRef, mod func(*RequesterOptions)) *Requester {
	t.Helper()
	conn := connectT(t, b, ref, nil)
	opts := RequesterOptions{Retry: fastRetry}
	if mod != nil {
		mod(&opts)
	}
	r, err := NewRequester(ctxT(t, 10*time.Second), conn, opts)
	if err != nil {
		t.Fatalf("requester: %v", err)
	}
	return r
}

func testCard(ref AgentRef) *a2a.AgentCard {
	return &a2a.AgentCard{
		Name:                ref.Agent,
		Description:         "test agent " + ref.String(),
		Version:             "0.0.1",
		SupportedInterfaces: []*a2a.AgentInterface{AgentInterface("mqtt://broker", ref)},
		Capabilities:        a2a.AgentCapabilities{Streaming: true},
		DefaultInputModes:   []string{"text/plain"},
		DefaultOutputModes:  []string{"text/plain"},
	}
}

func userText(text string) *a2a.SendMessageRequest {
	return &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))}
}

func messageText(m *a2a.Message) string {
	if m == nil {
		return ""
	}
	var b strings.Builder
	for _, p := range m.Parts {
		b.WriteString(p.Text())
	}
	return b.String()
}

// scriptExec is a test executor driven by a function of the request; it
// counts executions so dedupe tests can assert "ran once".
type scriptExec struct {
	runs atomic.Int64
	fn   func(ctx context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool)
}

func (e *scriptExec) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	e.runs.Add(1)
	return func(yield func(a2a.Event, error) bool) { e.fn(ctx, ec, yield) }
}

func (e *scriptExec) Cancel(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

// echoExec works, streams one artifact and completes with "echo: <text>".
func echoExec() *scriptExec {
	return &scriptExec{fn: func(ctx context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
		text := messageText(ec.Message)
		if !yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateWorking, nil), nil) {
			return
		}
		if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart("echo: "+text)), nil) {
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted,
			a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("echo: "+text))), nil)
	}}
}

// forEachMode runs fn on both brokers with both responder handlers: a2a-go's
// default request handler and NewDirectHandler.
func forEachMode(t *testing.T, fn func(t *testing.T, b brokertest.Broker, mode func(*ResponderOptions))) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		for _, direct := range []bool{false, true} {
			name := "a2a-go-handler"
			if direct {
				name = "direct-handler"
			}
			t.Run(name, func(t *testing.T) {
				fn(t, b, func(o *ResponderOptions) { o.ReferenceHandler = !direct })
			})
		}
	})
}

func decodeEvent(raw json.RawMessage) (a2a.Event, error) {
	var sr a2a.StreamResponse
	if err := json.Unmarshal(raw, &sr); err != nil {
		return nil, fmt.Errorf("a2amqtt: reply result is not an A2A stream response: %w", err)
	}
	return sr.Event, nil
}
