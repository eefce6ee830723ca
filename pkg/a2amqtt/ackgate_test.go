package a2amqtt

import (
	"context"
	"io"
	"testing"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho/session"
	"github.com/eclipse/paho.golang/paho/session/state"
)

// lossWhileAdding is paho's session state with the connection lost (from another goroutine,
// as paho's reader would) just after a publish entered the session and before the gate
// registered its publisher.
type lossWhileAdding struct {
	session.SessionManager
	g *ackGate
}

func (l *lossWhileAdding) AddToSession(ctx context.Context, packet session.Packet, resp chan<- packets.ControlPacket) error {
	if err := l.SessionManager.AddToSession(ctx, packet, resp); err != nil {
		return err
	}
	return l.g.ConnectionLost(nil)
}

// TestAPublishCaughtByTheLossIsWokenByTheNextConnack: on a clean session, a synchronous QoS 1
// publish that entered the session while its connection's loss was being handled (the loss woke
// the publishers registered so far, paho's session dropped the message, the gate registered it
// after) is woken with paho's "shutting down" answer when the next CONNACK starts a new
// session, and the loss is counted again so that publishWithin sends it once more; before, the
// count had not moved and its publisher returned paho's error. The gate runs over paho's own
// session state.
func TestAPublishCaughtByTheLossIsWokenByTheNextConnack(t *testing.T) {
	g := &ackGate{clean: true}
	g.SessionManager = &lossWhileAdding{SessionManager: state.NewInMemory(), g: g}
	connect := &packets.Connect{CleanStart: true}
	if err := g.ConAckReceived(io.Discard, connect, &packets.Connack{}); err != nil {
		t.Fatal(err)
	}
	resp := make(chan packets.ControlPacket, 1)
	pb := &packets.Publish{Topic: "t", QoS: 1, Payload: []byte("m1")}
	if err := g.AddToSession(context.Background(), pb, resp); err != nil {
		t.Fatal(err)
	}
	select {
	case <-resp:
		t.Fatal("woken before the loss it was registered after: the test does not reproduce the race")
	default:
	}
	lost := g.lost.Load()
	if err := g.ConAckReceived(io.Discard, connect, &packets.Connack{}); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-resp:
		if p.Type != 0 {
			t.Fatalf("woken with packet type %d, want paho's empty shutting-down answer", p.Type)
		}
	default:
		t.Fatal("the publish that entered the session after the loss was not woken by the new session's CONNACK")
	}
	if g.lost.Load() == lost {
		t.Error("the new session did not count the loss: publishWithin would not send the message again")
	}
}
