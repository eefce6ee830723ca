// Package session is the one autopaho setup of the operator's own broker
// connections (the dynsec admin connection and the card publisher): a
// connection that lives as long as the context it was started with,
// reconnects for ever with a short backoff, renews its subscriptions on
// every connection before anyone uses it, and says whether it is healthy.
//
// Each connection is a Link: callers wait for the current link to be
// ready and watch it go down, so a request in flight on a dying connection
// fails fast instead of waiting for a reply that went to the dead session.
package session

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Config configures Start.
type Config struct {
	// URL of the broker (a2amqtt.ParseBrokerURL forms: mqtt://, tls://, …).
	URL string
	// TLS is used with tls:// URLs.
	TLS *tls.Config
	// Username of the connection; Password is asked for at every connection
	// attempt, so a rotated password is used from the next reconnect on.
	Username string
	Password func() []byte
	// ClientID of the connection (sessions are clean: nothing is kept).
	ClientID string
	// KeepAlive (default 30s) and ConnectTimeout (default 10s), as in a2amqtt.ClientSetup.
	KeepAlive      time.Duration
	ConnectTimeout time.Duration
	// PacketTimeout bounds paho's wait for an acknowledgement (default 10s).
	// Mosquitto answers the PUBACK of a $CONTROL message only after the
	// plugin ran every command in it, which takes seconds on a large dynsec
	// configuration: the dynsec backend raises it to its request timeout.
	PacketTimeout time.Duration
	// Subscriptions are renewed after every (re)connection; the link is
	// ready only once the broker granted all of them.
	Subscriptions []paho.SubscribeOptions
	// OnMessage receives every PUBLISH (from the connection's goroutine:
	// must not block for long).
	OnMessage func(*paho.Publish)
	// OnReady runs in its own goroutine every time a link becomes ready;
	// ctx ends when that link goes down (or the session ends). The first
	// call may come before Start has returned: a callback that uses the
	// caller's stored *Session waits until the caller has stored it.
	OnReady func(ctx context.Context, l *Link)
	// OnDown is called when a ready or connecting link drops, before the
	// reconnect (from autopaho's goroutine: must not block).
	OnDown func()
	// OnRefused is called when the broker refuses the CONNECT (CONNACK
	// reason >= 0x80), e.g. because the user does not exist any more.
	OnRefused func(error)
	// Logger for connection state changes (default slog.Default()). A
	// reconnect is expected and logged at Info, not as an error.
	Logger *slog.Logger
	// Name labels log lines ("dynsec admin", "card publisher").
	Name string
}

// Session is a running connection.
type Session struct {
	cfg Config
	log *slog.Logger
	cm  *autopaho.ConnectionManager
	ctx context.Context

	mu   sync.Mutex
	link *Link

	// state is the connection's up/down state and last connect error (a2amqtt.ClientSetup).
	state *a2amqtt.ConnState
	done  chan struct{}
}

// Link is one connection's lifetime: Ready closes once its subscriptions are
// in place (Err says whether that worked), Gone closes when it drops.
type Link struct {
	ready chan struct{}
	gone  chan struct{}
	err   error
	down  bool
	ctx   context.Context
	stop  context.CancelFunc
}

func newLink(parent context.Context) *Link {
	ctx, stop := context.WithCancel(parent)
	return &Link{ready: make(chan struct{}), gone: make(chan struct{}), ctx: ctx, stop: stop}
}

// Gone closes when the connection drops.
func (l *Link) Gone() <-chan struct{} { return l.gone }

// ErrClosed is returned once the session's context has ended.
var ErrClosed = errors.New("broker connection closed")

// Start opens the connection in the background and returns at once: the
// connection (and every reconnect) lives until ctx ends. Use AwaitReady to
// wait for it.
func Start(ctx context.Context, cfg Config) (*Session, error) {
	u, err := a2amqtt.ParseBrokerURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = a2amqtt.DefaultConnectTimeout // also bounds the subscriptions of prepare
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Session{cfg: cfg, ctx: ctx, log: cfg.Logger.With("connection", cfg.Name, "broker", u.Redacted(), "clientID", cfg.ClientID), done: make(chan struct{})}
	s.link = newLink(ctx)
	// The SDK's autopaho setup: a clean session on every connect (nothing is kept:
	// subscriptions are renewed on every connection), the password asked for at every attempt,
	// the shared reconnect backoff and quiet connection logs.
	pcfg, st := a2amqtt.ClientSetup{
		URL:            u,
		TLS:            cfg.TLS,
		ClientID:       cfg.ClientID,
		Username:       cfg.Username,
		Password:       cfg.Password,
		KeepAlive:      cfg.KeepAlive,
		ConnectTimeout: cfg.ConnectTimeout,
		PacketTimeout:  cfg.PacketTimeout,
		Logger:         s.log,
		OnUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			s.mu.Lock()
			l := s.link
			s.mu.Unlock()
			go s.prepare(cm, l) // must not block autopaho
		},
		OnDown:   s.connectionDown,
		Stopping: func() bool { return ctx.Err() != nil },
		OnConnectError: func(err error) {
			var ce *autopaho.ConnackError
			if errors.As(err, &ce) && cfg.OnRefused != nil {
				cfg.OnRefused(err)
			}
		},
		OnPublish: func(pr paho.PublishReceived) {
			if cfg.OnMessage != nil {
				cfg.OnMessage(pr.Packet)
			}
		},
	}.Config()
	s.state = st
	cm, err := autopaho.NewConnection(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("%s: start connection to %s: %w", cfg.Name, u.Redacted(), err)
	}
	s.cm = cm
	go func() {
		<-cm.Done()
		s.mu.Lock()
		l := s.link
		if !l.down {
			l.down = true
			select {
			case <-l.ready:
			default:
				l.err = ErrClosed
				close(l.ready)
			}
			close(l.gone)
			l.stop()
		}
		s.mu.Unlock()
		close(s.done)
	}()
	return s, nil
}

// prepare renews the subscriptions of a new connection, then marks its link
// ready and runs OnReady.
func (s *Session) prepare(cm *autopaho.ConnectionManager, l *Link) {
	var err error
	if len(s.cfg.Subscriptions) > 0 {
		ctx, cancel := context.WithTimeout(l.ctx, s.cfg.ConnectTimeout)
		var suback *paho.Suback
		suback, err = cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: s.cfg.Subscriptions})
		cancel()
		if suback != nil {
			for i, code := range suback.Reasons {
				if code >= 0x80 && i < len(s.cfg.Subscriptions) {
					// paho also returns an error here; the reason code is the clear part.
					err = fmt.Errorf("subscription to %s refused (SUBACK reason %d): %s lacks the right to it", s.cfg.Subscriptions[i].Topic, code, s.cfg.Username)
					break
				}
			}
		}
		if err != nil {
			err = fmt.Errorf("%s: subscribe: %w", s.cfg.Name, err)
		}
	}
	s.mu.Lock()
	if l != s.link || l.down {
		s.mu.Unlock()
		return // that connection is already gone
	}
	l.err = err
	close(l.ready)
	s.mu.Unlock()
	if err != nil {
		s.log.Error("connection unusable", "err", err)
		return
	}
	s.log.Info("connected")
	if s.cfg.OnReady != nil {
		go s.cfg.OnReady(l.ctx, l)
	}
}

// connectionDown ends the current link and starts a new, not yet ready one.
func (s *Session) connectionDown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.link
	old.down = true
	select {
	case <-old.ready:
	default:
		old.err = errors.New("connection lost before it was ready")
		close(old.ready)
	}
	close(old.gone)
	old.stop()
	s.link = newLink(s.ctx)
	if s.cfg.OnDown != nil {
		s.cfg.OnDown()
	}
}

// Await waits until a link is connected and ready and returns it, or fails
// when ctx ends (naming the last connect error) or the session is closed.
func (s *Session) Await(ctx context.Context) (*Link, error) {
	for {
		s.mu.Lock()
		l := s.link
		s.mu.Unlock()
		select {
		case <-l.ready:
		case <-ctx.Done():
			if last := s.state.LastConnectError(); last != nil {
				return nil, fmt.Errorf("%s: waiting for the connection (last attempt: %v): %w", s.cfg.Name, last, ctx.Err())
			}
			return nil, fmt.Errorf("%s: waiting for the connection: %w", s.cfg.Name, ctx.Err())
		case <-s.done:
			return nil, fmt.Errorf("%s: %w", s.cfg.Name, ErrClosed)
		}
		s.mu.Lock()
		err, down := l.err, l.down
		s.mu.Unlock()
		if down {
			select {
			case <-s.done:
				return nil, fmt.Errorf("%s: %w", s.cfg.Name, ErrClosed)
			default:
			}
			continue // dropped meanwhile; wait for the next one
		}
		return l, err
	}
}

// Publish sends p on the current connection, waiting for one within ctx.
// A QoS 1 publish returns when the broker acknowledged it (check the
// reason code) or fails when the connection drops first.
func (s *Session) Publish(ctx context.Context, p *paho.Publish) (*paho.PublishResponse, error) {
	l, err := s.Await(ctx)
	if err != nil {
		return nil, err
	}
	type result struct {
		pr  *paho.PublishResponse
		err error
	}
	out := make(chan result, 1)
	go func() {
		pr, err := s.cm.Publish(ctx, p)
		out <- result{pr, err}
	}()
	select {
	case r := <-out:
		if r.err != nil && r.pr == nil {
			return nil, fmt.Errorf("%s: publish to %s: %w", s.cfg.Name, p.Topic, r.err)
		}
		return r.pr, nil
	case <-l.gone:
		// paho may keep an unacknowledged QoS 1 publish pending for the
		// session instead of failing it.
		return nil, fmt.Errorf("%s: publish to %s: %w", s.cfg.Name, p.Topic, ErrConnectionLost)
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: publish to %s: no acknowledgement: %w", s.cfg.Name, p.Topic, ctx.Err())
	}
}

// ErrConnectionLost is returned for operations whose connection dropped
// before the broker answered.
var ErrConnectionLost = errors.New("connection lost before the broker answered")

// Subscribe sends SUBSCRIBE on the current connection (not renewed after a
// reconnect: put lasting subscriptions in Config.Subscriptions).
func (s *Session) Subscribe(ctx context.Context, sub *paho.Subscribe) (*paho.Suback, error) {
	if _, err := s.Await(ctx); err != nil {
		return nil, err
	}
	return s.cm.Subscribe(ctx, sub)
}

// Unsubscribe sends UNSUBSCRIBE on the current connection.
func (s *Session) Unsubscribe(ctx context.Context, u *paho.Unsubscribe) (*paho.Unsuback, error) {
	if _, err := s.Await(ctx); err != nil {
		return nil, err
	}
	return s.cm.Unsubscribe(ctx, u)
}

// Healthy returns nil while the connection is up, or has been down for less
// than grace (an expected reconnect), and otherwise an error naming how
// long and the last connect error. Readiness checks use it.
func (s *Session) Healthy(grace time.Duration) error {
	select {
	case <-s.done:
		return fmt.Errorf("%s: %w", s.cfg.Name, ErrClosed)
	default:
	}
	if s.state.Up() {
		s.mu.Lock()
		l := s.link
		s.mu.Unlock()
		select {
		case <-l.ready:
			if l.err != nil {
				return l.err
			}
		default:
		}
		return nil
	}
	if err := s.state.Healthy(grace); err != nil {
		return fmt.Errorf("%s: %w", s.cfg.Name, err)
	}
	return nil
}

// Done closes when the session has ended (its context was cancelled).
func (s *Session) Done() <-chan struct{} { return s.done }

// Close disconnects politely and waits for the session to end; cancelling
// the context given to Start does the same without the DISCONNECT.
func (s *Session) Close(ctx context.Context) error {
	err := s.cm.Disconnect(ctx)
	select {
	case <-s.done:
	case <-ctx.Done():
	}
	if err != nil && !errors.Is(err, autopaho.ConnectionDownError) {
		return fmt.Errorf("%s: disconnect: %w", s.cfg.Name, err)
	}
	return nil
}
