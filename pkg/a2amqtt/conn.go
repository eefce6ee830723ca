package a2amqtt

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
)

// MQTT v5 user properties defined by the profile.
const (
	PropStatus           = "a2a-status"
	PropStatusSource     = "a2a-status-source"
	PropResponderAgentID = "a2a-responder-agent-id"
	PropContextID        = "a2a-context-id"
	PropAuthorization    = "a2a-authorization"
)

// Presence values for PropStatus / PropStatusSource.
const (
	StatusOnline  = "online"
	StatusOffline = "offline"

	SourceAgent  = "agent"
	SourceLWT    = "lwt"
	SourceBroker = "broker"
)

// PUBACK reason code 0x10: accepted, but nobody subscribes to the topic.
const reasonNoMatchingSubscribers = 0x10

// Config describes one MQTT v5 connection under one agent identity. The
// profile fixes the Client ID to {org}/{unit}/{agent}, so a process that is
// both requester and responder for the same agent shares one Conn.
type Config struct {
	// BrokerURL is e.g. mqtt://127.0.0.1:1883 (also tcp://, tls://,
	// mqtts://, ws://, wss://).
	BrokerURL string
	Username  string
	Password  string
	// Agent is this client's identity; it becomes the MQTT Client ID.
	Agent AgentRef
	// Card, when set, turns on presence: an LWT carrying the card with
	// a2a-status=offline/a2a-status-source=lwt, a retained online card on
	// every (re)connect, and an offline card on Close.
	Card *a2a.AgentCard
	// KeepAlive defaults to 30s. The broker fires the LWT after 1.5x this
	// without traffic from a vanished client.
	KeepAlive time.Duration
	// ConnectTimeout bounds Connect's wait for the first CONNACK (default
	// 10s). Later reconnects retry forever in the background.
	ConnectTimeout time.Duration
	// FailFast makes Connect return after the first failed attempt instead
	// of retrying until ConnectTimeout (CLIs want "unreachable" at once).
	FailFast  bool
	TLSConfig *tls.Config
	Logger    *slog.Logger
	// SessionExpiry > 0 makes the session persistent: Clean Start is false
	// on every connection and the broker keeps the session (subscriptions,
	// QoS 1 messages queued for them) this long after a disconnect, so
	// messages published while the process restarts are delivered when it
	// reconnects with the same client id. 0: clean start, as before.
	SessionExpiry time.Duration
	// Unmatched receives messages no Subscribe handler matches. With a
	// persistent session the broker delivers what it queued right after
	// CONNACK, before the process has registered its handlers again.
	Unmatched func(*paho.Publish)
}

// Conn is a managed MQTT v5 connection (autopaho: reconnects, resubscribes).
type Conn struct {
	cfg    Config
	log    *slog.Logger
	cm     *autopaho.ConnectionManager
	cancel context.CancelFunc
	card   []byte

	mu     sync.Mutex
	subs   map[string]*subEntry // by full filter (incl. $share prefix)
	nextID uint64

	// cli is the paho client that delivered the latest message; stream
	// replies are pipelined through it (see PublishAsync).
	cli atomic.Pointer[paho.Client]

	aborting atomic.Bool
	closed   atomic.Bool
	// connErr is the last connect error. An atomic.Pointer, not an atomic.Value: a Value panics
	// when a later Store has another concrete type (a dial error, then a CONNACK refusal), and
	// that panic inside autopaho's connection goroutine froze the client for ever.
	connErr atomic.Pointer[error]
	// up is true while a connection is established; downSince is when it was last lost (unix
	// nanoseconds, 0 before the first connection). Health checks read them.
	up        atomic.Bool
	downSince atomic.Int64
}

type subEntry struct {
	filter   string // full filter as subscribed
	match    string // filter without $share/{group}/
	handlers map[uint64]func(*paho.Publish)
}

// Subscription is a handle on one handler registered with Conn.Subscribe.
type Subscription struct {
	c      *Conn
	filter string
	id     uint64
	once   sync.Once
}

// Connect dials the broker and waits until the first connection is up (or
// ConnectTimeout/ctx expire), so callers get a clear "broker unreachable"
// error instead of a silently retrying client.
func Connect(ctx context.Context, cfg Config) (*Conn, error) {
	if err := cfg.Agent.Validate(); err != nil {
		return nil, fmt.Errorf("a2amqtt: %w", err)
	}
	u, err := ParseBrokerURL(cfg.BrokerURL)
	if err != nil {
		return nil, err
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 30 * time.Second
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	c := &Conn{cfg: cfg, log: logger.With("mqtt_client_id", cfg.Agent.ClientID()), subs: map[string]*subEntry{}}
	if cfg.Card != nil {
		if c.card, err = json.Marshal(cfg.Card); err != nil {
			return nil, fmt.Errorf("a2amqtt: encode agent card: %w", err)
		}
	}

	firstUp := make(chan struct{})
	var firstOnce sync.Once
	// cmReady orders the assignment of c.cm before any use of it from the
	// OnConnectionUp goroutine (autopaho may connect before NewConnection
	// returns).
	cmReady := make(chan struct{})
	firstFail := make(chan struct{})
	var failOnce sync.Once
	pcfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{u},
		TlsCfg:                        cfg.TLSConfig,
		KeepAlive:                     uint16(cfg.KeepAlive / time.Second),
		CleanStartOnInitialConnection: cfg.SessionExpiry <= 0,
		SessionExpiryInterval:         uint32(cfg.SessionExpiry / time.Second),
		ConnectPacketBuilder: func(cp *paho.Connect, _ *url.URL) (*paho.Connect, error) {
			if cp.Properties != nil {
				// paho encodes an unset bool as Request Problem Information 0
				// once any CONNECT property is set (the session expiry), and
				// mochi then strips user properties from every PUBLISH it
				// delivers (a2a-context-id, traceparent): ask for them.
				cp.Properties.RequestProblemInfo = true
			}
			return cp, nil
		},
		ConnectTimeout:   cfg.ConnectTimeout,
		ReconnectBackoff: reconnectBackoff,
		ConnectUsername:  cfg.Username,
		ConnectPassword:  []byte(cfg.Password),
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			// Must not block: resubscribe and republish presence in a goroutine.
			go func() {
				<-cmReady
				c.onUp(cm)
				firstOnce.Do(func() { close(firstUp) })
			}()
		},
		OnConnectionDown: func() bool {
			c.up.Store(false)
			c.downSince.Store(time.Now().UnixNano())
			c.log.Debug("mqtt connection down")
			return !c.aborting.Load() && !c.closed.Load()
		},
		OnConnectError: func(err error) {
			c.connErr.Store(&err)
			if cfg.FailFast {
				failOnce.Do(func() { close(firstFail) })
			}
			c.log.Debug("mqtt connect attempt failed", "err", err)
		},
		ClientConfig: paho.ClientConfig{
			ClientID: cfg.Agent.ClientID(),
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){
				func(pr paho.PublishReceived) (bool, error) {
					if pr.Client != nil {
						c.cli.Store(pr.Client)
					}
					c.dispatch(pr.Packet)
					return true, nil
				},
			},
			OnClientError: func(err error) { c.log.Debug("mqtt client error", "err", err) },
			OnServerDisconnect: func(d *paho.Disconnect) {
				c.log.Warn("broker sent DISCONNECT", "reason", d.ReasonCode)
			},
		},
	}
	if c.card != nil {
		pcfg.WillMessage = &paho.WillMessage{Topic: cfg.Agent.DiscoveryTopic(), Payload: c.card, QoS: 1, Retain: true}
		pcfg.WillProperties = &paho.WillProperties{
			User: paho.UserProperties{{Key: PropStatus, Value: StatusOffline}, {Key: PropStatusSource, Value: SourceLWT}},
		}
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	cm, err := autopaho.NewConnection(runCtx, pcfg)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("a2amqtt: start connection to %s: %w", u.Redacted(), err)
	}
	c.cm = cm
	close(cmReady)

	waitCtx, waitCancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer waitCancel()
	select {
	case <-firstUp:
		return c, nil
	case <-firstFail:
		cancel()
		<-cm.Done()
		return nil, fmt.Errorf("a2amqtt: broker %s unreachable as %s: %w", u.Redacted(), cfg.Agent.ClientID(), c.lastConnErr())
	case <-waitCtx.Done():
		cancel()
		<-cm.Done()
		cause := waitCtx.Err()
		if last := c.lastConnErr(); last != nil {
			cause = last
		}
		return nil, fmt.Errorf("a2amqtt: broker %s unreachable as %s: %w", u.Redacted(), cfg.Agent.ClientID(), cause)
	}
}

func (c *Conn) lastConnErr() error {
	if p := c.connErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Healthy returns nil while the connection is up, or has been down for less than grace (an
// expected reconnect), and otherwise an error naming how long it has been down and the last
// connect error. Readiness probes of processes built on Conn use it.
func (c *Conn) Healthy(grace time.Duration) error {
	if c.closed.Load() {
		return errors.New("mqtt connection closed")
	}
	if c.up.Load() {
		return nil
	}
	since := c.downSince.Load()
	if since == 0 {
		return errors.New("mqtt connection not established yet")
	}
	down := time.Since(time.Unix(0, since))
	if down < grace {
		return nil
	}
	if err := c.lastConnErr(); err != nil {
		return fmt.Errorf("mqtt connection down for %s: %w", down.Round(time.Second), err)
	}
	return fmt.Errorf("mqtt connection down for %s", down.Round(time.Second))
}

// reconnectBackoff: autopaho waits backoff(0) before every connection
// sequence, including the very first, so attempt 0 must be immediate.
func reconnectBackoff(attempt int) time.Duration {
	if attempt == 0 {
		return 0
	}
	d := time.Duration(250*(1<<min(attempt-1, 5))) * time.Millisecond
	return min(d, 5*time.Second)
}

// ParseBrokerURL parses a broker address: mqtt:// (default when no scheme is given), tcp://,
// tls://, ssl://, mqtts://, ws:// or wss://, with the default MQTT ports filled in.
func ParseBrokerURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, errors.New("a2amqtt: broker URL is required (e.g. mqtt://127.0.0.1:1883)")
	}
	if !strings.Contains(raw, "://") {
		raw = "mqtt://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: broker URL %q: %w", raw, err)
	}
	switch u.Scheme {
	case "mqtt", "tcp", "tls", "ssl", "mqtts", "ws", "wss":
	default:
		return nil, fmt.Errorf("a2amqtt: broker URL %q: unsupported scheme %q", raw, u.Scheme)
	}
	if u.Port() == "" {
		switch u.Scheme {
		case "mqtt", "tcp":
			u.Host += ":1883"
		case "tls", "ssl", "mqtts":
			u.Host += ":8883"
		}
	}
	return u, nil
}

// onUp runs after every (re)connect: the session is clean, so every
// subscription is re-established before presence says "online".
func (c *Conn) onUp(cm *autopaho.ConnectionManager) {
	c.up.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ConnectTimeout)
	defer cancel()
	c.mu.Lock()
	filters := make([]string, 0, len(c.subs))
	for f := range c.subs {
		filters = append(filters, f)
	}
	c.mu.Unlock()
	for _, f := range filters {
		if err := c.brokerSubscribe(ctx, f); err != nil {
			c.log.Error("resubscribe failed", "filter", f, "err", err)
		}
	}
	if c.card != nil {
		if err := c.publishCard(ctx, StatusOnline); err != nil {
			c.log.Error("publish online agent card failed", "err", err)
		}
	}
}

func (c *Conn) publishCard(ctx context.Context, status string) error {
	_, err := c.Publish(ctx, &paho.Publish{
		Topic:   c.cfg.Agent.DiscoveryTopic(),
		QoS:     1,
		Retain:  true,
		Payload: c.card,
		Properties: &paho.PublishProperties{
			ContentType: "application/json",
			User:        paho.UserProperties{{Key: PropStatus, Value: status}, {Key: PropStatusSource, Value: SourceAgent}},
		},
	})
	return err
}

// Agent returns the connection's identity.
func (c *Conn) Agent() AgentRef { return c.cfg.Agent }

// Logger returns the connection's logger.
func (c *Conn) Logger() *slog.Logger { return c.log }

// Publish sends a message and treats PUBACK reason codes >= 0x80 as errors.
// When the connection is momentarily down it waits (bounded by ctx) for the
// reconnect instead of failing at once.
func (c *Conn) Publish(ctx context.Context, p *paho.Publish) (*paho.PublishResponse, error) {
	for {
		resp, err := c.cm.Publish(ctx, p)
		if errors.Is(err, autopaho.ConnectionDownError) && !c.closed.Load() {
			if werr := c.cm.AwaitConnection(ctx); werr != nil {
				return nil, fmt.Errorf("publish to %s: connection down: %w", p.Topic, werr)
			}
			continue
		}
		if err != nil {
			return resp, fmt.Errorf("publish to %s: %w", p.Topic, err)
		}
		if resp != nil && resp.ReasonCode >= 0x80 {
			reason := ""
			if resp.Properties != nil {
				reason = resp.Properties.ReasonString
			}
			return resp, fmt.Errorf("publish to %s refused by broker: reason 0x%02x %s", p.Topic, resp.ReasonCode, reason)
		}
		return resp, nil
	}
}

// PublishAsync sends a QoS 1 message in order with earlier PublishAsync
// calls but without waiting for its PUBACK, so consecutive stream items
// are pipelined instead of paying one broker round trip each. Delivery
// errors after the send are not reported (the requester's stream idle
// timeout and GetTask recovery cover a lost item). It falls back to the
// synchronous Publish when no live client is known.
func (c *Conn) PublishAsync(ctx context.Context, p *paho.Publish) error {
	if cli := c.cli.Load(); cli != nil {
		_, err := cli.PublishWithOptions(ctx, p, paho.PublishOptions{Method: paho.PublishMethod_AsyncSend})
		if err == nil {
			return nil
		}
		if errors.Is(err, paho.ErrNetworkErrorAfterStored) {
			// Stored in the session; autopaho does not resend after a
			// clean-start reconnect, so report it.
			return fmt.Errorf("publish to %s: %w", p.Topic, err)
		}
		c.log.Debug("async publish failed, falling back to synchronous publish", "err", err)
	}
	_, err := c.Publish(ctx, p)
	return err
}

// Subscribe registers handler for filter (which may carry $share/{group}/)
// and subscribes at QoS 1 if this is the first handler for the filter. The
// handler runs on the client's receive goroutine and must not block.
func (c *Conn) Subscribe(ctx context.Context, filter string, handler func(*paho.Publish)) (*Subscription, error) {
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	e, exists := c.subs[filter]
	if !exists {
		e = &subEntry{filter: filter, match: stripShare(filter), handlers: map[uint64]func(*paho.Publish){}}
		c.subs[filter] = e
	}
	e.handlers[id] = handler
	c.mu.Unlock()
	s := &Subscription{c: c, filter: filter, id: id}
	// Always (re)subscribe: for retained topics a fresh SUBSCRIBE makes the
	// broker resend the retained message to the new handler.
	if err := c.brokerSubscribe(ctx, filter); err != nil {
		s.remove()
		return nil, err
	}
	return s, nil
}

func (c *Conn) brokerSubscribe(ctx context.Context, filter string) error {
	ack, err := c.cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	for errors.Is(err, autopaho.ConnectionDownError) && !c.closed.Load() {
		// Wait for the reconnect (bounded by ctx) rather than failing: the
		// subscription is also re-established by onUp after reconnecting.
		if werr := c.cm.AwaitConnection(ctx); werr != nil {
			return fmt.Errorf("subscribe %s: connection down: %w", filter, werr)
		}
		ack, err = c.cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	}
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", filter, err)
	}
	if ack != nil && len(ack.Reasons) > 0 && ack.Reasons[0] >= 0x80 {
		return fmt.Errorf("subscribe %s refused by broker: reason 0x%02x", filter, ack.Reasons[0])
	}
	return nil
}

// remove drops the handler and reports whether the filter has no handlers
// left (so the broker subscription can go).
func (s *Subscription) remove() bool {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.subs[s.filter]
	if e == nil {
		return false
	}
	delete(e.handlers, s.id)
	if len(e.handlers) == 0 {
		delete(c.subs, s.filter)
		return true
	}
	return false
}

// Close removes the handler and unsubscribes when it was the last one.
func (s *Subscription) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		if s.remove() && !s.c.closed.Load() {
			_, uerr := s.c.cm.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{s.filter}})
			if uerr != nil && !errors.Is(uerr, autopaho.ConnectionDownError) {
				err = fmt.Errorf("unsubscribe %s: %w", s.filter, uerr)
			}
		}
	})
	return err
}

func (c *Conn) dispatch(p *paho.Publish) {
	c.mu.Lock()
	var hs []func(*paho.Publish)
	for _, e := range c.subs {
		if topicMatches(e.match, p.Topic) {
			for _, h := range e.handlers {
				hs = append(hs, h)
			}
		}
	}
	c.mu.Unlock()
	if p.Properties == nil {
		p.Properties = &paho.PublishProperties{}
	}
	if len(hs) == 0 && c.cfg.Unmatched != nil {
		c.cfg.Unmatched(p)
		return
	}
	for _, h := range hs {
		h(p)
	}
}

// ClearCard deletes the retained agent card (unregister), using the
// broker's retained-delete mechanism: an empty retained publish.
func (c *Conn) ClearCard(ctx context.Context) error {
	_, err := c.Publish(ctx, &paho.Publish{Topic: c.cfg.Agent.DiscoveryTopic(), QoS: 1, Retain: true})
	return err
}

// Close publishes the offline card (when presence is on) and disconnects
// cleanly, so the broker discards the LWT.
func (c *Conn) Close(ctx context.Context) error {
	if c.closed.Load() {
		return nil
	}
	var errs []error
	if c.card != nil && !c.aborting.Load() {
		if err := c.publishCard(ctx, StatusOffline); err != nil {
			errs = append(errs, fmt.Errorf("publish offline card: %w", err))
		}
	}
	c.closed.Store(true)
	if err := c.cm.Disconnect(ctx); err != nil && !errors.Is(err, autopaho.ConnectionDownError) {
		errs = append(errs, fmt.Errorf("disconnect: %w", err))
	}
	c.cancel()
	return errors.Join(errs...)
}

// Abort drops the network connection without DISCONNECT and stops
// reconnecting, exactly as a crash or network loss would look to the broker
// (which then publishes the LWT). Meant for tests and chaos tooling.
func (c *Conn) Abort() {
	c.aborting.Store(true)
	c.cm.TerminateConnectionForTest()
	c.closed.Store(true)
	c.cancel()
}

// Done is closed when the connection manager has stopped.
func (c *Conn) Done() <-chan struct{} { return c.cm.Done() }

func stripShare(filter string) string {
	if !strings.HasPrefix(filter, "$share/") {
		return filter
	}
	rest := strings.TrimPrefix(filter, "$share/")
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		return rest[i+1:]
	}
	return rest
}

// topicMatches implements MQTT topic filter matching (+ and #). Topics that
// start with '$' are not matched by a leading wildcard (MQTT-4.7.2-1).
func topicMatches(filter, topic string) bool {
	if filter == topic {
		return true
	}
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	fs := strings.Split(filter, "/")
	ts := strings.Split(topic, "/")
	for i, f := range fs {
		if f == "#" {
			return true
		}
		if i >= len(ts) {
			return false
		}
		if f != "+" && f != ts[i] {
			return false
		}
	}
	return len(fs) == len(ts)
}
