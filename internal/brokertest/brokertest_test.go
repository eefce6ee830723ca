package brokertest

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// connect opens a bare paho v5 client (no autopaho) so this package's tests
// do not depend on the SDK under test.
func connect(t *testing.T, addr, id string, onMsg func(*paho.Publish)) *paho.Client {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c := paho.NewClient(paho.ClientConfig{
		ClientID: id,
		Conn:     conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				if onMsg != nil {
					onMsg(pr.Packet)
				}
				return true, nil
			},
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if ca.ReasonCode != 0 {
		t.Fatalf("connack reason %d", ca.ReasonCode)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	return c
}

func roundTrip(t *testing.T, b Broker) {
	t.Helper()
	u, err := url.Parse(b.URL())
	if err != nil || u.Host != b.Addr() {
		t.Fatalf("URL %q does not match Addr %q", b.URL(), b.Addr())
	}
	got := make(chan *paho.Publish, 1)
	sub := connect(t, b.Addr(), "org/unit/sub", func(p *paho.Publish) { got <- p })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "$a2a/v1/request/org/unit/+", QoS: 1}}}); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	pub := connect(t, b.Addr(), "org/unit/pub", nil)
	resp, err := pub.Publish(ctx, &paho.Publish{
		Topic: "$a2a/v1/request/org/unit/agent", QoS: 1, Payload: []byte("hi"),
		Properties: &paho.PublishProperties{ResponseTopic: "$a2a/v1/reply/org/unit/pub/x", CorrelationData: []byte{1, 2}},
	})
	if err != nil || resp.ReasonCode >= 0x80 {
		t.Fatalf("publish: %v %+v", err, resp)
	}
	select {
	case p := <-got:
		if string(p.Payload) != "hi" || p.Properties.ResponseTopic != "$a2a/v1/reply/org/unit/pub/x" || string(p.Properties.CorrelationData) != "\x01\x02" {
			t.Fatalf("unexpected message %+v", p)
		}
	case <-ctx.Done():
		t.Fatal("no message delivered")
	}
}

func TestBrokersRoundTrip(t *testing.T) {
	ForEach(t, roundTrip)
}

func TestMosquittoRestartKeepsPort(t *testing.T) {
	m := StartMosquitto(t, MosquittoOptions{MaxPacketSize: 4096})
	port := m.Port()
	m.Stop()
	if c, err := net.DialTimeout("tcp", m.Addr(), 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("broker still accepting after Stop")
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if m.Port() != port {
		t.Fatalf("port changed %d -> %d", port, m.Port())
	}
	roundTrip(t, m)
}

func TestMosquittoDynSec(t *testing.T) {
	m := StartMosquitto(t, MosquittoOptions{DynSec: &DynSecOptions{}})
	user, pass := m.DynSecAdmin()
	conn, err := net.DialTimeout("tcp", m.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{ClientID: "admin", Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: "admin", KeepAlive: 30, CleanStart: true,
		UsernameFlag: true, Username: user, PasswordFlag: true, Password: []byte(pass)})
	if err != nil || ca.ReasonCode != 0 {
		t.Fatalf("admin connect: %v %+v", err, ca)
	}
	defer c.Disconnect(&paho.Disconnect{})

	// Anonymous clients are refused when dynsec is on (allow_anonymous false).
	conn2, err := net.DialTimeout("tcp", m.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	anon := paho.NewClient(paho.ClientConfig{ClientID: "anon", Conn: conn2})
	ca2, err := anon.Connect(ctx, &paho.Connect{ClientID: "anon", KeepAlive: 30, CleanStart: true})
	if err == nil && ca2 != nil && ca2.ReasonCode == 0 {
		t.Fatal("anonymous connect accepted with dynsec enabled")
	}
}
