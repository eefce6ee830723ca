package brokertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// Client is a raw paho v5 test client (no autopaho, no reconnects), so every
// CONNACK, SUBACK, PUBACK and DISCONNECT reason code is visible to the test,
// and a disconnect by the broker (a "kick") stays visible instead of being
// healed by a reconnect.
type Client struct {
	t    testing.TB
	name string
	pc   *paho.Client
	conn net.Conn
	msgs chan *paho.Publish

	mu         sync.Mutex
	serverDisc *paho.Disconnect // the broker's DISCONNECT, if one came
	closedByUs bool
	// kicksReset: ResetKicks ran after the connection had already ended.
	kicksReset bool
	// ended is closed when paho reported how the connection ended (the
	// broker's DISCONNECT or a connection error), disconnected when it was
	// the broker's DISCONNECT: paho closes the client first and calls back
	// after, so Done alone does not tell the reason yet.
	ended, disconnected chan struct{}
	endedOnce           sync.Once
}

// Options configure Dial. The zero value is an anonymous clean session with
// a 30 s keep-alive.
type Options struct {
	Username, Password string
	ClientID           string
	// Will, when set, is the client's Will message.
	Will *paho.WillMessage
	// WillProperties go with Will.
	WillProperties *paho.WillProperties
	// Persistent keeps the session (Clean Start false, SessionExpiry).
	Persistent    bool
	SessionExpiry uint32
	// RequestProblemInfo false asks the broker for no reason strings.
	NoProblemInfo bool
	// Timeout bounds the dial and the CONNACK (default 5 s).
	Timeout time.Duration
	// IgnoreMessages drops what the client receives instead of buffering it for Next and
	// Messages: for clients that only probe the broker's decisions (retained cards would fill
	// the buffer).
	IgnoreMessages bool
}

// RefusedError is a CONNACK with a failure reason code (or a connection the
// broker closed instead of answering: Code 0).
type RefusedError struct {
	Code   byte
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("connection refused, CONNACK reason %d (%#x) %s", e.Code, e.Code, e.Reason)
}

// Dial connects to addr and returns the client, or a *RefusedError when the
// broker refused the CONNECT. The client is closed when the test ends.
func Dial(t testing.TB, addr string, o Options) (*Client, error) {
	t.Helper()
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	name := o.ClientID
	if o.Username != "" {
		name = o.Username
	}
	c := &Client{t: t, name: name, conn: conn, msgs: make(chan *paho.Publish, 256),
		ended: make(chan struct{}), disconnected: make(chan struct{})}
	c.pc = paho.NewClient(paho.ClientConfig{
		ClientID: o.ClientID,
		Conn:     conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				if o.IgnoreMessages {
					return true, nil
				}
				select {
				case c.msgs <- pr.Packet:
				default:
					t.Errorf("brokertest: %s: message buffer full, dropped %q", c.name, pr.Packet.Topic)
				}
				return true, nil
			},
		},
		OnServerDisconnect: func(d *paho.Disconnect) {
			c.mu.Lock()
			first := c.serverDisc == nil
			c.serverDisc = d
			c.mu.Unlock()
			if first {
				close(c.disconnected)
			}
			c.endedOnce.Do(func() { close(c.ended) })
		},
		OnClientError: func(error) { c.endedOnce.Do(func() { close(c.ended) }) },
	})
	cp := &paho.Connect{ClientID: o.ClientID, KeepAlive: 30, CleanStart: !o.Persistent}
	if o.Persistent {
		cp.Properties = &paho.ConnectProperties{SessionExpiryInterval: &o.SessionExpiry}
	}
	if o.NoProblemInfo {
		if cp.Properties == nil {
			cp.Properties = &paho.ConnectProperties{}
		}
		cp.Properties.RequestProblemInfo = false
	} else if cp.Properties != nil {
		cp.Properties.RequestProblemInfo = true
	}
	if o.Username != "" {
		cp.UsernameFlag, cp.Username = true, o.Username
	}
	if o.Password != "" {
		cp.PasswordFlag, cp.Password = true, []byte(o.Password)
	}
	if o.Will != nil {
		cp.WillMessage = o.Will
		cp.WillProperties = o.WillProperties
		if cp.WillProperties == nil {
			cp.WillProperties = &paho.WillProperties{}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ca, err := c.pc.Connect(ctx, cp)
	if ca != nil && ca.ReasonCode >= 0x80 {
		conn.Close()
		reason := ""
		if ca.Properties != nil {
			reason = ca.Properties.ReasonString
		}
		return nil, &RefusedError{Code: ca.ReasonCode, Reason: reason}
	}
	if err != nil {
		conn.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("connect as %q: no CONNACK: %w", name, err)
		}
		return nil, &RefusedError{Reason: err.Error()}
	}
	t.Cleanup(c.Close)
	return c, nil
}

// MustDial is Dial failing the test on any error.
func MustDial(t testing.TB, addr string, o Options) *Client {
	t.Helper()
	c, err := Dial(t, addr, o)
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	return c
}

// Name is the username (or client ID) the client connected with.
func (c *Client) Name() string { return c.name }

// Paho exposes the underlying client for what the helpers do not cover.
func (c *Client) Paho() *paho.Client { return c.pc }

// Close disconnects politely (no Will); safe to call twice.
func (c *Client) Close() {
	c.mu.Lock()
	c.closedByUs = true
	c.mu.Unlock()
	_ = c.pc.Disconnect(&paho.Disconnect{})
	_ = c.conn.Close()
}

// Drop closes the TCP connection without DISCONNECT, so the Will fires.
func (c *Client) Drop() {
	c.mu.Lock()
	c.closedByUs = true
	c.mu.Unlock()
	_ = c.conn.Close()
}

// Subscribe subscribes to one filter (QoS 1) and returns the SUBACK reason
// code; no SUBACK fails the test.
func (c *Client) Subscribe(filter string) byte {
	c.t.Helper()
	return c.SubscribeWith(paho.SubscribeOptions{Topic: filter, QoS: 1})
}

// SubscribeWith subscribes with the given options.
func (c *Client) SubscribeWith(o paho.SubscribeOptions) byte {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sa, err := c.pc.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{o}})
	if sa != nil && len(sa.Reasons) == 1 {
		return sa.Reasons[0]
	}
	c.t.Fatalf("brokertest: %s: subscribe %q: no SUBACK: %v", c.name, o.Topic, err)
	return 0
}

// Publish publishes payload with QoS 1 and returns the PUBACK reason code;
// no PUBACK fails the test.
func (c *Client) Publish(topic, payload string) byte {
	c.t.Helper()
	pr, err := c.PublishWith(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)})
	if pr != nil {
		return pr.ReasonCode
	}
	c.t.Fatalf("brokertest: %s: publish %q: no PUBACK: %v", c.name, topic, err)
	return 0
}

// PublishWith sends p as is (QoS 0 returns a nil response) within 5 s.
func (c *Client) PublishWith(p *paho.Publish) (*paho.PublishResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.pc.Publish(ctx, p)
}

// Next waits for the next delivered message.
func (c *Client) Next(timeout time.Duration) (*paho.Publish, error) {
	select {
	case p := <-c.msgs:
		return p, nil
	case <-time.After(timeout):
		return nil, errors.New("no message")
	case <-c.pc.Done():
		return nil, errors.New("connection closed")
	}
}

// Expect asserts that the next message is payload on topic and returns it.
func (c *Client) Expect(topic, payload string) *paho.Publish {
	c.t.Helper()
	p, err := c.Next(5 * time.Second)
	if err != nil {
		c.t.Fatalf("brokertest: %s: waiting for %q on %q: %v", c.name, payload, topic, err)
	}
	if p.Topic != topic || string(p.Payload) != payload {
		c.t.Fatalf("brokertest: %s: got %q on %q, want %q on %q", c.name, p.Payload, p.Topic, payload, topic)
	}
	return p
}

// ExpectNothing asserts that no message arrives within d.
func (c *Client) ExpectNothing(d time.Duration) {
	c.t.Helper()
	if p, err := c.Next(d); err == nil {
		c.t.Fatalf("brokertest: %s: unexpected message %q on %q", c.name, p.Payload, p.Topic)
	}
}

// Messages is the channel of delivered messages (for tests that wait on
// several clients at once).
func (c *Client) Messages() <-chan *paho.Publish { return c.msgs }

// Done closes when the connection has ended, for any reason.
func (c *Client) Done() <-chan struct{} { return c.pc.Done() }

// Disconnected reports whether the connection ended within d.
func (c *Client) Disconnected(d time.Duration) bool {
	select {
	case <-c.pc.Done():
		return true
	case <-time.After(d):
		return false
	}
}

// Kicked reports whether the broker ended the connection (the test did not
// close it), and the broker's DISCONNECT reason code when it sent one
// (the embedded broker sends 0x98 administrative action; Mosquitto 2.0.11
// closes the socket).
func (c *Client) Kicked() (kicked bool, reason byte, sent bool) {
	select {
	case <-c.pc.Done():
	default:
		return false, 0, false
	}
	c.mu.Lock()
	byUs := c.closedByUs
	c.mu.Unlock()
	if byUs {
		return false, 0, false
	}
	// paho calls back after it closed the client: wait for the callback, and
	// a little more for the DISCONNECT's when a write error came first.
	select {
	case <-c.ended:
	case <-time.After(2 * time.Second):
	}
	select {
	case <-c.disconnected:
	case <-time.After(50 * time.Millisecond):
		return true, 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return true, c.serverDisc.ReasonCode, true
}

// Kicks describes how the broker ended the connection ("DISCONNECT reason 0x98", or "connection
// closed by the broker"), nil while it is up, after Close or after ResetKicks. The client never
// reconnects, so there is at most one.
func (c *Client) Kicks() []string {
	c.mu.Lock()
	reset := c.kicksReset
	c.mu.Unlock()
	if reset {
		return nil
	}
	kicked, reason, sent := c.Kicked()
	switch {
	case !kicked:
		return nil
	case sent:
		return []string{fmt.Sprintf("DISCONNECT reason 0x%02x", reason)}
	}
	return []string{"connection closed by the broker"}
}

// ResetKicks forgets a disconnect seen so far: Kicks then reports none.
func (c *Client) ResetKicks() {
	select {
	case <-c.pc.Done():
		c.mu.Lock()
		c.kicksReset = true
		c.mu.Unlock()
	default:
	}
}

// Watch counts the clients the broker disconnected among a set of
// connected clients: the witnesses of "this change disconnects nobody else".
type Watch struct {
	clients []*Client
}

// NewWatch watches clients.
func NewWatch(clients ...*Client) *Watch { return &Watch{clients: clients} }

// Add watches more clients.
func (w *Watch) Add(clients ...*Client) { w.clients = append(w.clients, clients...) }

// Kicked lists (sorted) the names of the watched clients the broker
// disconnected so far. It first makes one round trip on every watched
// connection (Sync), so a disconnect the broker already performed is seen,
// without sleeping: both brokers kick before they answer the command that
// caused it.
func (w *Watch) Kicked() []string {
	var out []string
	for _, c := range w.clients {
		c.Sync()
		if k, _, _ := c.Kicked(); k {
			out = append(out, c.Name())
		}
	}
	slices.Sort(out)
	return out
}

// SyncTopic is where Sync publishes; no client is granted it, so the
// broker answers PUBACK 0x87 (or 0x10) and delivers nothing.
const SyncTopic = "$a2a-fleet/brokertest/sync"

// Sync makes one QoS 1 round trip with the broker, so everything the broker
// did to this connection before it is visible (a kick ends the connection
// instead of answering).
func (c *Client) Sync() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	answered := make(chan error, 1)
	go func() {
		pr, err := c.pc.Publish(ctx, &paho.Publish{Topic: SyncTopic, QoS: 1})
		if pr != nil {
			err = nil // a refusal is an answer
		}
		answered <- err
	}()
	select {
	case err := <-answered:
		if err != nil {
			// The connection is gone or going: let paho finish noticing.
			select {
			case <-c.pc.Done():
			case <-ctx.Done():
			}
		}
	case <-c.pc.Done(): // paho may keep a publish pending on a dead connection
	}
}

// reasonPacketIDInUse is the SUBACK reason 0x91.
const reasonPacketIDInUse = 0x91

// SubscribeRetrying subscribes with pc and retries, with a growing pause, a SUBACK refused with
// 0x91 "packet identifier in use": mochi numbers its own deliveries to a client (a retained
// message of the previous SUBSCRIBE, say) from the same identifiers as the client's requests and
// refuses a SUBSCRIBE whose identifier one of them holds; pkg/a2amqtt retries alike.
func SubscribeRetrying(ctx context.Context, pc *paho.Client, s *paho.Subscribe) (*paho.Suback, error) {
	for attempt := 1; ; attempt++ {
		sa, err := pc.Subscribe(ctx, s)
		if sa == nil || len(sa.Reasons) == 0 || sa.Reasons[0] != reasonPacketIDInUse || attempt == 50 {
			return sa, err
		}
		select {
		case <-ctx.Done():
			return sa, err
		case <-time.After(time.Duration(attempt) * 2 * time.Millisecond):
		}
	}
}
