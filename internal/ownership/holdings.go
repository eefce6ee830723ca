package ownership

import (
	"context"
	"hash/fnv"
	"slices"
	"sync"
)

// Placement is what a replica does with a message about an agent.
type Placement int

const (
	// PlaceHere: this replica holds the agent: serve.
	PlaceHere Placement = iota
	// PlaceSoon: the agent is assigned here (or the live replicas are not
	// known yet) but not held yet: hold the message back until it is.
	PlaceSoon
	// PlaceElsewhere: another replica is assigned the agent and consumes its
	// request topic: leave the request to it.
	PlaceElsewhere
)

// AssignedReplica is the replica (among live) that owns agent: rendezvous
// hashing, the same on every replica.
func AssignedReplica(agent string, live []string) string {
	best, bestScore := "", uint64(0)
	for _, r := range live {
		h := fnv.New64a()
		h.Write([]byte(r))
		h.Write([]byte{0})
		h.Write([]byte(agent))
		if sc := h.Sum64(); best == "" || sc > bestScore {
			best, bestScore = r, sc
		}
	}
	return best
}

// assigned reports whether agent belongs to replica among live.
func assigned(agent, replica string, live []string) bool {
	return AssignedReplica(agent, live) == replica
}

// holdings is what one replica knows, under one lock: the live replicas, the agents it holds
// and the agents with stored state. Waiters learn of every change (changed).
type holdings struct {
	replica string

	mu   sync.Mutex
	live []string
	// liveKnown: the first heartbeat has returned the live replicas (before
	// it, no agent is known to be assigned elsewhere).
	liveKnown bool
	// changed is closed (and replaced) whenever held or live changes: what
	// parked requests wait on.
	changed chan struct{}
	held    map[string]bool // agents whose lease this replica holds (state loaded)
	// stored are the agents with state in the shared store (as of the last round):
	// owned like gated agents, so an agent that stopped being gated still
	// gets its contexts swept, and answered for in history queries.
	stored map[string]bool
}

func newHoldings(replica string) *holdings {
	return &holdings{replica: replica, held: map[string]bool{}, stored: map[string]bool{}, changed: make(chan struct{})}
}

// signalLocked wakes what waits for a change of held or live; h.mu held.
func (h *holdings) signalLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *holdings) placeLocked(agent string) Placement {
	switch {
	case h.held[agent]:
		return PlaceHere
	case !h.liveKnown || assigned(agent, h.replica, h.live):
		return PlaceSoon
	}
	return PlaceElsewhere
}

// place says where agent is served from this replica's point of view.
func (h *holdings) place(agent string) Placement {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.placeLocked(agent)
}

// consumes reports whether this replica subscribes agent's request topic: it holds the agent,
// or the agent is assigned to it.
func (h *holdings) consumes(agent string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held[agent] || (h.liveKnown && assigned(agent, h.replica, h.live))
}

// owns reports whether this replica holds agent.
func (h *holdings) owns(agent string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held[agent]
}

// awaitHeld blocks until this replica holds agent (true), or the agent is
// assigned elsewhere or ctx ends (false).
func (h *holdings) awaitHeld(ctx context.Context, agent string) bool {
	for {
		h.mu.Lock()
		p, changed := h.placeLocked(agent), h.changed
		h.mu.Unlock()
		switch p {
		case PlaceHere:
			return true
		case PlaceElsewhere:
			return false
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// setLive records the live replicas and reports whether they changed.
func (h *holdings) setLive(live []string) (changed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.liveKnown && slices.Equal(h.live, live) {
		return false
	}
	h.live, h.liveKnown = live, true
	h.signalLocked()
	return true
}

// liveAndStored returns the live replicas (this one included) and whether agent has stored state.
func (h *holdings) liveAndStored(agent string) (live []string, stored bool) {
	h.mu.Lock()
	live, stored = h.live, h.stored[agent]
	h.mu.Unlock()
	if !slices.Contains(live, h.replica) {
		live = append(slices.Clone(live), h.replica)
	}
	return live, stored
}

// storedList is the agents with stored state as of the last round.
func (h *holdings) storedList() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.stored))
	for a := range h.stored {
		out = append(out, a)
	}
	return out
}

// setStored records the agents with stored state and returns the held agents not in toOwn.
func (h *holdings) setStored(stored, toOwn map[string]bool) (stale []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stored = stored
	for agent := range h.held {
		if !toOwn[agent] {
			stale = append(stale, agent)
		}
	}
	return stale
}

// hold records that this replica holds agent (true) or no longer does (false).
func (h *holdings) hold(agent string, held bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if held {
		h.held[agent] = true
	} else {
		delete(h.held, agent)
	}
	h.signalLocked()
}

// releaseAll forgets every held agent and returns them.
func (h *holdings) releaseAll() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	agents := make([]string, 0, len(h.held))
	for a := range h.held {
		agents = append(agents, a)
	}
	h.held = map[string]bool{}
	return agents
}
