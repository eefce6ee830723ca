package a2amqtt

import (
	"context"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"go.opentelemetry.io/otel/trace"
)

func TestTraceContextRoundTrip(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	p := &paho.Publish{Properties: &paho.PublishProperties{User: paho.UserProperties{
		{Key: PropContextID, Value: "c1"}, {Key: PropTraceParent, Value: "stale"},
	}}}
	InjectTraceContext(ctx, p)
	if got := p.Properties.User.Get(PropTraceParent); got != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Fatalf("traceparent = %q", got)
	}
	if n := len(p.Properties.User); n != 2 {
		t.Fatalf("want the stale traceparent replaced and the other property kept, got %v", p.Properties.User)
	}
	got := trace.SpanContextFromContext(ExtractTraceContext(context.Background(), p))
	if got.TraceID() != tid || got.SpanID() != sid || !got.IsRemote() {
		t.Fatalf("extracted %v", got)
	}
	if sc := trace.SpanContextFromContext(ExtractTraceContext(context.Background(), &paho.Publish{})); sc.IsValid() {
		t.Fatal("no properties must give no span context")
	}
}
