package convservice

import (
	"context"
	"slices"

	"github.com/eclipse/paho.golang/paho"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// tracerName is the instrumentation scope of the service's spans.
const tracerName = "github.com/a2a-fleet/a2a-fleet/internal/convservice"

// Span attribute keys of the service's own (the governed agent, the rule's
// decision); the A2A ids use the SDK's keys (a2amqtt.AttrMethod, AttrTaskID,
// AttrContextID), so a trace reads the same on both sides of the proxy.
const (
	attrAgent    = attribute.Key("a2a.agent")
	attrDecision = attribute.Key("a2a.conversation.decision")
)

// traceFrom continues the trace whose W3C trace context travels in a
// message's user properties (traceparent/tracestate, docs/protocol.md).
func traceFrom(ctx context.Context, user paho.UserProperties) context.Context {
	return propagation.TraceContext{}.Extract(ctx, a2amqtt.UserPropertiesCarrier{Props: &user})
}

// withTrace returns a copy of user carrying ctx's span context, so the
// receiver of what the service publishes continues the same trace.
func withTrace(ctx context.Context, user paho.UserProperties) paho.UserProperties {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return user
	}
	out := slices.Clone(user)
	propagation.TraceContext{}.Inject(ctx, a2amqtt.UserPropertiesCarrier{Props: &out})
	return out
}

func (s *spans) span(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return s.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// fail marks a span as failed with a reason.
func fail(sp trace.Span, reason string) { sp.SetStatus(codes.Error, reason) }
