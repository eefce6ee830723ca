package a2amqtt

import (
	"context"
	"iter"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/eclipse/paho.golang/paho"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the SDK's spans.
const tracerName = "github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"

// Span attributes the SDK sets (docs/protocol.md, "Tracing"). The conversation service uses the
// same keys for its spans.
const (
	AttrMethod    = attribute.Key("a2a.method")
	AttrTaskID    = attribute.Key("a2a.task_id")
	AttrContextID = attribute.Key("a2a.context_id")
	AttrTaskState = attribute.Key("a2a.task_state")
	AttrTarget    = attribute.Key("a2a.target")
	AttrTopic     = attribute.Key("mqtt.topic")
	// AttrMessagingSystem is the OpenTelemetry semantic-convention key; its value is "mqtt".
	AttrMessagingSystem = attribute.Key("messaging.system")
)

// Span names: "a2a.<JSON-RPC method>" for the requester's client span and the responder's
// server span, SpanExecute for the executor run inside the server span.
const SpanExecute = "a2a.execute"

// Tracer returns the tracer of the connection's TracerProvider (Config.TracerProvider), for
// components built on Conn that add spans of their own (the conversation service).
func (c *Conn) Tracer() trace.Tracer { return c.tracer }

// extractUserProps is ExtractTraceContext for properties already copied off the packet.
func extractUserProps(ctx context.Context, user paho.UserProperties) context.Context {
	if len(user) == 0 {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, UserPropertiesCarrier{Props: &user})
}

// spanAttrs are the attributes every SDK span carries (empty values are left out).
func spanAttrs(method, taskID, contextID, topic string) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs, AttrMessagingSystem.String("mqtt"))
	if method != "" {
		attrs = append(attrs, AttrMethod.String(method))
	}
	if taskID != "" {
		attrs = append(attrs, AttrTaskID.String(taskID))
	}
	if contextID != "" {
		attrs = append(attrs, AttrContextID.String(contextID))
	}
	if topic != "" {
		attrs = append(attrs, AttrTopic.String(topic))
	}
	return attrs
}

// endSpan records err (if any) and ends span.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// tracedExecutor runs the agent's executor in a child span of the responder's server span, so
// the agent's own spans (LLM calls, tools) hang under the request that caused them.
type tracedExecutor struct {
	inner  a2asrv.AgentExecutor
	tracer trace.Tracer
}

var (
	_ a2asrv.AgentExecutor         = tracedExecutor{}
	_ a2asrv.AgentExecutionCleaner = tracedExecutor{}
)

func (t tracedExecutor) run(ctx context.Context, name string, ec *a2asrv.ExecutorContext, events func(context.Context) iter.Seq2[a2a.Event, error]) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
		if !span.IsRecording() {
			for ev, err := range events(ctx) {
				if !yield(ev, err) {
					return
				}
			}
			return
		}
		span.SetAttributes(spanAttrs("", string(ec.TaskID), ec.ContextID, "")...)
		var failed error
		var last a2a.TaskState
		defer func() {
			if last != "" {
				span.SetAttributes(AttrTaskState.String(string(last)))
			}
			endSpan(span, failed)
		}()
		for ev, err := range events(ctx) {
			if err != nil {
				failed = err
			}
			switch v := ev.(type) {
			case *a2a.TaskStatusUpdateEvent:
				last = v.Status.State
			case *a2a.Task:
				last = v.Status.State
			}
			if !yield(ev, err) {
				return
			}
		}
	}
}

// Execute implements a2asrv.AgentExecutor.
func (t tracedExecutor) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return t.run(ctx, SpanExecute, ec, func(ctx context.Context) iter.Seq2[a2a.Event, error] { return t.inner.Execute(ctx, ec) })
}

// Cancel implements a2asrv.AgentExecutor.
func (t tracedExecutor) Cancel(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return t.run(ctx, "a2a.cancel", ec, func(ctx context.Context) iter.Seq2[a2a.Event, error] { return t.inner.Cancel(ctx, ec) })
}

// Cleanup implements a2asrv.AgentExecutionCleaner when the agent does.
func (t tracedExecutor) Cleanup(ctx context.Context, ec *a2asrv.ExecutorContext, result a2a.SendMessageResult, err error) {
	if c, ok := t.inner.(a2asrv.AgentExecutionCleaner); ok {
		c.Cleanup(ctx, ec, result, err)
	}
}
