// Package presence keeps what the operator knows about whether each MQTT client is connected,
// from two kinds of observation:
//
//   - the broker's own view, when the broker tells (SourceBroker): the embedded broker's mochi
//     hooks see every connect and disconnect; Mosquitto 2.0 publishes its log lines on
//     $SYS/broker/log/N with `log_dest topic` (ParseMosquittoLog reads them). It covers every
//     client, whatever its SDK, and sees what no client reports: a kick (no Will is sent), a
//     keep-alive timeout, a refused CONNECT.
//   - the profile's presence (SourceCard): the retained card on the agent's discovery topic with
//     a2a-status online (the agent's own card, published at every connect) or offline (its LWT,
//     or its card at a graceful stop). Only clients that publish it are covered, and it goes
//     stale when no Will fires (a kick).
//
// A client the broker has reported on is judged by the broker alone; the card decides only for
// clients the broker said nothing about since the operator started (Mosquitto without the log
// topic, or clients connected before the operator). Pure: no I/O, injected times.
package presence

import (
	"sync"
	"time"
)

// Sources of an observation.
const (
	SourceBroker = "Broker"
	SourceCard   = "Card"
)

// Observation is one thing learned about a client ID.
type Observation struct {
	ClientID string
	// Connected: the client connected (true) or disconnected (false).
	Connected bool
	// Refused: a CONNECT with this client ID was refused (Connected is false; the state of a
	// connection that is up does not change).
	Refused bool
	At      time.Time
	// Reason says why a client disconnected or was refused, in words.
	Reason string
	// Source is SourceBroker or SourceCard.
	Source string
}

// State is what is known of one client ID.
type State struct {
	// Known: some observation was made. Connected is meaningful only then.
	Known     bool
	Connected bool
	// Source of the observation the state follows.
	Source string
	// Since is when the client last connected (Connected) or disconnected (not Connected).
	Since time.Time
	// LastConnect, LastDisconnect and LastDisconnectReason remember the latest of each.
	LastConnect, LastDisconnect time.Time
	LastDisconnectReason        string
	// LastRefused is when CONNECTs with this client ID began to be refused, and LastRefusedReason
	// why (zero when none since the client was last connected).
	LastRefused       time.Time
	LastRefusedReason string
}

type entry struct {
	broker, card State
}

// Source is a broker that tells its own view: every connect, disconnect and refused CONNECT
// (the embedded broker's Store).
type Source interface {
	// WatchPresence sends every observation to fn from now on (fn must not block) and returns
	// the clients connected now.
	WatchPresence(fn func(Observation)) []Observation
}

// Tracker keeps the State of every client ID observed. Safe for concurrent use.
type Tracker struct {
	mu      sync.Mutex
	clients map[string]*entry
	// onChange is called, outside the lock, with a client ID whose State changed.
	onChange func(clientID string)
}

// NewTracker returns an empty Tracker; onChange (optional) is told every client ID whose State
// changed. It must not block.
func NewTracker(onChange func(clientID string)) *Tracker {
	return &Tracker{clients: map[string]*entry{}, onChange: onChange}
}

// Observe records o and reports whether the client's State changed.
func (t *Tracker) Observe(o Observation) bool {
	if o.ClientID == "" {
		return false
	}
	t.mu.Lock()
	e := t.clients[o.ClientID]
	if e == nil {
		e = &entry{}
		t.clients[o.ClientID] = e
	}
	before := e.state()
	s := &e.card
	if o.Source == SourceBroker {
		s = &e.broker
	}
	apply(s, o)
	changed := e.state() != before
	t.mu.Unlock()
	if changed && t.onChange != nil {
		t.onChange(o.ClientID)
	}
	return changed
}

func apply(s *State, o Observation) {
	s.Source = o.Source
	switch {
	case o.Refused:
		// The first refusal since the client was last connected: a client retrying every
		// second changes nothing more.
		if s.LastRefused.IsZero() {
			s.LastRefused = o.At
		}
		s.LastRefusedReason = o.Reason
		if !s.Known {
			s.Known, s.Since = true, o.At
		}
	case o.Connected:
		s.Known = true
		if !s.Connected {
			s.Connected, s.Since = true, o.At
		}
		s.LastConnect = o.At
		s.LastRefused, s.LastRefusedReason = time.Time{}, ""
	default:
		s.Known = true
		if s.Connected || s.Since.IsZero() {
			s.Since = o.At
		}
		s.Connected = false
		s.LastDisconnect, s.LastDisconnectReason = o.At, o.Reason
	}
}

// state is the broker's view when it has one, the card's otherwise.
func (e *entry) state() State {
	if e.broker.Known {
		return e.broker
	}
	return e.card
}

// State returns what is known of clientID.
func (t *Tracker) State(clientID string) State {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.clients[clientID]; e != nil {
		return e.state()
	}
	return State{}
}

// Forget drops what the broker told about every client (its view restarts: a broker restart, or
// a reconnect of the connection that listens to it), keeping what the cards said. The clients
// whose State changed are reported.
func (t *Tracker) Forget(source string) {
	t.mu.Lock()
	var changed []string
	for id, e := range t.clients {
		before := e.state()
		if source == SourceBroker {
			e.broker = State{}
		} else {
			e.card = State{}
		}
		if e.state() != before {
			changed = append(changed, id)
		}
	}
	t.mu.Unlock()
	if t.onChange != nil {
		for _, id := range changed {
			t.onChange(id)
		}
	}
}
