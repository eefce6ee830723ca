package mosqtable

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/presence"
)

// ConnID names one connection for as long as it lives: the host's own handle (Mosquitto's
// struct mosquitto pointer, which its MOSQ_EVT_BASIC_AUTH and MOSQ_EVT_DISCONNECT both carry).
// Two live connections never share one; a value may come back for a later connection.
type ConnID uintptr

// KickedReason is the reason the connection events give for a connection the plugin ended
// (the same words as Mosquitto's log line for an administrative disconnect).
const KickedReason = "disconnected by the broker (administrative action: its credentials or rights changed, or it was deleted)"

// ConnectionEndedReason is the reason given for a connection that ended when the broker does not
// say why: Mosquitto 2.0's disconnect event carries no reason, so the plugin cannot tell a
// DISCONNECT from a closed socket or a keep-alive timeout (its log can: docs/broker.md).
const ConnectionEndedReason = "the connection ended (the broker does not tell its plugins why: a DISCONNECT, a closed socket or a keep-alive timeout)"

// refused reports a refused CONNECT of clientID (none when the client sent no ID).
func (p *Plugin) refused(clientID, reason string) {
	if clientID != "" {
		p.publishPresence(presence.PluginEvent{ClientID: clientID, Event: "refused", Reason: reason})
	}
}

// publishPresence sends one connection event on PresenceTopic, stamped with the broker's time.
func (p *Plugin) publishPresence(e presence.PluginEvent) {
	if p.cfg.Publish == nil {
		return
	}
	now := time.Now().UTC()
	if e.Time == nil {
		e.Time = &now
	}
	if out, err := json.Marshal(e); err == nil {
		p.cfg.Publish(PresenceTopic, out)
	}
}

// Presence is the live set now (OpPresence).
func (p *Plugin) Presence() LiveSet { return p.conns.snapshot() }

// liveConns are the connections that passed Authenticate and have not ended, each by its
// ConnID, and reports every change of who is connected (emit).
//
// A connection is forgotten only by its own end, never by a count per username or client ID:
// Mosquitto 2.0 reports ends that match no live connection with the same username and client ID
// as a live one. A refused CONNECT is one (its client ID is cleared first, but the plugin must
// not rely on it), and a taken-over session is another: a client with a persistent session that
// reconnects takes over its old, already ended connection, which connect__on_authorised marks a
// duplicate and ends again, after the new connection authenticated. A count per client ID took
// that second end off the new connection, so the agent showed disconnected while connected.
// A kick does not forget either: it marks the user's connections, whose ends (reported
// synchronously for TCP, later for websockets) then carry the kick's reason.
type liveConns struct {
	mu     sync.Mutex
	conns  map[ConnID]*liveConn
	byUser map[string]map[ConnID]struct{}
	byID   map[string]*liveID
	kick   func(string)
	emit   func(presence.PluginEvent)
}

// liveConn is one connection.
type liveConn struct {
	user, id string
	kicked   bool
}

// liveID is one client ID's live connections: more than one while a new connection takes over
// the session of a live one (Mosquitto ends the old one after the new one authenticated).
type liveID struct {
	user  string
	n     int
	since time.Time // the last connect
}

func newLiveConns(kick func(string), emit func(presence.PluginEvent)) *liveConns {
	return &liveConns{conns: map[ConnID]*liveConn{}, byUser: map[string]map[ConnID]struct{}{},
		byID: map[string]*liveID{}, kick: kick, emit: emit}
}

// connected adds connection conn. The strings are copied: the host may pass views of its own
// memory, valid only during the call.
func (l *liveConns) connected(conn ConnID, user, id string) {
	user, id = strings.Clone(user), strings.Clone(id)
	now := time.Now().UTC()
	l.mu.Lock()
	// A handle still held is a connection whose end was never reported: it is gone now.
	stale, staleGone := l.drop(conn)
	l.conns[conn] = &liveConn{user: user, id: id}
	m := l.byUser[user]
	if m == nil {
		m = map[ConnID]struct{}{}
		l.byUser[user] = m
	}
	m[conn] = struct{}{}
	c := l.byID[id]
	if c == nil {
		c = &liveID{}
		l.byID[id] = c
	}
	c.user, c.since = user, now
	c.n++
	l.mu.Unlock()
	if stale != nil && staleGone && stale.id != id {
		l.emit(presence.PluginEvent{ClientID: stale.id, Username: stale.user, Event: "disconnected", Reason: ConnectionEndedReason})
	}
	l.emit(presence.PluginEvent{ClientID: id, Username: user, Event: "connected", Time: &now})
}

// disconnected forgets connection conn and reports its client ID disconnected when it was the
// ID's last connection.
func (l *liveConns) disconnected(conn ConnID, reason string) {
	l.mu.Lock()
	c, gone := l.drop(conn)
	l.mu.Unlock()
	if c == nil || !gone {
		return // not live: refused, or a taken-over session's second end; or the ID has another
	}
	if c.kicked {
		reason = KickedReason
	}
	l.emit(presence.PluginEvent{ClientID: c.id, Username: c.user, Event: "disconnected", Reason: reason})
}

// drop removes conn (mu held) and reports it (nil when not live) and whether its client ID has
// no connection left.
func (l *liveConns) drop(conn ConnID) (*liveConn, bool) {
	c := l.conns[conn]
	if c == nil {
		return nil, false
	}
	delete(l.conns, conn)
	if m := l.byUser[c.user]; m != nil {
		if delete(m, conn); len(m) == 0 {
			delete(l.byUser, c.user)
		}
	}
	id := l.byID[c.id]
	if id == nil {
		return c, true
	}
	if id.n--; id.n > 0 {
		return c, false
	}
	delete(l.byID, c.id)
	return c, true
}

// snapshot is the live set now, by client ID.
func (l *liveConns) snapshot() LiveSet {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := LiveSet{At: time.Now().UTC(), Clients: make([]LiveClient, 0, len(l.byID))}
	for id, c := range l.byID {
		out.Clients = append(out.Clients, LiveClient{ClientID: id, Username: c.user, Since: c.since})
	}
	slices.SortFunc(out.Clients, func(a, b LiveClient) int { return strings.Compare(a.ClientID, b.ClientID) })
	return out
}

// Count implements embedded.Connections.
func (l *liveConns) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byUser)
}

// Connected implements embedded.Connections.
func (l *liveConns) Connected(user string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byUser[user]) > 0
}

// Each implements embedded.Connections.
func (l *liveConns) Each(fn func(string)) {
	l.mu.Lock()
	users := make([]string, 0, len(l.byUser))
	for u := range l.byUser {
		users = append(users, u)
	}
	l.mu.Unlock()
	for _, u := range users {
		fn(u)
	}
}

// Kick implements embedded.Connections: it marks the users' connections kicked and has the host
// end them (without the lock: Mosquitto reports the ends back, for TCP within the call). Each
// end is reported, with the kick's reason, when the host reports it, so an end that comes late
// cannot take a newer connection with it.
func (l *liveConns) Kick(users []string) map[string][]string {
	out := map[string][]string{}
	for _, u := range users {
		l.mu.Lock()
		var ids []string
		for conn := range l.byUser[u] {
			c := l.conns[conn]
			c.kicked = true
			if !slices.Contains(ids, c.id) {
				ids = append(ids, c.id)
			}
		}
		l.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		l.kick(u)
		out[u] = ids
	}
	return out
}
