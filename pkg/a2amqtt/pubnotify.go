package a2amqtt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"
)

// ErrDroppedFromSession: the broker did not resume the session that held an unacknowledged
// message (a clean start after a reconnect), or the connection closed before its PUBACK.
var ErrDroppedFromSession = errors.New("message dropped from the MQTT session before its PUBACK")

// PublishNotify sends a QoS 1 message without waiting for its PUBACK, in order with the
// connection's other publishes, and calls done exactly once with what the broker answered:
// the PUBACK (done's error is set for a reason code ≥ 0x80, as Publish reports it), or
// ErrDroppedFromSession. done runs on the goroutine that reads the connection (paho's), so
// it must not block: every packet of the connection waits behind it. When no live client is
// known (a reconnect), PublishNotify publishes synchronously and calls done on the caller's
// goroutine before it returns.
//
// A caller that needs the broker's answer but not in its own path (the conversation
// service's forwards and final relays) saves a goroutine park and wake-up per message
// against Publish, and its goroutine is free for the next message while the PUBACK travels
// (docs/benchmarks.md). An error returned means the message was not sent and done is not
// called.
func (c *Conn) PublishNotify(ctx context.Context, p *paho.Publish, done func(*paho.PublishResponse, error)) error {
	if p.QoS != 1 {
		return fmt.Errorf("publish to %s: PublishNotify sends QoS 1 only, not %d", p.Topic, p.QoS)
	}
	synchronously := func() error {
		resp, err := c.publishWithin(ctx, p, 0)
		done(resp, err)
		return nil
	}
	cli := c.cli.Load()
	if cli == nil {
		return synchronously()
	}
	n := &pubNotice{done: done}
	_, err := cli.PublishWithOptions(context.WithValue(ctx, pubNoticeKey{}, n), p, paho.PublishOptions{Method: paho.PublishMethod_AsyncSend})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, paho.ErrNetworkErrorAfterStored) && c.cfg.SessionExpiry > 0:
		// Stored in the persistent session: paho resends it after the reconnect and its
		// PUBACK reaches done then.
		return nil
	case n.registered:
		// Stored, but nothing resends it (a clean session): the caller hears of it now.
		c.acks.forget(n)
		return fmt.Errorf("publish to %s: %w", p.Topic, err)
	default:
		// Refused before it was stored (the connection went down): send it as Publish would.
		return synchronously()
	}
}

// pubNoticeKey is the context key under which PublishNotify hands its notice to the session.
type pubNoticeKey struct{}

// pubNotice is one PublishNotify waiting for its PUBACK.
type pubNotice struct {
	done       func(*paho.PublishResponse, error)
	id         uint16
	registered bool
}

// notices are the PublishNotify messages of a session that wait for their PUBACK, by
// packet identifier. The session manager sees every packet paho sends and receives, so it
// learns a message's identifier when paho stores it (AddToSession) and its PUBACK before
// paho does (PacketReceived): no goroutine waits on paho's response channel.
type notices struct {
	mu      sync.Mutex
	pending map[uint16]*pubNotice
	// waiting are the response channels of the synchronous QoS 1 publishes of a clean
	// session, by packet identifier, woken when the connection is lost (ConnectionLost).
	waiting map[uint16]chan<- packets.ControlPacket
}

// AddToSession implements session.SessionManager: a publish of PublishNotify is registered
// under the identifier the session gave it.
func (g *ackGate) AddToSession(ctx context.Context, packet session.Packet, resp chan<- packets.ControlPacket) error {
	if err := g.SessionManager.AddToSession(ctx, packet, resp); err != nil {
		return err
	}
	n, _ := ctx.Value(pubNoticeKey{}).(*pubNotice)
	pb, ok := packet.(*packets.Publish)
	if !ok || pb.QoS != 1 {
		return nil
	}
	if n == nil {
		if g.clean {
			g.n.mu.Lock()
			if g.n.waiting == nil {
				g.n.waiting = map[uint16]chan<- packets.ControlPacket{}
			}
			g.n.waiting[pb.PacketID] = resp
			g.n.mu.Unlock()
		}
		return nil
	}
	g.n.mu.Lock()
	if g.n.pending == nil {
		g.n.pending = map[uint16]*pubNotice{}
	}
	n.id, n.registered = pb.PacketID, true
	g.n.pending[pb.PacketID] = n
	g.n.mu.Unlock()
	return nil
}

// PacketReceived implements session.SessionManager: a PUBACK of PublishNotify reaches its
// caller after the session released the identifier.
func (g *ackGate) PacketReceived(recv *packets.ControlPacket, pubs chan<- *packets.Publish) error {
	var n *pubNotice
	switch recv.Type {
	case packets.PUBACK:
		id := recv.Content.(*packets.Puback).PacketID
		g.n.mu.Lock()
		if n = g.n.pending[id]; n != nil {
			delete(g.n.pending, id)
		}
		if g.n.waiting != nil {
			delete(g.n.waiting, id)
		}
		g.n.mu.Unlock()
	case packets.PUBLISH:
		// Counted before paho queues it for the handlers (awaitDispatched); paho refuses a
		// QoS 1 message without an identifier.
		if pb := recv.Content.(*packets.Publish); pb.QoS == 1 && pb.PacketID != 0 {
			g.delivered.Add(1)
		}
	}
	err := g.SessionManager.PacketReceived(recv, pubs)
	if n != nil {
		resp := paho.PublishResponseFromPuback(recv.Content.(*packets.Puback))
		var rerr error
		if resp.ReasonCode >= 0x80 {
			rerr = fmt.Errorf("publish refused by broker: reason 0x%02x %s", resp.ReasonCode, resp.Properties.ReasonString)
		}
		n.done(resp, rerr)
	}
	return err
}

// ConAckReceived implements session.SessionManager: a session the broker did not resume
// drops every message still waiting for its PUBACK (dropAll wakes them). On a clean session the
// loss is counted here too: a synchronous publish registered after the last connection's loss
// had woken the others is woken only here, and publishWithin sends it again on this connection
// (it did not before: the count had not moved, and it returned paho's "not fully acknowledged"
// error). No publish of this connection is waiting yet: the CONNACK comes first.
func (g *ackGate) ConAckReceived(w io.Writer, cp *packets.Connect, ca *packets.Connack) error {
	err := g.SessionManager.ConAckReceived(w, cp, ca)
	if !ca.SessionPresent {
		if g.clean {
			g.lost.Add(1)
		}
		g.dropAll()
	}
	return err
}

// ConnectionLost implements session.SessionManager. On a clean session paho drops the
// messages still waiting for their PUBACK without waking their publishers, which would wait
// out paho's packet timeout: they are woken here (as paho's own Close does), after the loss
// is counted, so publishWithin sends them again once the connection is back.
func (g *ackGate) ConnectionLost(dp *packets.Disconnect) error {
	if !g.clean {
		return g.SessionManager.ConnectionLost(dp)
	}
	g.lost.Add(1)
	err := g.SessionManager.ConnectionLost(dp)
	g.wakeWaiting()
	return err
}

// wakeWaiting wakes the synchronous publishes of a clean session still waiting for a PUBACK.
func (g *ackGate) wakeWaiting() {
	g.n.mu.Lock()
	waiting := g.n.waiting
	g.n.waiting = nil
	g.n.mu.Unlock()
	for _, resp := range waiting {
		select {
		case resp <- packets.ControlPacket{}: // paho's "shutting down" answer
		default: // its answer is already there
		}
	}
}

// forget drops n without calling it.
func (g *ackGate) forget(n *pubNotice) {
	g.n.mu.Lock()
	if g.n.pending[n.id] == n {
		delete(g.n.pending, n.id)
	}
	g.n.mu.Unlock()
}

// dropAll fails every notice still waiting (Conn.Close and Abort: autopaho never closes a
// session it was given, so the connection's end is the session's).
func (g *ackGate) dropAll() {
	g.n.mu.Lock()
	pending := g.n.pending
	g.n.pending = nil
	g.n.mu.Unlock()
	for _, n := range pending {
		n.done(nil, ErrDroppedFromSession)
	}
	g.wakeWaiting()
}
