package a2amqtt_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

func attrOf(s tracetest.SpanStub, key attribute.Key) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.AsString()
		}
	}
	return ""
}

func findSpan(spans tracetest.SpanStubs, name string, kind trace.SpanKind) (tracetest.SpanStub, bool) {
	for _, s := range spans {
		if s.Name == name && s.SpanKind == kind {
			return s, true
		}
	}
	return tracetest.SpanStub{}, false
}

// TestTracingAcrossTheBroker: the requester's span context travels in the request's
// traceparent user property; the responder continues the same trace in a server span and runs
// the executor in a child span, with the a2a/mqtt attributes on each. One trace id from the
// caller's root span to the executor, over a real broker, with both request handlers.
func TestTracingAcrossTheBroker(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, direct bool) {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

		agentConn, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{BrokerURL: b.URL(), Agent: bRef, Logger: quiet(), TracerProvider: tp})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = agentConn.Close(context.Background()) })
		exec, _ := agents.Executor(agents.KindEcho, 0)
		resp, err := a2amqtt.NewResponder(tctx(t, 10*time.Second), agentConn, a2amqtt.ResponderOptions{Executor: exec, ReferenceHandler: !direct})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Close(context.Background()) })

		conn, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{BrokerURL: b.URL(), Agent: aRef, Logger: quiet(), TracerProvider: tp})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		req, err := a2amqtt.NewRequester(tctx(t, 5*time.Second), conn, a2amqtt.RequesterOptions{Retry: fast})
		if err != nil {
			t.Fatal(err)
		}
		ctx, root := tp.Tracer("test").Start(tctx(t, 10*time.Second), "user action")
		res, err := req.Transport(bRef).SendMessage(ctx, nil, userText("traced"))
		root.End()
		if err != nil {
			t.Fatal(err)
		}
		task := asTask(t, res)

		var spans tracetest.SpanStubs
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			spans = exp.GetSpans()
			if _, ok := findSpan(spans, a2amqtt.SpanExecute, trace.SpanKindInternal); ok {
				if _, ok := findSpan(spans, "a2a.SendMessage", trace.SpanKindServer); ok {
					break
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		client, ok := findSpan(spans, "a2a.SendMessage", trace.SpanKindClient)
		if !ok {
			t.Fatalf("no client span; spans: %v", names(spans))
		}
		server, ok := findSpan(spans, "a2a.SendMessage", trace.SpanKindServer)
		if !ok {
			t.Fatalf("no server span; spans: %v", names(spans))
		}
		execSpan, ok := findSpan(spans, a2amqtt.SpanExecute, trace.SpanKindInternal)
		if !ok {
			t.Fatalf("no executor span; spans: %v", names(spans))
		}
		traceID := root.SpanContext().TraceID()
		for _, s := range []tracetest.SpanStub{client, server, execSpan} {
			if s.SpanContext.TraceID() != traceID {
				t.Fatalf("span %s (%s) in trace %s, want the caller's trace %s", s.Name, s.SpanKind, s.SpanContext.TraceID(), traceID)
			}
		}
		if client.Parent.SpanID() != root.SpanContext().SpanID() {
			t.Fatal("client span is not a child of the caller's span")
		}
		if !server.Parent.IsRemote() || server.Parent.SpanID() != client.SpanContext.SpanID() {
			t.Fatalf("server span's parent %v, want the client span %v (remote)", server.Parent, client.SpanContext.SpanID())
		}
		if execSpan.Parent.SpanID() != server.SpanContext.SpanID() {
			t.Fatal("executor span is not a child of the server span")
		}
		for _, s := range []tracetest.SpanStub{client, server} {
			if got := attrOf(s, a2amqtt.AttrMethod); got != "SendMessage" {
				t.Fatalf("%s %s: a2a.method %q", s.Name, s.SpanKind, got)
			}
			if got := attrOf(s, a2amqtt.AttrTopic); got != bRef.RequestTopic() {
				t.Fatalf("%s %s: mqtt.topic %q", s.Name, s.SpanKind, got)
			}
		}
		for _, s := range []tracetest.SpanStub{client, server, execSpan} {
			if attrOf(s, a2amqtt.AttrTaskID) != string(task.ID) || attrOf(s, a2amqtt.AttrContextID) != task.ContextID {
				t.Fatalf("%s %s: task/context attributes %q/%q, want %s/%s", s.Name, s.SpanKind,
					attrOf(s, a2amqtt.AttrTaskID), attrOf(s, a2amqtt.AttrContextID), task.ID, task.ContextID)
			}
		}
		if got := attrOf(execSpan, a2amqtt.AttrTaskState); got != "TASK_STATE_COMPLETED" {
			t.Fatalf("executor span a2a.task_state %q", got)
		}
	})
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name+"/"+s.SpanKind.String())
	}
	return out
}
