package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// ConnConfig is what every MQTT connection of the gateway shares.
type ConnConfig struct {
	BrokerURL string
	// TLSFiles are PEM files for a TLS broker URL.
	TLSFiles a2amqtt.TLSFiles
	// Retry is the requesters' retry profile (a2amqtt.RetryPolicy defaults when zero), except
	// that a -32070 rate_limited answer is passed on at once unless RateLimitRetries is set: the
	// HTTP caller gets it (with its retry_after) as an MQTT caller would, and decides; the gateway
	// does not hold requests open on the caller's behalf.
	Retry  a2amqtt.RetryPolicy
	Logger *slog.Logger
}

// callerConn is one caller identity's connection and requester.
type callerConn struct {
	ready chan struct{}
	conn  *a2amqtt.Conn
	req   *a2amqtt.Requester
	err   error
	// gate decides each reconnect of conn when the pool follows a ring (reconnect.go).
	gate *reconnectGate
	// inUse and lastUsed are guarded by Pool.mu: Sweep closes only idle connections.
	inUse    int
	lastUsed time.Time
}

// Pool holds one MQTT connection per caller identity, made on first use with that Agent's own
// credentials: a request enters the bus as its caller, so the broker's ACLs and the conversation
// service judge it as they judge the Agent's own process. The profile gives each identity one
// client ID, so a caller identity is used over HTTP and not also by a process of its own.
type Pool struct {
	cfg ConnConfig
	dir *Directory

	mu    sync.Mutex
	conns map[a2amqtt.AgentRef]*callerConn
	// ring, when set (Ring.Follow), assigns the caller identities to replicas: a caller's
	// connection that was taken over reconnects only while the ring still assigns it here.
	ring *Ring
}

// NewPool returns an empty pool.
func NewPool(cfg ConnConfig, dir *Directory) *Pool {
	return &Pool{cfg: cfg, dir: dir, conns: map[a2amqtt.AgentRef]*callerConn{}}
}

// connectTimeout bounds the first CONNECT of a caller's connection.
const connectTimeout = 10 * time.Second

// Requester returns the requester of the caller Agent, connecting it on first use, and the
// function to call when the request is done with it. A failed connection is not kept: the next
// request tries again.
func (p *Pool) Requester(ctx context.Context, ag *a2av1.Agent) (*a2amqtt.Requester, func(), error) {
	ref := identity.Of(ag)
	p.mu.Lock()
	cc, ok := p.conns[ref]
	if !ok {
		cc = &callerConn{ready: make(chan struct{})}
		p.conns[ref] = cc
	}
	cc.inUse++
	p.mu.Unlock()
	release := func() {
		p.mu.Lock()
		cc.inUse--
		cc.lastUsed = time.Now()
		p.mu.Unlock()
	}
	if !ok {
		cc.conn, cc.req, cc.gate, cc.err = p.connect(context.WithoutCancel(ctx), ag, ref)
		close(cc.ready)
		if cc.err != nil {
			p.mu.Lock()
			if p.conns[ref] == cc {
				delete(p.conns, ref)
			}
			p.mu.Unlock()
		}
	}
	select {
	case <-cc.ready:
	case <-ctx.Done():
		release()
		return nil, nil, ctx.Err()
	}
	if cc.err != nil {
		release()
		return nil, nil, cc.err
	}
	return cc.req, release, nil
}

// Sweep closes the connections no request has used for idle: a caller identity is held on the
// bus only while it calls (and an Agent that was deleted, or no longer maps, is let go).
func (p *Pool) Sweep(ctx context.Context, idle time.Duration) int {
	now := time.Now()
	var closing []*callerConn
	p.mu.Lock()
	for ref, cc := range p.conns {
		select {
		case <-cc.ready:
		default:
			continue // still connecting
		}
		if cc.inUse == 0 && now.Sub(cc.lastUsed) >= idle {
			closing = append(closing, cc)
			delete(p.conns, ref)
		}
	}
	p.mu.Unlock()
	for _, cc := range closing {
		cc.close(ctx)
	}
	return len(closing)
}

// close stops the connection's reconnects, then disconnects it.
func (cc *callerConn) close(ctx context.Context) {
	cc.gate.close()
	if cc.conn != nil {
		_ = cc.conn.Close(ctx)
	}
}

// Retain closes the connections of the caller identities keep refuses (those the ring moved to
// another replica, which connects with the same client ID: keeping them would have the two
// replicas take the session from each other). A request in flight on one ends with an error; a
// stream's caller resumes with GetTask or SubscribeToTask.
func (p *Pool) Retain(ctx context.Context, keep func(a2amqtt.AgentRef) bool) int {
	var closing []*callerConn
	p.mu.Lock()
	for ref, cc := range p.conns {
		if !keep(ref) {
			closing = append(closing, cc)
			delete(p.conns, ref)
		}
	}
	p.mu.Unlock()
	for _, cc := range closing {
		<-cc.ready
		cc.close(ctx)
	}
	return len(closing)
}

// Size is the number of caller connections held.
func (p *Pool) Size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *Pool) connect(ctx context.Context, ag *a2av1.Agent, ref a2amqtt.AgentRef) (*a2amqtt.Conn, *a2amqtt.Requester, *reconnectGate, error) {
	creds, err := p.dir.Credentials(ctx, ag)
	if err != nil {
		return nil, nil, nil, err
	}
	p.mu.Lock()
	ring := p.ring
	p.mu.Unlock()
	var gate *reconnectGate
	if ring != nil {
		gate = newReconnectGate(ctx, creds, ring, ref.ClientID(), p.cfg.Logger)
		creds = gate
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := a2amqtt.Connect(cctx, a2amqtt.Config{
		BrokerURL: p.cfg.BrokerURL, Credentials: creds, Agent: ref, TLSFiles: p.cfg.TLSFiles,
		ConnectTimeout: connectTimeout, Logger: p.cfg.Logger,
	})
	if err != nil {
		gate.close()
		return nil, nil, nil, fmt.Errorf("connect as %s: %w", ref, err)
	}
	retry := p.cfg.Retry
	if retry.RateLimitRetries == 0 {
		retry.RateLimitRetries = -1
	}
	req, err := a2amqtt.NewRequester(cctx, conn, a2amqtt.RequesterOptions{Retry: retry})
	if err != nil {
		gate.close()
		_ = conn.Close(context.Background())
		return nil, nil, nil, fmt.Errorf("requester for %s: %w", ref, err)
	}
	return conn, req, gate, nil
}

// Close disconnects every caller connection.
func (p *Pool) Close(ctx context.Context) {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[a2amqtt.AgentRef]*callerConn{}
	p.mu.Unlock()
	for _, cc := range conns {
		<-cc.ready
		cc.close(ctx)
	}
}
