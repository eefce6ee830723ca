package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/dynsec"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
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
}

// forEachBroker runs fn against a fresh Mosquitto+dynsec and a fresh
// embedded broker, in parallel. Mosquitto missing fails (brokertest points
// at hack/install-mosquitto.sh); it is never skipped.
func forEachBroker(t *testing.T, fn func(t *testing.T, b *broker)) {
	t.Helper()
	t.Run("mosquitto", func(t *testing.T) {
		t.Parallel()
		fn(t, startMosquitto(t))
	})
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		fn(t, startEmbedded(t))
	})
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
	be, err := dynsec.Connect(ctx, dynsec.Config{URL: m.URL(), Username: user, Password: pass, Timeout: 5 * time.Second})
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

// client is a bare paho v5 client (no autopaho), so every CONNACK, SUBACK
// and PUBACK code is visible.
type client struct {
	t    *testing.T
	name string
	pc   *paho.Client
	conn net.Conn
	msgs chan *paho.Publish
}

// refusedError is a CONNACK with a failure reason (or a connection the
// broker closed instead of answering).
type refusedError struct{ code byte }

func (e *refusedError) Error() string {
	return fmt.Sprintf("connection refused, CONNACK reason %d", e.code)
}

type will struct {
	topic   string
	payload string
	retain  bool
}

func dial(t *testing.T, b *broker, user, pass, clientID string, w *will) (*client, error) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", b.addr, 2*time.Second)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", b.addr, err)
	}
	c := &client{t: t, name: user, conn: conn, msgs: make(chan *paho.Publish, 64)}
	c.pc = paho.NewClient(paho.ClientConfig{
		ClientID: clientID,
		Conn:     conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				select {
				case c.msgs <- pr.Packet:
				default:
				}
				return true, nil
			},
		},
	})
	cp := &paho.Connect{ClientID: clientID, KeepAlive: 30, CleanStart: true}
	if user != "" {
		cp.UsernameFlag, cp.Username = true, user
	}
	if pass != "" {
		cp.PasswordFlag, cp.Password = true, []byte(pass)
	}
	if w != nil {
		cp.WillMessage = &paho.WillMessage{Topic: w.topic, Payload: []byte(w.payload), QoS: 1, Retain: w.retain}
		cp.WillProperties = &paho.WillProperties{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ca, err := c.pc.Connect(ctx, cp)
	if ca != nil && ca.ReasonCode >= 0x80 {
		conn.Close()
		return nil, &refusedError{code: ca.ReasonCode}
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("connect as %q: %w", user, err)
	}
	t.Cleanup(func() { c.close() })
	return c, nil
}

func mustDial(t *testing.T, b *broker, user, pass, clientID string) *client {
	t.Helper()
	c, err := dial(t, b, user, pass, clientID, nil)
	if err != nil {
		t.Fatalf("%s: %v\n%s", b.name, err, b.log())
	}
	return c
}

func (c *client) close() {
	_ = c.pc.Disconnect(&paho.Disconnect{})
	_ = c.conn.Close()
}

// drop closes the TCP connection without DISCONNECT, so the Will fires.
func (c *client) drop() { _ = c.conn.Close() }

// sub subscribes with QoS 1 and returns the SUBACK reason code.
func (c *client) sub(filter string) byte {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sa, err := c.pc.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if sa != nil && len(sa.Reasons) == 1 {
		return sa.Reasons[0]
	}
	c.t.Fatalf("%s: subscribe %q: no SUBACK: %v", c.name, filter, err)
	return 0
}

// pub publishes with QoS 1 and returns the PUBACK reason code.
func (c *client) pub(topic, payload string) byte {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pr, err := c.pc.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)})
	if pr != nil {
		return pr.ReasonCode
	}
	c.t.Fatalf("%s: publish %q: no PUBACK: %v", c.name, topic, err)
	return 0
}

// next waits for the next delivered message.
func (c *client) next(timeout time.Duration) (*paho.Publish, error) {
	select {
	case p := <-c.msgs:
		return p, nil
	case <-time.After(timeout):
		return nil, errors.New("no message")
	case <-c.pc.Done():
		return nil, errors.New("connection closed")
	}
}

// expect asserts that the next message is topic/payload.
func (c *client) expect(topic, payload string) {
	c.t.Helper()
	p, err := c.next(5 * time.Second)
	if err != nil {
		c.t.Fatalf("%s: waiting for %q on %q: %v", c.name, payload, topic, err)
	}
	if p.Topic != topic || string(p.Payload) != payload {
		c.t.Fatalf("%s: got %q on %q, want %q on %q", c.name, p.Payload, p.Topic, payload, topic)
	}
}

// disconnected reports whether the broker closed the connection within d.
func (c *client) disconnected(d time.Duration) bool {
	select {
	case <-c.pc.Done():
		return true
	case <-time.After(d):
		return false
	}
}

func granted(code byte) bool { return code < 0x80 }

// Reason codes both brokers use for refusals.
const (
	notAuthorized = 0x87 // SUBACK/PUBACK
)
