package a2amqtt

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/google/uuid"
)

// seedContext stores turns completed tasks in one context (a user message, an agent message and
// an artifact each, ~100 bytes of text) and returns the context id.
func seedContext(b *testing.B, store *MemoryStore, turns int) string {
	b.Helper()
	ctxID := uuid.NewString()
	for i := range turns {
		id := a2a.TaskID(uuid.NewString())
		now := time.Now().Add(time.Duration(i) * time.Millisecond)
		user := &a2a.Message{ID: uuid.NewString(), TaskID: id, ContextID: ctxID, Role: a2a.MessageRoleUser, Parts: a2a.ContentParts{a2a.NewTextPart(fmt.Sprintf("turn %d: what about the order from last week, can you check it?", i))}}
		agent := &a2a.Message{ID: uuid.NewString(), TaskID: id, ContextID: ctxID, Role: a2a.MessageRoleAgent, Parts: a2a.ContentParts{a2a.NewTextPart(fmt.Sprintf("turn %d: the order shipped on Tuesday and arrives on Friday.", i))}}
		task := &a2a.Task{ID: id, ContextID: ctxID, History: []*a2a.Message{user}, Status: a2a.TaskStatus{State: a2a.TaskStateCompleted, Message: agent, Timestamp: &now},
			Artifacts: []*a2a.Artifact{{ID: a2a.ArtifactID(uuid.NewString()), Parts: a2a.ContentParts{a2a.NewTextPart("tracking: ZX81-" + fmt.Sprint(i))}}}}
		if _, err := store.Create(context.Background(), task); err != nil {
			b.Fatal(err)
		}
	}
	return ctxID
}

// BenchmarkInputsOf is what the three inputs cost an executor, per call, in a context with 10
// earlier turns: read from the responder's own task store (in process), and fetched from a
// history service over the broker (a ListTasks round trip to an SDK responder holding the
// context, as the conversation service does for governed agents), the latter interleaved with
// a plain SendMessage round trip on the same broker for scale. docs/benchmarks.md (SDK).
func BenchmarkInputsOf(b *testing.B) {
	const turns = 10
	b.Run("task-store", func(b *testing.B) {
		store := NewMemoryStore()
		ctxID := seedContext(b, store, turns)
		ctx := context.WithValue(context.Background(), scopeKey{}, &inputsConfig{store: store, length: DefaultHistoryLength})
		ec := &a2asrv.ExecutorContext{ContextID: ctxID, TaskID: "current", Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("and now?"))}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			in, err := InputsOf(ctx, ec)
			if err != nil || len(in.Evidence) != 2*turns || len(in.Receipts) != turns {
				b.Fatalf("%v: %d evidence, %d receipts", err, len(in.Evidence), len(in.Receipts))
			}
		}
	})
	b.Run("history-service", func(b *testing.B) {
		m, _ := benchAddr(b)
		historian := AgentRef{Org: "acme", Unit: "ops", Agent: "historian"}
		store := NewMemoryStore()
		ctxID := seedContext(b, store, turns)
		serveT(b, m, historian, echoExec(), func(o *ResponderOptions) { o.TaskStore = store })
		serveT(b, m, agentB, echoExec(), nil)
		req := requesterT(b, m, agentA, func(o *RequesterOptions) { o.Retry = RetryPolicy{FirstReplyTimeout: 5 * time.Second} })
		ctx := context.WithValue(context.Background(), scopeKey{}, &inputsConfig{history: req.Transport(historian), length: DefaultHistoryLength})
		ec := &a2asrv.ExecutorContext{ContextID: ctxID, TaskID: "current", Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("and now?"))}
		send := req.Transport(agentB)
		var fetch, rt []time.Duration
		b.ResetTimer()
		for b.Loop() {
			t0 := time.Now()
			in, err := InputsOf(ctx, ec)
			t1 := time.Now()
			if err != nil || len(in.Evidence) != 2*turns || in.Source != SourceHistoryService {
				b.Fatalf("%v: %d evidence from %s", err, len(in.Evidence), in.Source)
			}
			if _, err := send.SendMessage(context.Background(), nil, userText("ping")); err != nil {
				b.Fatal(err)
			}
			fetch, rt = append(fetch, t1.Sub(t0)), append(rt, time.Since(t1))
		}
		b.StopTimer()
		fp50, sp50 := percentile(fetch, 0.5), percentile(rt, 0.5)
		b.ReportMetric(us(fp50), "fetch-p50-µs")
		b.ReportMetric(us(percentile(fetch, 0.99)), "fetch-p99-µs")
		b.ReportMetric(us(sp50), "sendmessage-p50-µs")
		b.ReportMetric(float64(fp50)/float64(sp50), "fetch/sendmessage")
		reportLoad(b)
	})
}
