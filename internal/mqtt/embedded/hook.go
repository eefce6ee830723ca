package embedded

import (
	"bytes"
	"strings"
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// droppedWillTopic replaces the topic of a Will the client may not publish:
// mochi cannot cancel a Will from a hook, so it is redirected here, where
// every delivery is refused (Mosquitto checks a Will against
// publishClientSend when sending it and drops it if denied).
const droppedWillTopic = "$a2a-fleet/dropped-will"

// Hook is the mochi hook enforcing a Store: CONNECT authentication and every
// ACL check. Add it as the only auth hook (mochi allows an operation when
// any hook allows it).
type Hook struct {
	mqtt.HookBase
	store *Store

	// pending holds, per client, the filters of the SUBSCRIBE being
	// processed. mochi reports both the subscribe check (topic = filter) and
	// each delivery (topic = topic name) as OnACLCheck(write=false); a
	// wildcard or $share filter can only be a subscription, a plain one is
	// ambiguous only while its SUBSCRIBE is in flight.
	mu      sync.Mutex
	pending map[*mqtt.Client]map[string]int
}

// NewHook returns the hook for s.
func NewHook(s *Store) *Hook {
	return &Hook{store: s, pending: map[*mqtt.Client]map[string]int{}}
}

// ID implements mqtt.Hook.
func (h *Hook) ID() string { return "a2a-fleet-acl" }

// Provides implements mqtt.Hook.
func (h *Hook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnConnectAuthenticate,
		mqtt.OnACLCheck,
		mqtt.OnSubscribe,
		mqtt.OnSubscribed,
		mqtt.OnWill,
		mqtt.OnDisconnect,
	}, []byte{b})
}

// OnConnectAuthenticate mirrors dynsec: a username and a password are
// required (no anonymous access), the client ID must equal the configured
// one when set, and the password must match the stored hash.
func (h *Hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	if !pk.Connect.UsernameFlag || !pk.Connect.PasswordFlag {
		return false
	}
	return h.store.authenticate(string(pk.Connect.Username), string(pk.Connect.Password), cl.ID)
}

// OnACLCheck answers with acl.Policy (the admin user may do anything).
func (h *Hook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if cl.Net.Inline {
		return true // the server's own inline client
	}
	user := string(cl.Properties.Username)
	if write {
		return h.store.decide(user, acl.Publish, topic).Allow
	}
	if strings.HasPrefix(topic, droppedWillTopic) {
		return false
	}
	if strings.ContainsAny(topic, "+#") || mqtt.IsSharedFilter(topic) {
		return h.store.decide(user, acl.Subscribe, topic).Allow
	}
	if h.isPending(cl, topic) {
		// Either this SUBSCRIBE's check or a delivery racing with it: require
		// both, which is never more permissive than Mosquitto.
		return h.store.decide(user, acl.Subscribe, topic).Allow && h.store.decide(user, acl.Receive, topic).Allow
	}
	return h.store.decide(user, acl.Receive, topic).Allow
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

// OnDisconnect drops any bookkeeping for the client.
func (h *Hook) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.pending, cl)
}

// OnWill checks the Will against publishClientSend when it is about to be
// sent, like Mosquitto; a denied Will is redirected to droppedWillTopic and
// not retained, so nobody receives it.
func (h *Hook) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	if h.store.decide(string(cl.Properties.Username), acl.Publish, will.TopicName).Allow {
		return will, nil
	}
	will.TopicName = droppedWillTopic
	will.Retain = false
	return will, nil
}

// kick disconnects every connected client of the given usernames without
// sending their Wills, as dynsec's mosquitto_kick_client_by_username(...,
// false) does.
func kick(server *mqtt.Server, usernames []string) {
	set := make(map[string]bool, len(usernames))
	for _, u := range usernames {
		set[u] = true
	}
	for _, cl := range server.Clients.GetAll() {
		if cl.Net.Inline || cl.Closed() || !set[string(cl.Properties.Username)] {
			continue
		}
		atomic.StoreUint32(&cl.Properties.Will.Flag, 0)
		_ = server.DisconnectClient(cl, packets.ErrAdministrativeAction)
	}
}
