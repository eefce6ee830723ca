package registration

import (
	"context"
	"fmt"
	"sync"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// lazy holds a connection that is opened on first use and retried on the next use after a
// failure, so the operator starts (and reports BrokerUnavailable on Agents) while the broker is
// down, and converges when it comes back.
type lazy[T any] struct {
	mu      sync.Mutex
	open    func(context.Context) (T, error)
	val     T
	started bool
}

func (l *lazy[T]) get(ctx context.Context) (T, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return l.val, nil
	}
	v, err := l.open(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	l.val, l.started = v, true
	return v, nil
}

// LazyBackend is an acl.Backend that connects on first use.
type LazyBackend struct {
	prefix string
	conn   lazy[acl.Backend]
}

// NewLazyBackend returns a backend whose connection open makes on first use.
func NewLazyBackend(prefix string, open func(context.Context) (acl.Backend, error)) *LazyBackend {
	return &LazyBackend{prefix: prefix, conn: lazy[acl.Backend]{open: open}}
}

// Prefix implements acl.Backend.
func (b *LazyBackend) Prefix() string { return b.prefix }

// Observe implements acl.Backend.
func (b *LazyBackend) Observe(ctx context.Context, only *acl.Names) (acl.State, error) {
	be, err := b.conn.get(ctx)
	if err != nil {
		return acl.State{}, fmt.Errorf("connect to broker: %w", err)
	}
	return be.Observe(ctx, only)
}

// Execute implements acl.Backend.
func (b *LazyBackend) Execute(ctx context.Context, cmds []acl.Command) error {
	be, err := b.conn.get(ctx)
	if err != nil {
		return fmt.Errorf("connect to broker: %w", err)
	}
	return be.Execute(ctx, cmds)
}

// Check implements acl.Backend.
func (b *LazyBackend) Check(ctx context.Context, username string, access acl.Access, topic string) (acl.Decision, error) {
	be, err := b.conn.get(ctx)
	if err != nil {
		return acl.Decision{}, fmt.Errorf("connect to broker: %w", err)
	}
	return be.Check(ctx, username, access, topic)
}

// Stats implements acl.Backend (zero until connected).
func (b *LazyBackend) Stats() acl.Stats {
	b.conn.mu.Lock()
	defer b.conn.mu.Unlock()
	if !b.conn.started {
		return acl.Stats{}
	}
	return b.conn.val.Stats()
}

// LazyCardPublisher is a CardPublisher that connects on first use. The operator creates its
// publishing identity then, which only the leader does (only the leader reconciles), so replicas
// never rotate each other's password.
type LazyCardPublisher struct {
	conn lazy[*MQTTCardPublisher]
}

// NewLazyCardPublisher returns a publisher whose connection open makes on first use.
func NewLazyCardPublisher(open func(context.Context) (*MQTTCardPublisher, error)) *LazyCardPublisher {
	return &LazyCardPublisher{conn: lazy[*MQTTCardPublisher]{open: open}}
}

// PublishCard implements CardPublisher.
func (p *LazyCardPublisher) PublishCard(ctx context.Context, topic string, payload []byte, props map[string]string) error {
	pub, err := p.conn.get(ctx)
	if err != nil {
		return fmt.Errorf("connect card publisher: %w", err)
	}
	return pub.PublishCard(ctx, topic, payload, props)
}
