package testenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/brokers"
)

// BrokerKinds are the brokers every broker-facing suite runs on: real Mosquitto 2.0.11 with the
// dynamic-security plugin, and the embedded broker.
var BrokerKinds = []string{"mosquitto", "embedded"}

// Broker is a running broker with its ACL backend.
type Broker struct {
	Backend acl.Backend
	URL     string
	Addr    string
}

// StartBroker starts a broker of kind ("mosquitto" or "embedded") for the rest of the test, its
// backend built by the operator's own factory (internal/mqtt/brokers).
func StartBroker(t testing.TB, ctx context.Context, kind string) Broker {
	t.Helper()
	cfg := brokers.Config{Kind: brokers.Embedded, URL: "mqtt://127.0.0.1:0", MaxPacketSize: 1 << 20}
	if kind == "mosquitto" {
		broker := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
		user, pass := broker.DynSecAdmin()
		cfg = brokers.Config{Kind: brokers.Dynsec, URL: broker.URL(), Username: user, Password: pass}
	}
	b, err := brokers.Connect(ctx, cfg)
	if err != nil {
		t.Fatalf("start %s broker: %v", kind, err)
	}
	t.Cleanup(func() { _ = b.Close() })
	u, err := url.Parse(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	return Broker{Backend: b.Backend, URL: b.URL, Addr: u.Host}
}

// MQTTClient is a raw paho v5 client without reconnects, so that every disconnect the broker
// causes is seen and counted (the "no collateral kicks" assertions).
type MQTTClient struct {
	*paho.Client
	ID    string
	mu    sync.Mutex
	kicks []string
}

// Kicks lists the disconnects seen so far.
func (c *MQTTClient) Kicks() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.kicks)
}

// ResetKicks forgets the disconnects seen so far.
func (c *MQTTClient) ResetKicks() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kicks = nil
}

func (c *MQTTClient) kicked(why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kicks = append(c.kicks, why)
}

// Dial connects to addr with a clean session; a CONNACK refusal is an error.
func Dial(ctx context.Context, addr, username, clientID, password string) (*MQTTClient, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &MQTTClient{ID: clientID}
	c.Client = paho.NewClient(paho.ClientConfig{Conn: conn,
		OnServerDisconnect: func(d *paho.Disconnect) { c.kicked(fmt.Sprintf("DISCONNECT reason 0x%02x", d.ReasonCode)) },
		OnClientError:      func(err error) { c.kicked(err.Error()) },
	})
	ack, err := c.Connect(ctx, &paho.Connect{ClientID: clientID, CleanStart: true, KeepAlive: 30,
		Username: username, UsernameFlag: true, Password: []byte(password), PasswordFlag: true})
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("connect %s as %s: %w", clientID, username, err)
	}
	if ack.ReasonCode != 0 {
		_ = conn.Close()
		return nil, fmt.Errorf("connect %s as %s: CONNACK reason 0x%02x", clientID, username, ack.ReasonCode)
	}
	return c, nil
}

// DialAgent connects as an agent identity ({org}/{unit}/{agent}) for the rest of the test.
func DialAgent(t testing.TB, ctx context.Context, addr, clientID, password string) *MQTTClient {
	t.Helper()
	c, err := Dial(ctx, addr, "a2a:"+clientID, clientID, password)
	if err != nil {
		t.Fatalf("agent %s cannot connect with its generated credentials: %v", clientID, err)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	return c
}
