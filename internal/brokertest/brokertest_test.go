package brokertest

import (
	"errors"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
)

func roundTrip(t *testing.T, b Broker) {
	t.Helper()
	u, err := url.Parse(b.URL())
	if err != nil || u.Host != b.Addr() {
		t.Fatalf("URL %q does not match Addr %q", b.URL(), b.Addr())
	}
	sub := MustDial(t, b.Addr(), Options{ClientID: "org/unit/sub"})
	if code := sub.Subscribe("$a2a/v1/request/org/unit/+"); code >= 0x80 {
		t.Fatalf("subscribe: SUBACK %#x", code)
	}
	pub := MustDial(t, b.Addr(), Options{ClientID: "org/unit/pub"})
	resp, err := pub.PublishWith(&paho.Publish{
		Topic: "$a2a/v1/request/org/unit/agent", QoS: 1, Payload: []byte("hi"),
		Properties: &paho.PublishProperties{ResponseTopic: "$a2a/v1/reply/org/unit/pub/x", CorrelationData: []byte{1, 2}},
	})
	if err != nil || resp.ReasonCode >= 0x80 {
		t.Fatalf("publish: %v %+v", err, resp)
	}
	p := sub.Expect("$a2a/v1/request/org/unit/agent", "hi")
	if p.Properties.ResponseTopic != "$a2a/v1/reply/org/unit/pub/x" || string(p.Properties.CorrelationData) != "\x01\x02" {
		t.Fatalf("unexpected message %+v", p)
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
	MustDial(t, m.Addr(), Options{ClientID: "admin", Username: user, Password: pass})

	// Anonymous clients are refused when dynsec is on (allow_anonymous false).
	_, err := Dial(t, m.Addr(), Options{ClientID: "anon"})
	var refused *RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("anonymous connect with dynsec enabled: want a refusal, got %v", err)
	}
}

// A client the broker disconnects is seen as kicked; one the test closes
// is not.
func TestWatchSeesKicks(t *testing.T) {
	m := StartMochi(t)
	a := MustDial(t, m.Addr(), Options{ClientID: "a"})
	b := MustDial(t, m.Addr(), Options{ClientID: "b"})
	c := MustDial(t, m.Addr(), Options{ClientID: "c"})
	w := NewWatch(a, b, c)
	if got := w.Kicked(); len(got) != 0 {
		t.Fatalf("nobody kicked yet, got %v", got)
	}
	c.Close()
	cl, ok := m.Server().Clients.Get("b")
	if !ok {
		t.Fatal("client b not on the broker")
	}
	_ = m.Server().DisconnectClient(cl, packets.ErrAdministrativeAction)
	if got := w.Kicked(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("kicked = %v, want [b]", got)
	}
	if k, reason, sent := b.Kicked(); !k || !sent || reason != packets.ErrAdministrativeAction.Code {
		t.Fatalf("b: kicked=%v reason=%#x sent=%v", k, reason, sent)
	}
}
