package a2amqtt

import (
	"context"

	"github.com/eclipse/paho.golang/paho"
	"go.opentelemetry.io/otel/propagation"
)

// W3C trace context travels as MQTT v5 user properties named like the HTTP headers of the W3C
// Trace Context recommendation: "traceparent" and "tracestate". The A2A over MQTT profile lists
// extended observability without naming a property; docs/protocol.md records this choice.
const (
	PropTraceParent = "traceparent"
	PropTraceState  = "tracestate"
)

// UserPropertiesCarrier adapts a publish's user properties to OpenTelemetry's TextMapCarrier, so
// any propagator (propagation.TraceContext, baggage) reads and writes them.
type UserPropertiesCarrier struct{ Props *paho.UserProperties }

var _ propagation.TextMapCarrier = UserPropertiesCarrier{}

// Get returns the first value of key.
func (c UserPropertiesCarrier) Get(key string) string { return c.Props.Get(key) }

// Set replaces every value of key with value.
func (c UserPropertiesCarrier) Set(key, value string) {
	out := (*c.Props)[:0]
	for _, p := range *c.Props {
		if p.Key != key {
			out = append(out, p)
		}
	}
	*c.Props = append(out, paho.UserProperty{Key: key, Value: value})
}

// Keys lists the property names.
func (c UserPropertiesCarrier) Keys() []string {
	keys := make([]string, 0, len(*c.Props))
	for _, p := range *c.Props {
		keys = append(keys, p.Key)
	}
	return keys
}

// InjectTraceContext writes the span context of ctx into p's user properties with the W3C trace
// context propagator. Without an active span it writes nothing.
func InjectTraceContext(ctx context.Context, p *paho.Publish) {
	if p.Properties == nil {
		p.Properties = &paho.PublishProperties{}
	}
	propagation.TraceContext{}.Inject(ctx, UserPropertiesCarrier{Props: &p.Properties.User})
}

// ExtractTraceContext returns ctx carrying the remote span context found in p's user properties.
func ExtractTraceContext(ctx context.Context, p *paho.Publish) context.Context {
	if p.Properties == nil {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, UserPropertiesCarrier{Props: &p.Properties.User})
}
