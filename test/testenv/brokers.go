package testenv

import (
	"context"
	"net/url"
	"testing"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/brokers"
)

// BrokerKinds are the brokers every broker-facing suite runs on: real Mosquitto 2.0.11 with the
// dynamic-security plugin, and the embedded broker.
var BrokerKinds = []string{"mosquitto", "embedded"}

// TableKind is Mosquitto 2.0.11 with the project's decision-table plugin (brokers.Table) for
// StartBroker; suites that prove the new path add it to BrokerKinds.
const TableKind = "table"

// Broker is a running broker with its ACL backend.
type Broker struct {
	Backend acl.Backend
	URL     string
	Addr    string
}

// StartBroker starts a broker of kind ("mosquitto", "embedded" or TableKind) for the rest of the test, its
// backend built by the operator's own factory (internal/mqtt/brokers).
func StartBroker(t testing.TB, ctx context.Context, kind string) Broker {
	t.Helper()
	cfg := brokers.Config{Kind: brokers.Embedded, URL: "mqtt://127.0.0.1:0", MaxPacketSize: 1 << 20}
	if kind == "mosquitto" {
		broker := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
		user, pass := broker.DynSecAdmin()
		cfg = brokers.Config{Kind: brokers.Dynsec, URL: broker.URL(), Username: user, Password: pass}
	}
	if kind == TableKind {
		broker := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{Table: &brokertest.TableOptions{}})
		user, pass := broker.TableAdmin()
		cfg = brokers.Config{Kind: brokers.Table, URL: broker.URL(), Username: user, Password: pass}
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

// DialAgent connects as an agent identity ({org}/{unit}/{agent}, username a2a:{org}/{unit}/{agent})
// with a clean session for the rest of the test: a brokertest.Client without reconnects, so
// every disconnect the broker causes is seen (the "no collateral kicks" assertions). What it
// receives is dropped.
func DialAgent(t testing.TB, addr, clientID, password string) *brokertest.Client {
	t.Helper()
	c, err := brokertest.Dial(t, addr, brokertest.Options{Username: acl.DefaultPrefix + clientID, ClientID: clientID, Password: password, IgnoreMessages: true})
	if err != nil {
		t.Fatalf("agent %s cannot connect with its generated credentials: %v", clientID, err)
	}
	return c
}
