package convservice

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
)

// ownership splits the gated agents between the replicas that share a Redis
// journal. Each replica heartbeats into the live set; every agent is assigned
// by rendezvous hashing over the live replicas (each replica computes the
// same assignment, and a replica joining or leaving moves only its share).
// An assigned replica takes the agent's lease (fencing token), rebuilds the
// agent's state from the journal and only then consumes its request topic;
// from then on it decides from memory with no round trip but the fenced
// group commit. A replica that loses an agent's assignment stops consuming
// its requests, then gives the lease up; one whose lease was taken (it was
// paused past the TTL) is fenced off by the commit script and drops the
// agent. Replies reaching a replica that no longer owns their agent are
// relayed as always and their events handed to the owner (inbox).
//
// This is also the partition of request topics between replicas on brokers
// without shared subscriptions on $-topics (Mosquitto 2.0.x): each request
// is delivered to its agent's owner only, with no per-request claim.
type ownership struct {
	s     *Service
	j     *convstore.RedisJournal
	token string

	mu   sync.Mutex
	live []string
	held map[string]bool // agents whose lease this replica holds (state loaded)
	// stored are the agents with state in Redis (as of the last round):
	// owned like gated agents, so an agent that stopped being gated still
	// gets its contexts swept, and answered for in history queries.
	stored map[string]bool
}

func newOwnership(s *Service, j *convstore.RedisJournal) *ownership {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &ownership{s: s, j: j, token: s.cfg.ReplicaID + "/" + hex.EncodeToString(b), held: map[string]bool{}, stored: map[string]bool{}}
}

// historyRole says whether this replica answers a history query about an
// agent it does not hold: the agent's assigned replica answers; an agent
// with state (gated, or stored in Redis) that it has not taken over yet is
// refused with -32004 (retryable), an agent nobody has state for is
// answered from nothing (TaskNotFound, an empty list).
func (o *ownership) historyRole(agent string) historyRole {
	o.mu.Lock()
	live, stored := o.live, o.stored[agent]
	o.mu.Unlock()
	if !slices.Contains(live, o.s.cfg.ReplicaID) {
		live = append(slices.Clone(live), o.s.cfg.ReplicaID)
	}
	if AssignedReplica(agent, live) != o.s.cfg.ReplicaID {
		return historyIgnore
	}
	if stored || o.s.gated.agent(agent) != nil {
		return historyUnavailable
	}
	return historyAnswer
}

// assigned reports whether agent belongs to this replica among live.
func assigned(agent, replica string, live []string) bool {
	return AssignedReplica(agent, live) == replica
}

// AssignedReplica is the replica (among live) that owns agent: rendezvous
// hashing, the same on every replica. Exported for tooling and tests that
// want to know where an agent lives.
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

// owns reports whether this replica decides for agent now.
func (o *ownership) owns(agent string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.held[agent]
}

// run heartbeats and rebalances every third of the lease TTL, and at once
// when poked (the set of gated agents changed).
func (o *ownership) run(ctx context.Context, poke chan struct{}) {
	kick := func() {
		select {
		case poke <- struct{}{}:
		default:
		}
	}
	go o.j.WatchChanges(ctx, kick)
	round := o.s.cfg.LeaseTTL / 3
	joined := false
	for {
		waiting := o.rebalance(ctx)
		if !joined {
			// Tell the others this replica is live: they hand its share
			// over now, not at their next round.
			if err := o.j.AnnounceChange(ctx); err == nil {
				joined = true
			}
		}
		next := round
		if waiting {
			// An agent assigned here is still held by its previous owner,
			// which is handing it over: try again soon.
			next = min(round, 200*time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		case <-poke:
		}
	}
}

// rebalance takes, renews and gives up leases to match the assignment. It
// reports whether an agent assigned here is still held by another replica.
func (o *ownership) rebalance(ctx context.Context) (waiting bool) {
	ttl := o.s.cfg.LeaseTTL
	live, err := o.j.Heartbeat(ctx, o.s.cfg.ReplicaID, ttl)
	if err != nil {
		if ctx.Err() == nil {
			o.s.log.Info("replica heartbeat failed; keeping current agents until their leases lapse", "err", err.Error())
		}
		return false
	}
	if !slices.Contains(live, o.s.cfg.ReplicaID) {
		live = append(live, o.s.cfg.ReplicaID)
	}
	o.mu.Lock()
	o.live = live
	o.mu.Unlock()
	changed := false
	// The agents to own: the gated ones, and those with state in Redis (an
	// agent that stopped being gated keeps its contexts until they expire,
	// under the default policy, and someone must sweep them).
	agents := o.s.gated.keys()
	storedList, err := o.j.Agents(ctx)
	if err != nil {
		o.s.log.Info("cannot list the agents with stored state; keeping the last list", "err", err.Error())
		o.mu.Lock()
		for a := range o.stored {
			storedList = append(storedList, a)
		}
		o.mu.Unlock()
	}
	stored := make(map[string]bool, len(storedList))
	for _, a := range storedList {
		stored[a] = true
		if !slices.Contains(agents, a) {
			agents = append(agents, a)
		}
	}
	o.mu.Lock()
	o.stored = stored
	var stale, empty []string
	for agent := range o.held {
		if !slices.Contains(agents, agent) {
			stale = append(stale, agent)
		}
	}
	o.mu.Unlock()
	for _, agent := range agents {
		if o.owns(agent) && o.s.gated.agent(agent) == nil && o.s.mem.Empty(agent) {
			empty = append(empty, agent)
		}
	}
	for _, agent := range empty {
		// Not gated and every context swept: its state is gone; forget it
		// (it comes back if it is gated again).
		if err := o.j.ForgetAgent(ctx, agent); err != nil {
			o.s.log.Info("cannot forget an agent without state", "agent", agent, "err", err.Error())
			continue
		}
		stale = append(stale, agent)
		o.s.log.Info("agent no longer gated and without contexts: forgotten", "agent", agent)
	}
	for _, agent := range stale {
		// Nothing to decide or sweep for it any more.
		o.drop(agent)
		_ = o.j.Release(ctx, agent, o.token)
		changed = true
	}
	for _, agent := range agents {
		if slices.Contains(empty, agent) {
			continue
		}
		mine := assigned(agent, o.s.cfg.ReplicaID, live)
		held := o.owns(agent)
		switch {
		case mine && held:
			ok, err := o.j.Acquire(ctx, agent, o.token, ttl)
			if err == nil && !ok {
				o.s.log.Info("lease on agent lost to another replica", "agent", agent)
				o.drop(agent)
				changed = true
			}
			if err == nil && ok {
				o.applyInbox(ctx, agent)
			}
		case mine && !held:
			ok, err := o.j.Acquire(ctx, agent, o.token, ttl)
			if err != nil || !ok {
				waiting = true // the previous owner still holds it
				continue
			}
			if err := o.s.mem.Recover(ctx, agent, &convstore.Fence{Token: o.token}); err != nil {
				o.s.log.Error(err, "rebuild agent state", "agent", agent)
				_ = o.j.Release(ctx, agent, o.token)
				continue
			}
			o.mu.Lock()
			o.held[agent] = true
			o.mu.Unlock()
			o.applyInbox(ctx, agent)
			o.s.log.Info("agent taken over", "agent", agent)
			changed = true
		case !mine && held:
			o.drop(agent)
			_ = o.j.Release(ctx, agent, o.token)
			o.s.log.Info("agent handed over", "agent", agent)
			changed = true
		}
	}
	if changed {
		// Subscribe or unsubscribe the request topics to match.
		o.s.gated.poke()
	}
	return waiting
}

// drop stops deciding for agent: its request topic is unsubscribed by the
// registry's next pass; requests already queued get responder_unavailable.
func (o *ownership) drop(agent string) {
	o.mu.Lock()
	delete(o.held, agent)
	o.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// What this replica decided must be durable before the next owner
	// rebuilds the agent (a commit that was fenced off has nothing to wait
	// for: it failed, and its request was answered with -32004).
	_ = o.s.mem.Drop(agent).Wait(ctx)
}

// handOver gives an event of an agent this replica does not own to the
// owner (Redis inbox), which applies it on its next round.
func (o *ownership) handOver(ctx context.Context, agent string, ev conversation.Event) {
	if err := o.j.PushEvent(ctx, agent, ev); err != nil {
		o.s.log.Error(err, "hand reply event to the agent's owner", "agent", agent, "task", ev.TaskID)
	}
}

func (o *ownership) applyInbox(ctx context.Context, agent string) {
	evs, err := o.j.PopEvents(ctx, agent, 256)
	if err != nil {
		o.s.log.Error(err, "read handed-over events", "agent", agent)
		return
	}
	for _, ev := range evs {
		if _, _, err := o.s.mem.Observe(agent, o.s.gated.policyOf(agent), o.s.cfg.Now(), ev); err != nil {
			o.s.log.Error(err, "apply handed-over event", "agent", agent, "task", ev.TaskID)
		}
	}
}

// release gives every lease up and leaves the live set (clean shutdown), so
// the other replicas take the agents over at once instead of after the TTL.
func (o *ownership) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	o.mu.Lock()
	agents := make([]string, 0, len(o.held))
	for a := range o.held {
		agents = append(agents, a)
	}
	o.held = map[string]bool{}
	o.mu.Unlock()
	for _, a := range agents {
		_ = o.j.Release(ctx, a, o.token)
	}
	_ = o.j.Leave(ctx, o.s.cfg.ReplicaID)
}
