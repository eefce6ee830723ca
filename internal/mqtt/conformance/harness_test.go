package conformance_test

import (
	"context"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/brokers"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/mosqtable"
)

// broker is one backend under test plus the ways a human could tamper with
// it behind the operator's back.
type broker struct {
	name      string
	addr      string
	backend   acl.Backend
	adminUser string
	adminPass string
	// restart stops and starts the broker on the same address; backend
	// stays usable (Mosquitto: autopaho reconnects; embedded: replaced).
	restart func(t *testing.T)
	// hand runs dynsec commands outside acl.Apply: mosquitto_ctrl for
	// Mosquitto, the store directly for the embedded broker.
	hand func(t *testing.T, cmds ...acl.Command)
	log  func() string
	// noKicks, when set, says why this broker cannot disconnect a client whose grant a command
	// removed (a row of callerRows): scenarios skip only that assertion, and log it.
	noKicks string
}

// table is the conformance table: every backend kind the operator's factory knows
// (brokers.Kinds), with how to start a fresh broker of it and its tampering hooks. A kind
// missing here fails TestEveryBackendConforms: a new backend is not done until every scenario
// of this suite passes on it (docs/broker.md, "Adding a backend").
var table = map[string]struct {
	name  string
	start func(t testing.TB) *broker
}{
	brokers.Dynsec:   {"mosquitto", startMosquitto},
	brokers.Embedded: {"embedded", startEmbedded},
	brokers.Table:    {"table", startTable},
}

// TestEveryBackendConforms: the factory and this suite's table list the same backends.
func TestEveryBackendConforms(t *testing.T) {
	for _, kind := range brokers.Kinds() {
		if _, ok := table[kind]; !ok {
			t.Errorf("backend %q (internal/mqtt/brokers) has no row in the conformance table", kind)
		}
	}
	if len(table) != len(brokers.Kinds()) {
		t.Errorf("conformance table rows %d, factory kinds %v", len(table), brokers.Kinds())
	}
}

// forEachBroker runs fn against a fresh broker of every kind in the table, in parallel.
// Mosquitto missing fails (brokertest points at hack/install-mosquitto.sh); it is never skipped.
func forEachBroker(t *testing.T, fn func(t *testing.T, b *broker)) {
	t.Helper()
	for _, kind := range brokers.Kinds() {
		row, ok := table[kind]
		if !ok {
			t.Fatalf("backend %q has no row in the conformance table", kind)
		}
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			fn(t, row.start(t))
		})
	}
	for _, row := range callerRows {
		if why, ok := row.lacks[t.Name()]; ok {
			t.Logf("not run on %s: %s", row.name, why)
			continue
		}
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			fn(t, row.start(t))
		})
	}
}

func startMosquitto(t testing.TB) *broker {
	t.Helper()
	if _, err := exec.LookPath("mosquitto_ctrl"); err != nil {
		t.Fatalf("mosquitto_ctrl not found (install mosquitto with hack/install-mosquitto.sh): %v", err)
	}
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
	user, pass := m.DynSecAdmin()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	be, err := dynsec.Connect(ctx, dynsec.Config{URL: m.URL(), Username: user, Password: pass, Timeout: 5 * time.Second, CountKicks: true, Logger: quiet})
	if err != nil {
		t.Fatalf("dynsec connect: %v\n%s", err, m.Log())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = be.Close(ctx)
	})
	return &broker{
		name: "mosquitto", addr: m.Addr(), backend: be, adminUser: user, adminPass: pass,
		restart: func(t *testing.T) {
			if err := m.Restart(); err != nil {
				t.Fatalf("restart mosquitto: %v", err)
			}
		},
		hand: func(t *testing.T, cmds ...acl.Command) {
			for _, c := range cmds {
				mosquittoCtrl(t, m, ctrlArgs(t, c)...)
			}
		},
		log: m.Log,
	}
}

// ctrlArgs spells a command the way mosquitto_ctrl takes it.
func ctrlArgs(t *testing.T, c acl.Command) []string {
	t.Helper()
	switch c.Op {
	case acl.OpDeleteRole:
		return []string{"deleteRole", c.Role}
	case acl.OpCreateRole:
		return []string{"createRole", c.Role}
	case acl.OpDeleteClient:
		return []string{"deleteClient", c.Username}
	case acl.OpAddRoleACL:
		verb := "deny"
		if c.ACL.Allow {
			verb = "allow"
		}
		return []string{"addRoleACL", c.Role, string(c.ACL.Type), c.ACL.Topic, verb, strconv.Itoa(c.ACL.Priority)}
	case acl.OpRemoveClientRole:
		return []string{"removeClientRole", c.Username, c.Role}
	}
	t.Fatalf("no mosquitto_ctrl form for %s", c)
	return nil
}

func mosquittoCtrl(t *testing.T, m *brokertest.Mosquitto, args ...string) {
	t.Helper()
	user, pass := m.DynSecAdmin()
	full := append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(m.Port()), "-u", user, "-P", pass, "dynsec"}, args...)
	out, err := exec.Command("mosquitto_ctrl", full...).CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_ctrl %v: %v\n%s", args, err, out)
	}
}

// startTable is Mosquitto with the decision-table plugin. Its hand-made changes come from a
// second admin connection (another operator, a human with the same protocol): the backend
// under test must notice them, as it notices changes made with mosquitto_ctrl on dynsec.
func startTable(t testing.TB) *broker {
	t.Helper()
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{Table: &brokertest.TableOptions{}})
	user, pass := m.TableAdmin()
	connect := func() *mosqtable.Backend {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		be, err := mosqtable.Connect(ctx, mosqtable.Config{URL: m.URL(), Username: user, Password: pass, Timeout: 5 * time.Second, Logger: quiet})
		if err != nil {
			t.Fatalf("decision table connect: %v\n%s", err, m.Log())
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = be.Close(ctx)
		})
		return be
	}
	be := connect()
	var other *mosqtable.Backend
	return &broker{
		name: "table", addr: m.Addr(), backend: be, adminUser: user, adminPass: pass,
		restart: func(t *testing.T) {
			if err := m.Restart(); err != nil {
				t.Fatalf("restart mosquitto: %v", err)
			}
		},
		hand: func(t *testing.T, cmds ...acl.Command) {
			if other == nil {
				other = connect()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := other.Execute(ctx, cmds); err != nil {
				t.Fatalf("hand-made change: %v", err)
			}
		},
		log: m.Log,
	}
}

func startEmbedded(t testing.TB) *broker {
	t.Helper()
	snap := filepath.Join(t.TempDir(), "identities.json")
	cfg := embedded.Config{Addr: "127.0.0.1:0", MaxPacketSize: 1 << 20,
		Store: embedded.StoreConfig{AdminUsername: "admin", AdminPassword: "admin-password", SnapshotPath: snap}}
	srv, err := embedded.Start(cfg)
	if err != nil {
		t.Fatalf("embedded start: %v", err)
	}
	b := &broker{name: "embedded", addr: srv.Addr(), backend: srv.Backend(), adminUser: "admin", adminPass: "admin-password", log: func() string { return "" }}
	var mu sync.Mutex
	current := srv
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		_ = current.Close()
	})
	b.restart = func(t *testing.T) {
		mu.Lock()
		defer mu.Unlock()
		if err := current.Close(); err != nil {
			t.Fatalf("close embedded: %v", err)
		}
		cfg.Addr = b.addr
		var err error
		for attempt := 0; attempt < 20; attempt++ {
			if current, err = embedded.Start(cfg); err == nil {
				b.backend = current.Backend()
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("restart embedded on %s: %v", b.addr, err)
	}
	b.hand = func(t *testing.T, cmds ...acl.Command) {
		if err := b.backend.Execute(context.Background(), cmds); err != nil {
			t.Fatalf("hand-made change: %v", err)
		}
	}
	return b
}

func apply(t *testing.T, b *broker, d acl.Desired) acl.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := acl.Apply(ctx, b.backend, d)
	if err != nil {
		t.Fatalf("%s: apply: %v\n%s", b.name, err, b.log())
	}
	return res
}

// client is a raw paho v5 test client (brokertest.Client), so every
// CONNACK, SUBACK and PUBACK code is visible.
type client struct {
	*brokertest.Client
}

type will struct {
	topic   string
	payload string
	retain  bool
}

func dial(t *testing.T, b *broker, user, pass, clientID string, w *will) (*client, error) {
	t.Helper()
	o := brokertest.Options{Username: user, Password: pass, ClientID: clientID}
	if w != nil {
		o.Will = &paho.WillMessage{Topic: w.topic, Payload: []byte(w.payload), QoS: 1, Retain: w.retain}
	}
	c, err := brokertest.Dial(t, b.addr, o)
	if err != nil {
		return nil, err
	}
	return &client{c}, nil
}

func mustDial(t *testing.T, b *broker, user, pass, clientID string) *client {
	t.Helper()
	c, err := dial(t, b, user, pass, clientID, nil)
	if err != nil {
		t.Fatalf("%s: %v\n%s", b.name, err, b.log())
	}
	return c
}

func (c *client) close()                                            { c.Close() }
func (c *client) drop()                                             { c.Drop() }
func (c *client) sub(filter string) byte                            { return c.Subscribe(filter) }
func (c *client) pub(topic, payload string) byte                    { return c.Publish(topic, payload) }
func (c *client) next(timeout time.Duration) (*paho.Publish, error) { return c.Next(timeout) }
func (c *client) expect(topic, payload string)                      { c.Expect(topic, payload) }
func (c *client) disconnected(d time.Duration) bool                 { return c.Disconnected(d) }

func granted(code byte) bool { return code < 0x80 }

// Reason codes both brokers use for refusals.
const (
	notAuthorized = 0x87 // SUBACK/PUBACK
)

// quiet drops the backends' connection logs (reconnects are expected here).
var quiet = slog.New(slog.DiscardHandler)
