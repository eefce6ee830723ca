package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// A connection held under an identity the ring assigns (an HTTP agent's) is taken over when
// another client connects with the same client ID: Mosquitto closes the old connection (without
// a DISCONNECT), mochi sends DISCONNECT 0x8E first. To the client both look like a lost
// connection, and autopaho reconnects at once. Two holders that both reconnect at once take the
// session from each other in a loop (tens of CONNECTs a second) until one of them lets go; the
// requests of that identity land on either side meanwhile. That happens whenever two replicas
// briefly both see themselves assigned the identity: one joined and read the Leases before the
// others, or one lets go of it while the other already holds it.
//
// reconnectGate breaks the loop by construction: it is the connection's CredentialSource, asked
// by autopaho before every CONNECT attempt, before dialling. The first attempt is the hold's own
// (decided on the ring's view of the moment). Every later one (a reconnect) waits for the ring's
// next read of the Leases, one begun after the connection dropped, and goes ahead only when that
// view still assigns the identity to this replica; otherwise it fails, autopaho backs off, and
// the next sync lets the identity go. A broker restart costs at most one ring interval more; a
// takeover by the replica now assigned the identity is never answered with a takeover back.

// errLetGo is the reconnect refusal of a connection being let go.
var errLetGo = errors.New("the gateway is letting this identity go")

// reconnectGate wraps an identity's credentials with the ring's decision (see above).
type reconnectGate struct {
	creds a2amqtt.CredentialSource
	ring  *Ring
	key   string
	log   *slog.Logger
	// ctx ends when the connection is let go: a waiting attempt gives up at once.
	ctx      context.Context
	cancel   context.CancelFunc
	attempts atomic.Int64
}

func newReconnectGate(ctx context.Context, creds a2amqtt.CredentialSource, ring *Ring, key string, log *slog.Logger) *reconnectGate {
	gctx, cancel := context.WithCancel(ctx)
	return &reconnectGate{creds: creds, ring: ring, key: key, log: log, ctx: gctx, cancel: cancel}
}

// Credentials implements a2amqtt.CredentialSource.
func (g *reconnectGate) Credentials() (string, []byte, error) {
	if g.ctx.Err() != nil {
		return "", nil, errLetGo
	}
	if g.attempts.Add(1) > 1 {
		// A wait bounded by the ring's TTL: a ring that cannot read the Leases for that long
		// no longer knows who else holds what.
		wctx, cancel := context.WithTimeout(g.ctx, g.ring.cfg.TTL)
		owns, err := g.ring.OwnsAfterRead(wctx, g.key)
		cancel()
		switch {
		case g.ctx.Err() != nil:
			return "", nil, errLetGo
		case err != nil:
			return "", nil, fmt.Errorf("reconnect as %s: %w", g.key, err)
		case !owns:
			g.log.Info("connection lost and identity now assigned to another gateway replica: not reconnecting", "client_id", g.key)
			return "", nil, fmt.Errorf("reconnect as %s: the identity is assigned to another gateway replica", g.key)
		}
	}
	return g.creds.Credentials()
}

// close stops every later CONNECT attempt (nil-safe: a connection without a gate).
func (g *reconnectGate) close() {
	if g != nil {
		g.cancel()
	}
}
