package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// counter reads one sample of a counter vector from the service's registry.
func counter(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func sendPayload(taskID, contextID, text string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":"r-%s","method":"SendMessage","params":{"message":{"messageId":%q,"taskId":%q,"contextId":%q,"role":"ROLE_USER","parts":[{"text":%q}]}}}`,
		taskID, uuid.NewString(), taskID, contextID, text)
}

type rpcReply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

func decodeReply(t testing.TB, p *paho.Publish) rpcReply {
	t.Helper()
	var r rpcReply
	if err := json.Unmarshal(p.Payload, &r); err != nil {
		t.Fatalf("reply %s: %v", p.Payload, err)
	}
	return r
}

// TestServiceSafety replays, with plain-paho requesters and agents, what the
// service must refuse or hide (issues 8.4, 8.9, 12.1, 12.2, 12.3) and checks
// the trace continues across requester → service → agent → reply (issue 9).
func TestServiceSafety(t *testing.T) {
	onBothBrokers(t, serviceSafety)
}

func serviceSafety(t *testing.T, kind string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := newStack(t, ctx, kind)
	clk := &clock{}
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	svc := st.startServiceCfg(t, ctx, clk, "safety", func(c *convservice.Config) {
		c.TracerProvider = tp
	})
	agent := startRawAgent(t, ctx, st.addr, st.usernames["raw"], st.passwords["raw"], ref("raw"), identity.DeliveryTopic(ref("raw")))
	startSDKAgent(t, ctx, st, agents.KindMemory, "memory", 0)
	client := startRawClient(t, ctx, st, "client")
	reg := svc.Registry()
	rawTopic := ref("raw").RequestTopic()
	// stamps: the broker tells subscribers who published (the embedded
	// broker sets identity.SenderProperty); seen on the service's forwards.
	stamps := false

	t.Run("the agent cannot read the requester's reply path in the correlation data", func(t *testing.T) {
		corr := []byte("requester-secret-correlation-" + uuid.NewString())
		respTo := client.id.ReplyTopic("conv-1")
		relayed := counter(t, reg, "a2a_conversation_replies_total", "outcome", "relayed")
		client.publish(t, ctx, rawTopic, respTo, corr, nil, sendPayload(uuid.NewString(), uuid.NewString(), "hello"))
		if got := client.wait(corr, 1, 10*time.Second); len(got) != 1 || decodeReply(t, got[0]).Error != nil {
			t.Fatalf("replies %v", got)
		}
		// The unary result was relayed with its PUBACK seen: counted once.
		eventually(t, 5*time.Second, "relay counted", func() error {
			if got := counter(t, reg, "a2a_conversation_replies_total", "outcome", "relayed"); got != relayed+1 {
				return fmt.Errorf("relayed = %v, want %v", got, relayed+1)
			}
			return nil
		})
		seen := agent.received()
		last := seen[len(seen)-1].Properties
		stamps = last.User.Get(identity.SenderProperty) != ""
		if bytes.Contains(last.CorrelationData, corr) || bytes.Contains(last.CorrelationData, []byte(respTo)) ||
			bytes.Contains(last.CorrelationData, []byte("acme/sales/client")) {
			t.Fatalf("forwarded correlation data reveals the requester: %q", last.CorrelationData)
		}
		if last.ResponseTopic != svc.ReplyTopic() {
			t.Fatalf("agent replies to %s", last.ResponseTopic)
		}
	})

	t.Run("a reply topic the requester may not name is never used", func(t *testing.T) {
		victims := []string{"$a2a/v1/reply/evil/unit/x/1"} // not a caller of raw
		if stamps {
			// The broker stamps the sender: even an admitted caller's reply
			// topic is refused when it is not the publisher's own.
			victims = append(victims, ref("direct").ReplyTopic("stolen"))
		} else {
			t.Logf("%s does not stamp the publisher on this build: only the admitted-caller check applies (docs/conversation-service.md)", kind)
		}
		for _, victim := range victims {
			before := counter(t, reg, "a2a_conversation_rejections_total", "reason", "reply_topic_not_permitted")
			n := len(agent.received())
			client.publish(t, ctx, rawTopic, victim, []byte("c-"+uuid.NewString()), nil, sendPayload(uuid.NewString(), uuid.NewString(), "redirect"))
			eventually(t, 10*time.Second, "refusal counted", func() error {
				if got := counter(t, reg, "a2a_conversation_rejections_total", "reason", "reply_topic_not_permitted"); got != before+1 {
					return fmt.Errorf("reply_topic_not_permitted = %v, want %v", got, before+1)
				}
				return nil
			})
			if len(agent.received()) != n {
				t.Fatalf("a request with reply topic %s reached the agent", victim)
			}
		}
	})

	t.Run("a2a-context-id header that contradicts the body is -32005", func(t *testing.T) {
		corr := []byte("c-" + uuid.NewString())
		n := len(agent.received())
		client.publish(t, ctx, rawTopic, client.id.ReplyTopic("x"), corr,
			paho.UserProperties{{Key: a2amqtt.PropContextID, Value: uuid.NewString()}}, sendPayload(uuid.NewString(), uuid.NewString(), "mismatch"))
		got := client.wait(corr, 1, 10*time.Second)
		if len(got) != 1 {
			t.Fatal("no answer")
		}
		r := decodeReply(t, got[0])
		if r.Error == nil || r.Error.Code != a2amqtt.CodeTransportProtocolError || !strings.Contains(string(r.Error.Data), a2amqtt.A2AErrorTransportProtocolError) ||
			!strings.Contains(r.Error.Message, "does not match params.message.contextId") {
			t.Fatalf("answer %s", got[0].Payload)
		}
		if len(agent.received()) != n {
			t.Fatal("the contradictory request reached the agent")
		}
	})

	t.Run("A2A v0.3 send without ids gets ids from the service", func(t *testing.T) {
		corr := []byte("c-" + uuid.NewString())
		client.publish(t, ctx, ref("memory").RequestTopic(), client.id.ReplyTopic("v03"), corr, nil,
			fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"kind":"message","messageId":%q,"role":"user","parts":[{"kind":"text","text":"hi"}]}}}`, uuid.NewString()))
		got := client.wait(corr, 1, 10*time.Second)
		if len(got) != 1 {
			t.Fatal("no answer")
		}
		var res struct {
			Result struct {
				Kind      string `json:"kind"`
				ID        string `json:"id"`
				TaskID    string `json:"taskId"`
				ContextID string `json:"contextId"`
			} `json:"result"`
			Error any `json:"error"`
		}
		if err := json.Unmarshal(got[0].Payload, &res); err != nil || res.Error != nil {
			t.Fatalf("answer %s", got[0].Payload)
		}
		if _, err := uuid.Parse(res.Result.ContextID); err != nil {
			t.Fatalf("no service-assigned context id in %s", got[0].Payload)
		}
	})

	t.Run("one trace from requester through service and agent back to the requester", func(t *testing.T) {
		agent.mu.Lock()
		agent.tracer = tp.Tracer("agent")
		agent.mu.Unlock()
		spans.Reset()
		rctx, root := tp.Tracer("requester").Start(ctx, "requester.send", trace.WithSpanKind(trace.SpanKindProducer))
		p := &paho.Publish{}
		a2amqtt.InjectTraceContext(rctx, p)
		corr := []byte("c-" + uuid.NewString())
		client.publish(t, ctx, rawTopic, client.id.ReplyTopic("t"), corr, p.Properties.User, sendPayload(uuid.NewString(), uuid.NewString(), "traced"))
		got := client.wait(corr, 1, 10*time.Second)
		root.End()
		if len(got) != 1 {
			t.Fatal("no answer")
		}
		want := root.SpanContext().TraceID()
		if back := trace.SpanContextFromContext(a2amqtt.ExtractTraceContext(ctx, got[0])); back.TraceID() != want {
			t.Fatalf("the reply carries trace %s, want %s", back.TraceID(), want)
		}
		eventually(t, 5*time.Second, "spans recorded", func() error {
			names := map[string]bool{}
			for _, s := range spans.GetSpans() {
				if s.SpanContext.TraceID() == want {
					names[s.Name] = true
				}
			}
			for _, n := range []string{"requester.send", "conversation.request", "conversation.decide", "conversation.forward", "agent.handle", "conversation.relay"} {
				if !names[n] {
					return fmt.Errorf("span %s missing from trace %s (have %v)", n, want, names)
				}
			}
			return nil
		})
	})

	t.Run("a request no agent acknowledges answers responder_unavailable and frees the slot", func(t *testing.T) {
		// Nobody serves "confirm" in this test. On Mosquitto the broker says
		// so (PUBACK 0x10) at once; where it does not, the first-event
		// deadline (default 30s, moved by the test clock) answers.
		corr := []byte("c-" + uuid.NewString())
		c := uuid.NewString()
		client.publish(t, ctx, ref("confirm").RequestTopic(), client.id.ReplyTopic("offline"), corr, nil, sendPayload(uuid.NewString(), c, "anyone?"))
		var got []*paho.Publish
		if kind == "mosquitto" {
			// The PUBACK reports it (PublishNotify), with no deadline moved.
			if got = client.wait(corr, 1, 5*time.Second); len(got) == 0 {
				t.Fatal("no answer from the PUBACK's 0x10 within 5s")
			}
		}
		eventually(t, 30*time.Second, "responder_unavailable", func() error {
			if len(got) > 0 {
				return nil
			}
			if got = client.wait(corr, 1, 200*time.Millisecond); len(got) == 0 {
				clk.Advance(31 * time.Second)
				return fmt.Errorf("no answer yet")
			}
			return nil
		})
		r := decodeReply(t, got[0])
		if r.Error == nil || r.Error.Code != a2amqtt.CodeResponderUnavailable || !strings.Contains(string(r.Error.Data), a2amqtt.A2AErrorResponderUnavailable) {
			t.Fatalf("answer %s", got[0].Payload)
		}
	})
}
