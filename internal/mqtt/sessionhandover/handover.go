// Package sessionhandover is a mochi-mqtt hook that keeps a persistent session's messages when
// a new connection takes the session over while a PUBLISH is being fanned out.
//
// mochi 2.7.9 acknowledges a QoS 1 PUBLISH to its publisher before it fans the message out
// (Server.processPublish), and the fan-out finds each subscriber by client id. When a
// subscriber's new connection takes its session over in between, the fan-out can still find the
// old connection: the message lands in that connection's in-flight set after the take-over cloned
// it into the new connection (or after it was cleared), and nobody ever receives it, though its
// publisher holds a PUBACK. Measured with real clients: 4–8 of 1 000 messages lost per run when
// each is published while the subscriber reconnects; Mosquitto lost none. An agent's restart (a crash and
// a reconnect with its persistent session) is exactly that moment.
//
// The hook sees every message mochi puts into a connection's in-flight set (OnQosPublish). A
// message put into a connection already taken over is handed to the session's newer connection:
// queued while that one is being established (until its CONNACK and mochi's own resends are out)
// and delivered once it is, or put straight into its in-flight set, and written
// when it is connected, once it is established. A message in flight there stays with the session
// across later take-overs like any other. The race is at least once, like QoS 1 itself: a message
// that mochi both cloned and handed over may arrive twice (mochi's resend and this one).
//
// The hook also closes a second race of the same take-over, for sessions that end with their
// connection (Clean Start, or Session Expiry Interval 0). mochi's goroutine of such a connection
// removes it by client id once it has closed (Server.attachClient: UnsubscribeClient, then
// Clients.Delete(id)), having checked that it was not taken over. A new connection with the same
// client id that arrives in between finds the old one, takes it over too late for that check, adds
// itself under the id, and is then removed by the old goroutine's Clients.Delete: it stays
// connected, its SUBSCRIBEs are acknowledged, and it never receives a message (the CI flake
// TestPersistentSession/mochi/clean-session-control, "clean session after reconnect: []", seen at
// load ~10). With Server set, OnSessionEstablish ends such an old connection itself and waits until
// mochi has removed it before the new one takes the id.
//
// And a third: mochi adds a resuming connection to its clients before it writes the CONNACK, so a
// fan-out in between could write a PUBLISH to it ahead of the CONNACK, and the client drops the
// connection (paho: "received unexpected packet 3"; seen once in CI, TestNoMessageLostToATakeover).
// OnQosPublish holds such a fan-out (bounded) until the connection is established.
package sessionhandover

import (
	"bytes"
	"slices"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Hook is the mochi hook; add it to a server with AddHook(&Hook{Server: server}, nil) (the zero
// value is ready, without the wait for an ending connection).
type Hook struct {
	mqtt.HookBase
	// Server, when set, is the server the hook is added to: OnSessionEstablish then waits for an
	// ending connection with the new one's client id to be removed (see the package comment).
	Server *mqtt.Server

	mu       sync.Mutex
	sessions map[string]*session // by client id
}

// session is what the hook knows of one client id's connections.
type session struct {
	// establishing is the connection taking the session over (OnSessionEstablish) until mochi
	// has sent its CONNACK and resends (OnSessionEstablished); nil otherwise.
	establishing *mqtt.Client
	// established is closed when establishing is (or has gone): a fan-out that finds it before
	// its CONNACK waits on it.
	established chan struct{}
	// clean: the latest connection started a new session; what the old one held is gone.
	clean bool
	// current is the connection that established the session last; while it is disconnected
	// its in-flight set is the session's (mochi clones it into the next connection).
	current *mqtt.Client
	// queued are messages handed over while establishing is not ready for them.
	queued []packets.Packet
	// resent are the messages mochi resent from the session it cloned into the latest
	// connection (its ResendInflightMessages), kept until the next take-over: a copy of one of
	// them handed over later (queued, or stranded by a fan-out that was preempted between putting
	// it into the old connection and calling OnQosPublish) is not sent again, even when the
	// client has acknowledged it already and it is no longer in flight.
	resent []packets.Packet
}

// ID implements mqtt.Hook.
func (h *Hook) ID() string { return "a2a-fleet-session-handover" }

// Provides implements mqtt.Hook.
func (h *Hook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnSessionEstablish,
		mqtt.OnSessionEstablished,
		mqtt.OnQosPublish,
		mqtt.OnDisconnect,
		mqtt.OnClientExpired,
	}, []byte{b})
}

func (h *Hook) sessionLocked(id string) *session {
	if h.sessions == nil {
		h.sessions = map[string]*session{}
	}
	s := h.sessions[id]
	if s == nil {
		s = &session{}
		h.sessions[id] = s
	}
	return s
}

// removalWait bounds how long a new connection waits for mochi to remove an ending connection
// with its client id (normally microseconds: the old goroutine's last two steps).
const removalWait = 5 * time.Second

// OnSessionEstablish runs before mochi takes an existing session over for cl.
func (h *Hook) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	h.awaitRemoval(cl)
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.sessionLocked(cl.ID)
	s.endEstablishing()
	s.establishing, s.established, s.clean, s.resent = cl, make(chan struct{}), pk.Connect.Clean, nil
	if s.clean {
		s.queued = nil
	}
}

// awaitRemoval: when a connection whose session ends with it holds cl's client id, it is
// disconnected (session taken over, as mochi would) and cl waits until mochi's goroutine of that
// connection has removed it, so that its removal by client id cannot remove cl. mochi then finds
// no session to take over, which is right: that session ended with its connection.
func (h *Hook) awaitRemoval(cl *mqtt.Client) {
	if h.Server == nil {
		return
	}
	old, ok := h.Server.Clients.Get(cl.ID)
	if !ok || old == cl || !endsWithConnection(old) {
		return
	}
	_ = h.Server.DisconnectClient(old, packets.ErrSessionTakenOver)
	deadline := time.Now().Add(removalWait)
	for time.Now().Before(deadline) {
		if cur, ok := h.Server.Clients.Get(cl.ID); !ok || cur != old {
			return
		}
		time.Sleep(time.Millisecond)
	}
	// Still there (its goroutine is stuck): mochi's own take-over proceeds, as without the hook.
}

// endsWithConnection reports whether cl's session ends when its connection does (mochi's
// expire condition in Server.attachClient).
func endsWithConnection(cl *mqtt.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryInterval == 0
	}
	return cl.Properties.Clean
}

// OnSessionEstablished runs once mochi has acknowledged cl's CONNECT and resent what the session
// held: what was handed over meanwhile goes out now.
func (h *Hook) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	h.mu.Lock()
	s := h.sessionLocked(cl.ID)
	if s.establishing == cl {
		s.endEstablishing()
	}
	s.current = cl
	queued := s.queued
	s.queued = nil
	var send []packets.Packet
	for _, pk := range queued {
		if s.delivered(cl, pk) {
			continue
		}
		send = append(send, place(cl, pk))
	}
	h.mu.Unlock()
	write(cl, send...)
}

// OnQosPublish runs after mochi put pk into cl's in-flight set (and for acknowledgements of
// inbound messages, which are not this hook's concern).
func (h *Hook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, _ int) {
	if pk.FixedHeader.Type == packets.Publish && pk.FixedHeader.Dup && !cl.IsTakenOver() {
		// mochi resending what a take-over cloned into cl (or a later resend): remember it while
		// cl is being established.
		h.mu.Lock()
		if s := h.sessions[cl.ID]; s != nil && s.establishing == cl {
			s.resent = append(s.resent, pk)
		}
		h.mu.Unlock()
		return
	}
	if pk.FixedHeader.Type == packets.Publish && !cl.IsTakenOver() {
		// Not taken over when mochi stored it: the take-over's clone has it. But mochi adds a
		// connection to its clients before it sends the CONNACK (Server.attachClient), so a
		// fan-out can find one that is still being established and write this PUBLISH ahead of
		// the CONNACK, which a client must refuse (paho: "received unexpected packet 3"). mochi
		// writes it after this call returns: hold the fan-out until the CONNACK is out.
		h.mu.Lock()
		var wait chan struct{}
		if s := h.sessions[cl.ID]; s != nil && s.establishing == cl {
			wait = s.established
		}
		h.mu.Unlock()
		if wait != nil {
			select {
			case <-wait:
			case <-time.After(removalWait): // bounded, as awaitRemoval
			}
		}
		return
	}
	if pk.FixedHeader.Type != packets.Publish {
		return
	}
	h.mu.Lock()
	s := h.sessionLocked(cl.ID)
	switch {
	case s.clean:
		// The newer connection started a new session: the old one's messages went with it.
		h.mu.Unlock()
		return
	case s.establishing != nil || s.current == nil || s.current == cl:
		// Delivered once the session's next connection is established.
		s.queued = append(s.queued, pk)
		h.mu.Unlock()
		return
	}
	to := s.current
	if s.delivered(to, pk) {
		// The take-over cloned it into to and mochi resent it (this call came late).
		h.mu.Unlock()
		return
	}
	// Into its in-flight set under the lock: a take-over of to that begins after this clones it.
	out := place(to, pk)
	h.mu.Unlock()
	write(to, out)
}

// OnDisconnect forgets a client id whose session ends with its connection, and releases the
// fan-outs waiting for a connection that ended before it was established.
func (h *Hook) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	h.mu.Lock()
	if s := h.sessions[cl.ID]; s != nil && s.establishing == cl {
		s.endEstablishing()
	}
	h.mu.Unlock()
	if !expire || cl.IsTakenOver() {
		return
	}
	h.forget(cl)
}

// OnClientExpired forgets a client id whose session expired.
func (h *Hook) OnClientExpired(cl *mqtt.Client) { h.forget(cl) }

func (h *Hook) forget(cl *mqtt.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.sessions[cl.ID]; s != nil && s.current == cl && s.establishing == nil {
		delete(h.sessions, cl.ID)
	}
}

// endEstablishing ends the establishing phase: fan-outs waiting for it proceed.
func (s *session) endEstablishing() {
	if s.established != nil {
		close(s.established)
	}
	s.establishing, s.established = nil, nil
}

// resent reports whether mochi's take-over already carried pk into cl (cloned, then resent
// under the same packet identifier).
func resent(cl *mqtt.Client, pk packets.Packet) bool {
	in, ok := cl.State.Inflight.Get(pk.PacketID)
	return ok && in.FixedHeader.Type == packets.Publish && in.Created == pk.Created &&
		in.TopicName == pk.TopicName && bytes.Equal(in.Payload, pk.Payload)
}

// delivered reports whether the session's latest connection cl got pk from the take-over
// itself: still in its in-flight set, or resent when it was established.
func (s *session) delivered(cl *mqtt.Client, pk packets.Packet) bool {
	return resent(cl, pk) || slices.ContainsFunc(s.resent, func(r packets.Packet) bool { return same(r, pk) })
}

// same reports whether a and b are the same message (mochi keeps Created through a clone).
func same(a, b packets.Packet) bool {
	return a.Created == b.Created && a.TopicName == b.TopicName && bytes.Equal(a.Payload, b.Payload)
}

// place puts a copy of pk into cl's in-flight set under a packet identifier of cl's.
func place(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	out := pk.Copy(false)
	id, err := cl.NextPacketID()
	if err != nil {
		// All 65 535 identifiers in flight: mochi drops the message itself in that case.
		return packets.Packet{}
	}
	out.PacketID = uint16(id)
	out.FixedHeader.Dup = false
	cl.State.Inflight.Set(out)
	return out
}

// write sends messages placed in cl's in-flight set when cl is connected; otherwise they wait
// there for the session's next connection.
func write(cl *mqtt.Client, pks ...packets.Packet) {
	for _, pk := range pks {
		if pk.PacketID == 0 || cl.Closed() || cl.Net.Conn == nil {
			continue
		}
		_ = cl.WritePacket(pk) // a failed write leaves it in flight, as mochi's own resend does
	}
}
