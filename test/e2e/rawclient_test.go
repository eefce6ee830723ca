package e2e

import (
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// rawClient is a requester on plain paho (no SDK): it publishes hand-written
// JSON-RPC with whatever properties a test wants and collects every message
// on its reply topic, keyed by correlation data.
type rawClient struct {
	c       *paho.Client
	id      a2amqtt.AgentRef
	mu      sync.Mutex
	replies map[string][]*paho.Publish
	arrived chan struct{}
	// served is the request topic serve handles (an agent on plain paho),
	// handler what it runs for each request, in its own goroutine.
	served  string
	handler func(*paho.Publish)
}

func startRawClient(t testing.TB, ctx context.Context, st *stack, name string) *rawClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", st.addr, 5*time.Second)
	if err != nil {
		t.Fatalf("raw client dial: %v", err)
	}
	rc := &rawClient{id: ref(name), replies: map[string][]*paho.Publish{}, arrived: make(chan struct{}, 1)}
	rc.c = paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			p := pr.Packet
			if p.Properties == nil {
				return true, nil
			}
			rc.mu.Lock()
			if h := rc.handler; h != nil && p.Topic == rc.served {
				rc.mu.Unlock()
				go h(p)
				return true, nil
			}
			rc.replies[string(p.Properties.CorrelationData)] = append(rc.replies[string(p.Properties.CorrelationData)], p)
			rc.mu.Unlock()
			select {
			case rc.arrived <- struct{}{}:
			default:
			}
			return true, nil
		}},
	})
	ack, err := rc.c.Connect(ctx, &paho.Connect{ClientID: rc.id.ClientID(), CleanStart: true, KeepAlive: 30,
		Username: st.usernames[name], UsernameFlag: true, Password: []byte(st.passwords[name]), PasswordFlag: true})
	if err != nil || ack.ReasonCode != 0 {
		t.Fatalf("raw client connect: %v %v", err, ack)
	}
	sa, err := rc.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: rc.id.ReplyTopic("#"), QoS: 1}}})
	if err != nil || sa.Reasons[0] >= 0x80 {
		t.Fatalf("raw client subscribe: %v %v", err, sa)
	}
	t.Cleanup(func() { _ = rc.c.Disconnect(&paho.Disconnect{}) })
	return rc
}

func (rc *rawClient) publish(t testing.TB, ctx context.Context, topic, respTo string, corr []byte, user paho.UserProperties, payload string) {
	t.Helper()
	if _, err := rc.c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload),
		Properties: &paho.PublishProperties{ResponseTopic: respTo, CorrelationData: corr, User: user, ContentType: "application/json"}}); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// serve makes the client an agent on plain paho too: handler runs for every
// request published to topic (its delivery topic).
func (rc *rawClient) serve(t testing.TB, ctx context.Context, topic string, handler func(*paho.Publish)) {
	t.Helper()
	rc.mu.Lock()
	rc.served, rc.handler = topic, handler
	rc.mu.Unlock()
	sa, err := rc.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}})
	if err != nil || sa.Reasons[0] >= 0x80 {
		t.Fatalf("raw agent subscribe %s: %v %v", topic, err, sa)
	}
}

// answer publishes a JSON-RPC reply to a request (its Response Topic and
// Correlation Data).
func (rc *rawClient) answer(req *paho.Publish, body map[string]any) {
	b, _ := json.Marshal(body)
	_, _ = rc.c.Publish(context.Background(), &paho.Publish{Topic: req.Properties.ResponseTopic, QoS: 1, Payload: b,
		Properties: &paho.PublishProperties{CorrelationData: req.Properties.CorrelationData, ContentType: "application/json"}})
}

// wait returns the replies on corr once n have arrived, or what arrived by
// the deadline.
func (rc *rawClient) wait(corr []byte, n int, timeout time.Duration) []*paho.Publish {
	deadline := time.After(timeout)
	for {
		rc.mu.Lock()
		got := append([]*paho.Publish(nil), rc.replies[string(corr)]...)
		rc.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-rc.arrived:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			return got
		}
	}
}
