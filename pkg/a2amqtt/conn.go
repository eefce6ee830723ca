package a2amqtt

import (
	"context"
	"crypto/tls"
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
	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"
	"github.com/eclipse/paho.golang/paho/session/state"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
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
	// Credentials, when set, replaces Username and Password: asked for at every CONNECT attempt,
	// so credentials that are rotated (CredentialsDir on the mounted credentials Secret, or a
	// folder kept up to date some other way) are used at the next reconnect, and a refused
	// CONNECT is retried within a second (it may be the moment before the new password arrives).
	Credentials CredentialSource
	// Agent is this client's identity; it becomes the MQTT Client ID.
	Agent AgentRef
	// Card, when set and this process publishes it (CardPublisher), turns on presence: an LWT
	// carrying the card with a2a-status=offline/a2a-status-source=lwt, a retained online card on
	// every (re)connect, and an offline card on Close.
	Card *a2a.AgentCard
	// CardPublisher says who publishes Card (cardpublish.go). The default publishes it, except
	// the card an operator gave the workload (A2A_AGENT_CARD): the operator publishes that one,
	// signed, with the broker's presence, and the agent's own publish would replace the signature.
	CardPublisher CardPublisher
	// CardTrust, when set, verifies every agent card this Conn looks up (Directory,
	// ResolveCard) and refuses the ones that do not verify; Conn.TrustCards changes it later.
	CardTrust *CardTrust
	// KeepAlive defaults to 30s. The broker fires the LWT after 1.5x this
	// without traffic from a vanished client.
	KeepAlive time.Duration
	// ConnectTimeout bounds Connect's wait for the first CONNACK (default
	// 10s). Later reconnects retry forever in the background.
	ConnectTimeout time.Duration
	// FailFast makes Connect return after the first failed attempt instead
	// of retrying until ConnectTimeout (CLIs want "unreachable" at once).
	FailFast bool
	// TLSConfig is used for TLS broker URLs (mqtts://, tls://, ssl://, wss://). Leave it nil and
	// set TLSFiles to build one from PEM files.
	TLSConfig *tls.Config
	// TLSFiles are PEM files (CA bundle, client certificate and key) for a TLS broker URL; see
	// TLSFilesFromEnv for the A2A_TLS_* variables. Setting both TLSFiles and TLSConfig is an error.
	TLSFiles TLSFiles
	// SessionExpiry, when > 0, keeps a persistent MQTT session: every CONNECT (the first one
	// too) carries Clean Start 0 and this Session Expiry Interval, so while the client is away (a
	// process restart, a broker failover, a network cut) the broker keeps its subscriptions and
	// queues the QoS 1 messages for it, and unacknowledged QoS 1 publishes of either side are
	// resent after the reconnect. Messages the broker delivers before the process has subscribed
	// a handler for them are held (bounded, see heldMax/heldTTL) and handed to the first matching
	// Subscribe. Close keeps the session (it expires after SessionExpiry). 0, the default, is a
	// clean session: nothing survives a disconnect, not even a request the broker was sending
	// when it dropped the connection (a credentials rotation kicks the client: docs/sdk.md).
	// Agents (responders) should keep one: DefaultAgentSessionExpiry.
	SessionExpiry time.Duration
	// TracerProvider creates the spans of requests, replies and executions. Default: the
	// global provider (otel.GetTracerProvider), a no-op until the process configures one
	// (internal/telemetry does, from the standard OTEL_* environment).
	TracerProvider trace.TracerProvider
	// Unmatched, when set, receives the messages no Subscribe handler matches instead of the
	// bounded hold above (a process that routes by topic itself, like the conversation service,
	// takes a persistent session's backlog as it arrives right after CONNACK).
	Unmatched func(*paho.Publish)
	Logger    *slog.Logger
}

// Conn is a managed MQTT v5 connection (autopaho: reconnects, resubscribes).
type Conn struct {
	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer
	cm     *autopaho.ConnectionManager
	cancel context.CancelFunc
	card   []byte
	// cardTrust verifies the cards this Conn looks up (TrustCards, cardtrust.go).
	cardTrust atomic.Pointer[CardTrust]

	mu     sync.Mutex
	subs   subIndex
	nextID uint64
	// withheld are the ids of subscriptions whose messages are left unacknowledged for the
	// persistent session's next connection (a draining responder, see withhold).
	withheld map[uint64]bool
	// acks is the paho session of every connection; it can leave a PUBACK unsent.
	acks *ackGate
	// leftInSession counts the messages withheld for the session's next connection.
	leftInSession atomic.Int64
	// held are messages of a persistent session that arrived before any handler matched them;
	// Subscribe hands them to the first matching handler.
	held heldMessages
	// dispatchMu serialises handler calls of the receive goroutine with the hand-over of held
	// messages in Subscribe, so a handler sees held messages before newer ones.
	dispatchMu sync.Mutex
	// calls runs the handlers and knows which one runs since when (Alive).
	calls handlerCalls
	// resubscribe renews the broker subscriptions after a reconnect that lost them.
	resubscribe *resubscriber
	// dispatched counts the QoS 1 messages the handlers were given (or that were held or left
	// in the session): with acks.delivered it tells when every message paho has read so far
	// has been through dispatch (awaitDispatched).
	dispatched atomic.Uint64

	// cli is the paho client that delivered the latest message; stream
	// replies are pipelined through it (see PublishAsync). Reset when the
	// connection drops.
	cli atomic.Pointer[paho.Client]

	aborting atomic.Bool
	closed   atomic.Bool
	// connState is the connection's up/down state and last connect error (ClientSetup).
	connState *ConnState
}

type subEntry struct {
	filter   string // full filter as subscribed
	match    string // filter without $share/{group}/
	handlers map[uint64]func(*paho.Publish)
	// local: unsubscribed at the broker (leaveBroker) but still handled here, so a message
	// already on its way is answered; not renewed after a reconnect.
	local bool
}

// heldMessage is a message of a persistent session that no handler wanted yet.
type heldMessage struct {
	p  *paho.Publish
	at time.Time
}

// Bounds of the held-message buffer of a persistent session: a process subscribes its handlers
// within moments of connecting; what nobody claims within heldTTL is dropped.
const (
	heldMax = 10000
	heldTTL = 2 * time.Minute
)

// Subscription is a handle on one handler registered with Conn.Subscribe.
type Subscription struct {
	c      *Conn
	filter string
	id     uint64
	once   sync.Once
}

// credentialsRetry is how soon a CONNECT refused with credentials from a CredentialSource is
// retried: a rotation rewrites them moments after the broker switched (docs/sdk.md).
const credentialsRetry = time.Second

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
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout // also bounds Connect's wait and the resubscribes
	}
	if cfg.SessionExpiry < 0 {
		return nil, fmt.Errorf("a2amqtt: SessionExpiry %s is negative", cfg.SessionExpiry)
	}
	tlsCfg, err := brokerTLS(u, cfg)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	c := &Conn{
		cfg:    cfg,
		log:    logger.With("mqtt_client_id", cfg.Agent.ClientID()),
		tracer: tp.Tracer(tracerName),
		subs:   newSubIndex(),
		acks:   &ackGate{SessionManager: state.NewInMemory(), clean: cfg.SessionExpiry == 0},
	}
	c.held.log, c.calls.log = c.log, c.log
	c.cardTrust.Store(cfg.CardTrust)
	if c.card, err = publishedCard(cfg); err != nil {
		return nil, err
	}
	if cfg.Card != nil && c.card == nil {
		c.log.Debug("the operator publishes this agent's card; presence comes from the broker")
	}

	firstUp := make(chan struct{})
	var firstOnce sync.Once
	// cmReady orders the assignment of c.cm before any use of it from the
	// OnConnectionUp goroutine (autopaho may connect before NewConnection
	// returns).
	cmReady := make(chan struct{})
	firstFail := make(chan struct{})
	var failOnce sync.Once
	creds := cfg.Credentials
	var refusedRetry time.Duration
	switch {
	case creds != nil && (cfg.Username != "" || cfg.Password != ""):
		return nil, errors.New("a2amqtt: set Credentials or Username and Password, not both")
	case creds == nil:
		creds = StaticCredentials{Username: cfg.Username, Password: []byte(cfg.Password)}
	default:
		refusedRetry = credentialsRetry
	}
	setup := ClientSetup{
		URL:            u,
		TLS:            tlsCfg,
		ClientID:       cfg.Agent.ClientID(),
		Credentials:    creds,
		RefusedRetry:   refusedRetry,
		KeepAlive:      cfg.KeepAlive,
		ConnectTimeout: cfg.ConnectTimeout,
		SessionExpiry:  cfg.SessionExpiry,
		Session:        c.acks,
		Logger:         c.log,
		OnUp: func(cm *autopaho.ConnectionManager, ack *paho.Connack) {
			// Must not block: resubscribe and republish presence in a goroutine.
			// Only a persistent session is trusted to have kept the subscriptions.
			sessionPresent := ack != nil && ack.SessionPresent && cfg.SessionExpiry > 0
			go func() {
				<-cmReady
				c.onUp(cm, sessionPresent)
				firstOnce.Do(func() { close(firstUp) })
			}()
		},
		OnDown: func() { c.cli.Store(nil) },
		OnConnectError: func(error) {
			if cfg.FailFast {
				failOnce.Do(func() { close(firstFail) })
			}
		},
		OnPublish: func(pr paho.PublishReceived) {
			if pr.Client != nil {
				c.cli.Store(pr.Client)
			}
			c.dispatch(pr.Packet)
		},
		Stopping: func() bool { return c.aborting.Load() || c.closed.Load() },
	}
	if c.card != nil {
		setup.Will = &paho.WillMessage{Topic: cfg.Agent.DiscoveryTopic(), Payload: c.card, QoS: 1, Retain: true}
		setup.WillProperties = &paho.WillProperties{
			User: paho.UserProperties{{Key: PropStatus, Value: StatusOffline}, {Key: PropStatusSource, Value: SourceLWT}},
		}
	}
	pcfg, st := setup.Config()
	c.connState = st
	c.resubscribe = &resubscriber{log: c.log, timeout: cfg.ConnectTimeout, state: st, closed: &c.closed,
		subscribe: c.brokerSubscribe, wanted: c.wantsFilter}
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
		return nil, fmt.Errorf("a2amqtt: broker %s unreachable as %s: %w", u.Redacted(), cfg.Agent.ClientID(), c.connState.LastConnectError())
	case <-waitCtx.Done():
		cancel()
		<-cm.Done()
		cause := waitCtx.Err()
		if last := c.connState.LastConnectError(); last != nil {
			cause = last
		}
		return nil, fmt.Errorf("a2amqtt: broker %s unreachable as %s: %w", u.Redacted(), cfg.Agent.ClientID(), cause)
	}
}

// Healthy returns nil while the connection is up, or has been down for less than grace (an
// expected reconnect), and otherwise an error naming how long it has been down and the last
// connect error. Readiness probes of processes built on Conn use it (HealthHandler).
func (c *Conn) Healthy(grace time.Duration) error {
	if c.closed.Load() {
		return errors.New("mqtt connection closed")
	}
	if err := c.stopped(); err != nil {
		return err
	}
	if err := c.connState.Healthy(grace); err != nil {
		return fmt.Errorf("mqtt %w", err)
	}
	return nil
}

// stopped reports a connection manager that ended although nobody closed the Conn: it will
// never reconnect, so only a restart helps.
func (c *Conn) stopped() error {
	if c.cm == nil || c.closed.Load() {
		return nil
	}
	select {
	case <-c.cm.Done():
		return errors.New("mqtt connection manager stopped: the client will not reconnect")
	default:
		return nil
	}
}

// Alive returns nil unless the client is wedged: its connection manager stopped without Close
// (it will never reconnect), or a message handler has been running on the receive goroutine for
// longer than stuck (every other message of the connection waits behind it). A broker that is
// merely down is not a wedge: Healthy reports that. Liveness probes use it (HealthHandler).
func (c *Conn) Alive(stuck time.Duration) error {
	if err := c.stopped(); err != nil {
		return err
	}
	return c.calls.blocked(stuck)
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

// onUp runs after every (re)connect. A clean session (or a persistent one the broker lost) has
// no subscriptions, so every filter is subscribed again before presence says "online"; a resumed
// persistent session still has them, and resubscribing would only make the broker resend
// retained messages.
func (c *Conn) onUp(cm *autopaho.ConnectionManager, sessionPresent bool) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ConnectTimeout)
	defer cancel()
	if !sessionPresent {
		c.mu.Lock()
		filters := make([]string, 0, c.subs.len())
		c.subs.all(func(e *subEntry) {
			if !e.local {
				filters = append(filters, e.filter)
			}
		})
		c.mu.Unlock()
		c.resubscribe.renew(ctx, filters)
	} else {
		c.log.Debug("persistent session resumed; broker kept the subscriptions")
	}
	if c.card != nil {
		if err := c.publishCard(ctx, StatusOnline); err != nil {
			if c.connState.Up() && !c.closed.Load() {
				c.log.Warn("publish online agent card failed", "err", err)
			} else {
				c.log.Debug("publish online agent card interrupted by a disconnect; retried on reconnect", "err", err)
			}
		}
	}
}

// refusedWarnAfter is how long a refused resubscribe may last before it is reported;
// refusedRetryCap is the longest pause between two retries.
const (
	refusedWarnAfter = 7 * time.Second
	refusedRetryCap  = 30 * time.Second
)

// wantsFilter reports whether a handler is subscribed to filter.
func (c *Conn) wantsFilter(filter string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.subs.get(filter) != nil
}

// errSubscribeRefused marks a SUBACK with a failure reason code.
var errSubscribeRefused = errors.New("subscription refused by broker")

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
	return c.publishWithin(ctx, p, 0)
}

// publishWithin is Publish with the wait for a reconnect bounded by reconnectWait (when > 0)
// as well as ctx. The bound is set up only when the connection is actually down: the hot path
// (connected) allocates no timer and no context for it; paho's own packet timeout bounds the
// wait for the PUBACK.
//
// On a clean session, a QoS 1 message the connection took down with it before its PUBACK is
// sent again once the connection is back: paho drops it from a session that is not resumed, so
// nothing else would, and the caller would wait paho's packet timeout for nothing. That is
// QoS 1's at-least-once: the receiver may see it twice (requesters and the conversation
// service take the first answer of a correlation; responders answer a repeated task from
// their task store).
func (c *Conn) publishWithin(ctx context.Context, p *paho.Publish, reconnectWait time.Duration) (*paho.PublishResponse, error) {
	for {
		lost := c.acks.lost.Load()
		resp, err := c.cm.Publish(ctx, p)
		down := errors.Is(err, autopaho.ConnectionDownError)
		if errors.Is(err, session.ErrNoConnection) && ctx.Err() == nil {
			// The session saw the connection go before autopaho did (its AwaitConnection
			// still answers at once): give autopaho a moment to notice.
			down = true
			if serr := sleepCtx(ctx, 5*time.Millisecond); serr != nil {
				return nil, fmt.Errorf("publish to %s: %w", p.Topic, err)
			}
		}
		if !down && err != nil && p.QoS > 0 && c.acks.clean && c.acks.lost.Load() != lost && ctx.Err() == nil {
			c.log.Debug("the connection dropped before the PUBACK; sending the message again on the next connection", "topic", p.Topic, "err", err)
			down = true
		}
		if down && !c.closed.Load() {
			wctx, cancel := ctx, context.CancelFunc(func() {})
			if reconnectWait > 0 {
				wctx, cancel = context.WithTimeout(ctx, reconnectWait)
			}
			werr := c.cm.AwaitConnection(wctx)
			cancel()
			if werr != nil {
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
	return c.publishAsyncWithin(ctx, p, 0)
}

func (c *Conn) publishAsyncWithin(ctx context.Context, p *paho.Publish, reconnectWait time.Duration) error {
	if cli := c.cli.Load(); cli != nil {
		_, err := cli.PublishWithOptions(ctx, p, paho.PublishOptions{Method: paho.PublishMethod_AsyncSend})
		if err == nil {
			return nil
		}
		if errors.Is(err, paho.ErrNetworkErrorAfterStored) {
			if c.cfg.SessionExpiry > 0 {
				// Stored in the persistent session: paho resends it after the reconnect.
				return nil
			}
			// Stored in the session, but a clean session is not resumed,
			// so nothing resends it: report it.
			return fmt.Errorf("publish to %s: %w", p.Topic, err)
		}
		c.log.Debug("async publish failed, falling back to synchronous publish", "err", err)
	}
	_, err := c.publishWithin(ctx, p, reconnectWait)
	return err
}

// Subscribe registers handler for filter (which may carry $share/{group}/)
// and subscribes at QoS 1 if this is the first handler for the filter. The
// handler runs on the client's receive goroutine and must not block (nor call
// Subscribe): every other message of the connection waits behind it, and Alive
// reports a handler stuck for long. A panicking handler is recovered and logged.
// With a persistent session, messages held since the connect that match filter
// are handed to handler first, in arrival order.
func (c *Conn) Subscribe(ctx context.Context, filter string, handler func(*paho.Publish)) (*Subscription, error) {
	c.dispatchMu.Lock()
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	e := c.subs.get(filter)
	if e == nil {
		e = &subEntry{filter: filter, match: stripShare(filter), handlers: map[uint64]func(*paho.Publish){}}
		c.subs.add(e)
	}
	e.handlers[id] = handler
	e.local = false // subscribed at the broker again below
	mine := c.held.claim(e.match)
	c.mu.Unlock()
	for _, p := range mine {
		c.calls.call(handler, p)
	}
	c.dispatchMu.Unlock()
	if len(mine) > 0 {
		c.log.Debug("handed messages held since the session resumed to a new subscription", "filter", filter, "count", len(mine))
	}
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
	sub := &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}
	for attempt := 1; ; attempt++ {
		ack, err := c.cm.Subscribe(ctx, sub)
		if errors.Is(err, autopaho.ConnectionDownError) && !c.closed.Load() {
			// Wait for the reconnect (bounded by ctx) rather than failing: the
			// subscription is also re-established by onUp after reconnecting.
			if werr := c.cm.AwaitConnection(ctx); werr != nil {
				return fmt.Errorf("subscribe %s: connection down: %w", filter, werr)
			}
			continue
		}
		if ack != nil && len(ack.Reasons) > 0 && ack.Reasons[0] >= 0x80 {
			if ack.Reasons[0] == reasonPacketIDInUse && attempt < maxPacketIDAttempts {
				// mochi 2.7.9 checks a resumed session's SUBSCRIBE packet id against the ids of
				// the messages it queued for the client (the other direction's id space) and
				// refuses a collision; paho picks the next id on a retry.
				if err := awaitPacketIDRetry(ctx, attempt); err != nil {
					return fmt.Errorf("subscribe %s: %w", filter, err)
				}
				continue
			}
			// paho reports a refusal as a plain error; keep the reason code.
			return fmt.Errorf("subscribe %s: reason 0x%02x: %w", filter, ack.Reasons[0], errSubscribeRefused)
		}
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", filter, err)
		}
		return nil
	}
}

// reasonPacketIDInUse is the SUBACK reason code 0x91.
const reasonPacketIDInUse = 0x91

// withhold stops handing this subscription the messages only it matches: on a persistent
// session they stay unacknowledged, so the broker keeps them and delivers them again on the
// session's next connection. A draining responder uses it so that requests arriving while it
// finishes its in-flight work wait for the next process instead of being refused. On a clean
// session (or for QoS 0) nothing can keep a message, and the handler still receives it.
func (s *Subscription) withhold() {
	c := s.c
	c.dispatchMu.Lock() // not in the middle of a dispatch: every later message sees it
	defer c.dispatchMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.withheld == nil {
		c.withheld = map[uint64]bool{}
	}
	c.withheld[s.id] = true
}

// leaveBroker unsubscribes the filter at the broker but keeps the handler: a message the broker
// routed before it processed the UNSUBSCRIBE may still be on its way (paho hands PUBLISH
// packets to the handlers after it has read the UNSUBACK), and it reaches the handler instead
// of being dropped. Other handlers of the same filter keep the broker subscription.
func (s *Subscription) leaveBroker(ctx context.Context) error {
	c := s.c
	c.mu.Lock()
	e := c.subs.get(s.filter)
	if e == nil || len(e.handlers) != 1 || c.closed.Load() {
		c.mu.Unlock()
		return nil
	}
	e.local = true
	c.mu.Unlock()
	err := c.brokerUnsubscribe(ctx, s.filter)
	if err != nil && !errors.Is(err, autopaho.ConnectionDownError) {
		return err
	}
	if err == nil {
		// Every message the broker routed before the UNSUBSCRIBE has been read by now (it
		// came before the UNSUBACK), but paho may still hold some in its queue to the
		// handlers: wait until they have been through dispatch, so the caller (a draining
		// responder) counts them before it waits for its requests in flight.
		if err := c.awaitDispatched(ctx, c.acks.delivered.Load()); err != nil {
			return fmt.Errorf("unsubscribe %s: messages read before the UNSUBACK: %w", s.filter, err)
		}
	}
	return nil
}

// brokerUnsubscribe removes the broker subscription of filter. mochi 2.7.9 refuses an
// UNSUBSCRIBE whose packet id collides with one of the messages it has in flight to the client
// (the other direction's id space; likely when a busy responder drains): paho picks the next
// id on a retry, as for SUBSCRIBE (brokerSubscribe). Both sides number their packets in
// sequence, so the next ids tend to collide too while the broker's deliveries are in flight
// (seen: 5 retries in a row refused with 1 327 requests arriving): the retries wait a little
// longer each time for those deliveries to be acknowledged (awaitPacketIDRetry).
func (c *Conn) brokerUnsubscribe(ctx context.Context, filter string) error {
	for attempt := 1; ; attempt++ {
		ack, err := c.cm.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{filter}})
		if ack != nil && len(ack.Reasons) > 0 && ack.Reasons[0] == reasonPacketIDInUse && attempt < maxPacketIDAttempts {
			if err := awaitPacketIDRetry(ctx, attempt); err != nil {
				return fmt.Errorf("unsubscribe %s: %w", filter, err)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("unsubscribe %s: %w", filter, err)
		}
		return nil
	}
}

// maxPacketIDAttempts bounds the attempts of a SUBSCRIBE or UNSUBSCRIBE the broker refused
// with "packet identifier in use" (0x91).
const maxPacketIDAttempts = 50

// awaitPacketIDRetry waits before attempt+1 of such a refused packet: a millisecond more each
// time (20 at most), so the broker's deliveries in flight, whose ids collide, get acknowledged.
func awaitPacketIDRetry(ctx context.Context, attempt int) error {
	return sleepCtx(ctx, time.Duration(min(attempt, 20))*time.Millisecond)
}

// awaitDispatched returns once dispatch has been through the first n QoS 1 messages paho
// read, or when ctx ends.
func (c *Conn) awaitDispatched(ctx context.Context, n uint64) error {
	for c.dispatched.Load() < n {
		if err := sleepCtx(ctx, time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// ackGate is the paho session state of a Conn (autopaho keeps one for all its connections)
// that can leave the PUBACK of one delivered message unsent: paho acknowledges a QoS 1
// message on the receive goroutine right after the handlers returned, so dispatch marks the
// packet id it withholds and the Ack that follows is skipped. paho's manual acknowledgement
// mode would do the same but flushes acks on a 50 ms ticker, which would slow every delivery
// down.
type ackGate struct {
	session.SessionManager
	skip atomic.Uint32 // packet id + 1 of the withheld message; 0: none
	n    notices       // PublishNotify messages waiting for their PUBACK (pubnotify.go)
	// clean: the session ends with each connection (no Session Expiry), so paho drops the
	// messages still waiting for their PUBACK when the connection is lost, without a word
	// to the publishers waiting for them: ConnectionLost wakes them (waiting) and counts
	// the loss (lost), so publishWithin sends them again.
	clean bool
	lost  atomic.Uint64
	// delivered counts the QoS 1 messages paho has read and queued for the handlers.
	delivered atomic.Uint64
}

func (g *ackGate) withhold(id uint16) { g.skip.Store(uint32(id) + 1) }

// Ack implements session.SessionManager.
func (g *ackGate) Ack(pb *packets.Publish) error {
	if v := g.skip.Load(); v != 0 && uint16(v-1) == pb.PacketID && g.skip.CompareAndSwap(v, 0) {
		return nil
	}
	return g.SessionManager.Ack(pb)
}

// remove drops the handler and reports whether the filter has no handlers
// left (so the broker subscription can go).
func (s *Subscription) remove() bool {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.subs.get(s.filter)
	if e == nil {
		return false
	}
	delete(e.handlers, s.id)
	delete(c.withheld, s.id)
	if len(e.handlers) == 0 {
		c.subs.remove(s.filter)
		return true
	}
	return false
}

// Close removes the handler and unsubscribes when it was the last one.
func (s *Subscription) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		if s.remove() && !s.c.closed.Load() {
			if uerr := s.c.brokerUnsubscribe(ctx, s.filter); uerr != nil && !errors.Is(uerr, autopaho.ConnectionDownError) {
				err = uerr
			}
		}
	})
	return err
}

func (c *Conn) dispatch(p *paho.Publish) {
	if p.QoS == 1 {
		defer c.dispatched.Add(1)
	}
	if p.Properties == nil {
		p.Properties = &paho.PublishProperties{}
	}
	c.dispatchMu.Lock()
	defer c.dispatchMu.Unlock()
	c.mu.Lock()
	var hs []func(*paho.Publish)
	withheld := 0
	c.subs.each(p.Topic, func(e *subEntry) {
		for id, h := range e.handlers {
			if c.withheld[id] {
				withheld++
				continue
			}
			hs = append(hs, h)
		}
	})
	if len(hs) == 0 && withheld > 0 && p.QoS > 0 && c.cfg.SessionExpiry > 0 {
		// Only withheld subscriptions want it: no handler sees it and no PUBACK is sent, so the
		// broker keeps it in the session and delivers it again on the session's next connection
		// (the next process of a draining agent).
		c.acks.withhold(p.PacketID)
		c.leftInSession.Add(1)
		c.mu.Unlock()
		c.log.Debug("left a message unacknowledged for the session's next connection", "topic", p.Topic)
		return
	}
	if len(hs) == 0 && withheld > 0 {
		// Nothing can keep it (a clean session, QoS 0): the withheld handlers answer it.
		c.subs.each(p.Topic, func(e *subEntry) {
			for _, h := range e.handlers {
				hs = append(hs, h)
			}
		})
	}
	unmatched := len(hs) == 0 && c.cfg.Unmatched != nil
	if len(hs) == 0 && !unmatched && c.cfg.SessionExpiry > 0 {
		c.held.hold(p)
	}
	c.mu.Unlock()
	if unmatched {
		c.calls.call(c.cfg.Unmatched, p)
		return
	}
	for _, h := range hs {
		c.calls.call(h, p)
	}
}

// ClearCard deletes the retained agent card (unregister), using the
// broker's retained-delete mechanism: an empty retained publish.
func (c *Conn) ClearCard(ctx context.Context) error {
	_, err := c.Publish(ctx, &paho.Publish{Topic: c.cfg.Agent.DiscoveryTopic(), QoS: 1, Retain: true})
	return err
}

// closePublishTimeout bounds the offline-card publish of Close.
const closePublishTimeout = 5 * time.Second

// Close publishes the offline card (when presence is on) and disconnects
// cleanly, so the broker discards the LWT.
func (c *Conn) Close(ctx context.Context) error {
	if c.closed.Load() {
		return nil
	}
	var errs []error
	// The offline card only while connected: when the connection is down the broker has
	// already published the LWT (or never had a session), and waiting for a reconnect here
	// would hang a shutdown for as long as the broker is away.
	if c.card != nil && !c.aborting.Load() && c.connState.Up() {
		pctx, cancel := context.WithTimeout(ctx, closePublishTimeout)
		if err := c.publishCard(pctx, StatusOffline); err != nil {
			errs = append(errs, fmt.Errorf("publish offline card: %w", err))
		}
		cancel()
	}
	c.closed.Store(true)
	if n := c.leftInSession.Load(); n > 0 {
		c.log.Info("left unacknowledged messages in the persistent session for the next process", "count", n)
	}
	if err := c.cm.Disconnect(ctx); err != nil && !errors.Is(err, autopaho.ConnectionDownError) {
		errs = append(errs, fmt.Errorf("disconnect: %w", err))
	}
	c.cancel()
	// autopaho does not close a session it was given: what still waits for a PUBACK
	// hears now that none will come.
	c.acks.dropAll()
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
	c.acks.dropAll()
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
