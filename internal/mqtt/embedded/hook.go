package embedded

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/presence"
)

// droppedWillTopic replaces the topic of a Will the client may not publish:
// mochi cannot cancel a Will from a hook, so it is redirected here, where
// every delivery is refused (Mosquitto checks a Will against
// publishClientSend when sending it and drops it if denied).
const droppedWillTopic = "$a2a-fleet/dropped-will"

// Hook is the mochi hook enforcing a Store: CONNECT authentication and every
// ACL check, plus what makes mochi answer like Mosquitto (PUBACK 0x10 "no
// matching subscribers") and tell subscribers who published (the
// identity.SenderProperty user property). Add it as the only auth hook
// (mochi allows an operation when any hook allows it).
type Hook struct {
	mqtt.HookBase
	store *Store
	// server routes messages; set by Store.Attach (nil in unit tests, which
	// then skip the subscriber check).
	server *mqtt.Server

	mu sync.Mutex // guards pending
	// pending holds, per client, the filters of the SUBSCRIBE being
	// processed. mochi reports both the subscribe check (topic = filter) and
	// each delivery (topic = topic name) as OnACLCheck(write=false); a
	// wildcard or $share filter can only be a subscription, a plain one is
	// ambiguous only while its SUBSCRIBE is in flight.
	pending map[*mqtt.Client]map[string]int

	connMu sync.Mutex // guards byUser and kicked
	// byUser holds every authenticated connection by username, so a kick
	// finds its clients without scanning the server's client list.
	byUser map[string]map[*mqtt.Client]struct{}
	// kicked are connections being disconnected by a kick: their Will is
	// dropped in OnWill (writing the client's Will flag races with mochi).
	kicked map[*mqtt.Client]struct{}

	// shuttingDown: the server is closing; a CONNECT is answered 0x8B (Server.Close).
	shuttingDown atomic.Bool

	presenceMu sync.Mutex // guards current and presence, and orders the observations sent
	// current is each client ID's established connection, and since when.
	current map[string]established
	// presence receives every connect, disconnect and refused CONNECT (nil: nobody watches).
	presence func(presence.Observation)
}

type established struct {
	cl *mqtt.Client
	at time.Time
}

// NewHook returns the hook for s.
func NewHook(s *Store) *Hook {
	return &Hook{store: s, pending: map[*mqtt.Client]map[string]int{}, byUser: map[string]map[*mqtt.Client]struct{}{}, kicked: map[*mqtt.Client]struct{}{},
		current: map[string]established{}}
}

// ID implements mqtt.Hook.
func (h *Hook) ID() string { return "a2a-fleet-acl" }

// Provides implements mqtt.Hook.
func (h *Hook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnConnect,
		mqtt.OnConnectAuthenticate,
		mqtt.OnACLCheck,
		mqtt.OnSubscribe,
		mqtt.OnSubscribed,
		mqtt.OnPublish,
		mqtt.OnPacketEncode,
		mqtt.OnWill,
		mqtt.OnDisconnect,
		mqtt.OnSessionEstablished,
	}, []byte{b})
}

// OnConnect refuses every CONNECT once the server is shutting down, with CONNACK 0x8B.
func (h *Hook) OnConnect(cl *mqtt.Client, _ packets.Packet) error {
	if !h.shuttingDown.Load() {
		return nil
	}
	if h.server != nil {
		_ = h.server.SendConnack(cl, packets.ErrServerShuttingDown, false, nil)
	}
	return packets.ErrServerShuttingDown
}

// OnConnectAuthenticate mirrors dynsec: a username and a password are
// required (no anonymous access), the client ID must equal the configured
// one when set, and the password must match. An accepted connection is
// recorded at once, so a kick racing with the rest of the CONNECT still
// finds it.
func (h *Hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	if !pk.Connect.UsernameFlag || !pk.Connect.PasswordFlag {
		return false
	}
	user := string(pk.Connect.Username)
	if !h.store.authenticate(user, string(pk.Connect.Password), cl.ID) {
		h.observe(presence.Observation{ClientID: cl.ID, Refused: true, At: time.Now(), Source: presence.SourceBroker,
			Reason: "CONNECT refused: bad username or password, or a client ID the username may not use"})
		return false
	}
	h.connMu.Lock()
	defer h.connMu.Unlock()
	conns := h.byUser[user]
	if conns == nil {
		conns = map[*mqtt.Client]struct{}{}
		h.byUser[user] = conns
	}
	for c := range conns {
		if c.Closed() {
			delete(conns, c) // a connection that failed after authenticating
		}
	}
	conns[cl] = struct{}{}
	return true
}

// OnACLCheck answers with acl.Policy (the admin user may do anything).
func (h *Hook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if cl.Net.Inline {
		return true // the server's own inline client
	}
	user := string(cl.Properties.Username)
	if write {
		return h.store.allows(user, acl.Publish, topic)
	}
	if strings.HasPrefix(topic, droppedWillTopic) {
		return false
	}
	if strings.ContainsAny(topic, "+#") || mqtt.IsSharedFilter(topic) {
		return h.store.allows(user, acl.Subscribe, topic)
	}
	if h.isPending(cl, topic) {
		// Either this SUBSCRIBE's check or a delivery racing with it: require
		// both, which is never more permissive than Mosquitto.
		return h.store.allows(user, acl.Subscribe, topic) && h.store.allows(user, acl.Receive, topic)
	}
	return h.store.allows(user, acl.Receive, topic)
}

func (h *Hook) isPending(cl *mqtt.Client, filter string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pending[cl][filter] > 0
}

// OnSubscribe records the filters about to be checked.
func (h *Hook) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.pending[cl]
	if m == nil {
		m = map[string]int{}
		h.pending[cl] = m
	}
	for _, f := range pk.Filters {
		m[f.Filter]++
	}
	return pk
}

// OnSubscribed forgets them again.
func (h *Hook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, _ []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.pending[cl]
	for _, f := range pk.Filters {
		if m[f.Filter]--; m[f.Filter] <= 0 {
			delete(m, f.Filter)
		}
	}
	if len(m) == 0 {
		delete(h.pending, cl)
	}
}

// OnSessionEstablished reports the connection (presence).
func (h *Hook) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	if cl.Net.Inline {
		return
	}
	now := time.Now()
	h.presenceMu.Lock()
	defer h.presenceMu.Unlock()
	h.current[cl.ID] = established{cl, now}
	if h.presence != nil {
		h.presence(presence.Observation{ClientID: cl.ID, Connected: true, At: now, Source: presence.SourceBroker})
	}
}

// observe sends o to the presence watcher, if any.
func (h *Hook) observe(o presence.Observation) {
	h.presenceMu.Lock()
	defer h.presenceMu.Unlock()
	if h.presence != nil {
		h.presence(o)
	}
}

// watchPresence implements connections.
func (h *Hook) watchPresence(fn func(presence.Observation)) []presence.Observation {
	h.presenceMu.Lock()
	defer h.presenceMu.Unlock()
	h.presence = fn
	out := make([]presence.Observation, 0, len(h.current))
	for id, e := range h.current {
		out = append(out, presence.Observation{ClientID: id, Connected: true, At: e.at, Source: presence.SourceBroker})
	}
	return out
}

// disconnectReason says in words why mochi ended cl's connection: what it was stopped with
// (a DISCONNECT it received or sent), else how its read ended.
func (h *Hook) disconnectReason(cl *mqtt.Client, kicked bool, err error) string {
	if kicked {
		return "disconnected by the broker (administrative action: its credentials or rights changed, or it was deleted)"
	}
	var code packets.Code
	if cause := cl.StopCause(); cause != nil && errors.As(cause, &code) {
		switch code.Code {
		case packets.CodeDisconnect.Code:
			return "disconnected (the client sent DISCONNECT)"
		case packets.ErrServerShuttingDown.Code:
			return "the broker shut down"
		case packets.ErrSessionTakenOver.Code:
			return "another connection took its client ID over"
		}
		return fmt.Sprintf("disconnected: %s (%#x)", code.Reason, code.Code)
	}
	switch {
	case h.shuttingDown.Load():
		return "the broker shut down"
	case err == nil:
		return "disconnected (the client sent DISCONNECT)"
	case errors.Is(err, io.EOF):
		return "connection closed without DISCONNECT"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "keep-alive timeout: the client went silent"
	case errors.As(err, &code):
		return fmt.Sprintf("disconnected: %s (%#x)", code.Reason, code.Code)
	}
	return "disconnected: " + err.Error()
}

// OnDisconnect drops any bookkeeping for the client and reports the disconnect (presence) unless
// a newer connection took the client ID over.
func (h *Hook) OnDisconnect(cl *mqtt.Client, err error, _ bool) {
	h.mu.Lock()
	delete(h.pending, cl)
	h.mu.Unlock()
	h.connMu.Lock()
	_, kicked := h.kicked[cl]
	h.connMu.Unlock()
	if !cl.Net.Inline {
		h.presenceMu.Lock()
		if e, ok := h.current[cl.ID]; ok && e.cl == cl {
			delete(h.current, cl.ID)
			if h.presence != nil {
				h.presence(presence.Observation{ClientID: cl.ID, At: time.Now(), Source: presence.SourceBroker, Reason: h.disconnectReason(cl, kicked, err)})
			}
		}
		h.presenceMu.Unlock()
	}
	h.connMu.Lock()
	defer h.connMu.Unlock()
	delete(h.kicked, cl)
	user := string(cl.Properties.Username)
	if conns := h.byUser[user]; conns != nil {
		delete(conns, cl)
		if len(conns) == 0 {
			delete(h.byUser, user)
		}
	}
}

// OnPublish runs for every client PUBLISH that passed the ACL check:
//
//   - it stamps identity.SenderProperty with the publisher's broker username,
//     dropping any copy the client sent, so subscribers know who published;
//   - a QoS 1 publish from an MQTT v5 client that no subscription matches
//     is answered PUBACK 0x10 "no matching subscribers", as Mosquitto does
//     (mochi never says it itself); a retained one is still retained.
func (h *Hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil
	}
	pk.Properties.User = withSender(pk.Properties.User, string(cl.Properties.Username))
	if h.server == nil || pk.FixedHeader.Qos != 1 || cl.Properties.ProtocolVersion != 5 || h.hasSubscribers(pk.TopicName) {
		return pk, nil
	}
	if pk.FixedHeader.Retain {
		// mochi skips its own retain step when a hook answers with a code.
		h.server.Topics.RetainMessage(pk.Copy(false))
	}
	return pk, packets.CodeNoMatchingSubscribers
}

// hasSubscribers reports whether any subscription (plain, shared or
// inline) matches topic, the test Mosquitto makes for 0x10.
func (h *Hook) hasSubscribers(topic string) bool {
	subs := h.server.Topics.Subscribers(topic)
	return len(subs.Subscriptions) > 0 || len(subs.Shared) > 0 || len(subs.InlineSubscriptions) > 0
}

// withSender returns the user properties without any client-supplied
// SenderProperty and with the broker's own.
func withSender(props []packets.UserProperty, username string) []packets.UserProperty {
	out := make([]packets.UserProperty, 0, len(props)+1)
	for _, p := range props {
		if p.Key != identity.SenderProperty {
			out = append(out, p)
		}
	}
	return append(out, packets.UserProperty{Key: identity.SenderProperty, Val: username})
}

// OnPacketEncode makes a PUBACK 0x10 reach the client: mochi's encoder
// omits a success reason code below 0x80 unless the packet has properties
// (and NoInheritedPropertiesOnAck, which MQTT.js needs, strips them), so the
// reason is said in words too. A client that asked for no problem
// information gets a plain PUBACK (the encoder drops the reason string).
func (h *Hook) OnPacketEncode(_ *mqtt.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Puback && pk.ReasonCode == packets.CodeNoMatchingSubscribers.Code && pk.Properties.ReasonString == "" {
		pk.Properties.ReasonString = packets.CodeNoMatchingSubscribers.Reason
	}
	return pk
}

// OnWill checks the Will against publishClientSend when it is about to be
// sent, like Mosquitto; a denied Will, or the Will of a connection a kick
// ended (dynsec does not send those), is redirected to droppedWillTopic and
// not retained, so nobody receives it. An allowed Will carries the sender
// property like any other message.
func (h *Hook) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	user := string(cl.Properties.Username)
	h.connMu.Lock()
	_, kicked := h.kicked[cl]
	h.connMu.Unlock()
	if kicked || !h.store.allows(user, acl.Publish, will.TopicName) {
		will.TopicName = droppedWillTopic
		will.Retain = false
		return will, nil
	}
	will.User = withSender(will.User, user)
	return will, nil
}

// count implements connections.
func (h *Hook) count() int {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	return len(h.byUser)
}

// connected implements connections.
func (h *Hook) connected(user string) bool {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	return len(h.byUser[user]) > 0
}

// each implements connections.
func (h *Hook) each(fn func(string)) {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	for u := range h.byUser {
		fn(u)
	}
}

// kick implements connections: it disconnects every connection of the
// given usernames without sending their Wills, as dynsec's
// mosquitto_kick_client_by_username(..., false) does, and returns the client
// IDs it disconnected by username.
func (h *Hook) kick(usernames []string) map[string][]string {
	type target struct {
		user string
		cl   *mqtt.Client
	}
	var targets []target
	h.connMu.Lock()
	for _, u := range usernames {
		for cl := range h.byUser[u] {
			if !cl.Closed() {
				targets = append(targets, target{u, cl})
				h.kicked[cl] = struct{}{}
			}
		}
	}
	h.connMu.Unlock()
	out := map[string][]string{}
	for _, t := range targets {
		_ = h.server.DisconnectClient(t.cl, packets.ErrAdministrativeAction)
		out[t.user] = append(out[t.user], t.cl.ID)
	}
	return out
}
