package convservice

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/go-logr/logr"

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
//
// Hand-overs lose no request and answer none twice: an assigned replica
// consumes the agent's request topic before it holds the agent and holds
// back (parks) what it receives until it does; the previous owner decides
// until it lets the agent go, then records the requests it handled last
// (Memory.Drop), which the new owner drops as duplicates. A replica
// restarted under the same id takes its leases back from its crashed
// previous run at once (RedisJournal.TakeOver).
type ownership struct {
	replica string
	ttl     time.Duration
	log     logr.Logger
	now     func() time.Time
	mem     *convstore.Memory
	// gated is the registry of gated agents (set once it exists: it is built after the state).
	gated *registry
	j     *convstore.RedisJournal
	token string

	mu   sync.Mutex
	live []string
	// liveKnown: the first heartbeat has returned the live replicas (before
	// it, no agent is known to be assigned elsewhere).
	liveKnown bool
	// changed is closed (and replaced) whenever held or live changes: what
	// parked requests wait on.
	changed chan struct{}
	held    map[string]bool // agents whose lease this replica holds (state loaded)
	// stored are the agents with state in Redis (as of the last round):
	// owned like gated agents, so an agent that stopped being gated still
	// gets its contexts swept, and answered for in history queries.
	stored map[string]bool
}

func newOwnership(cfg Config, log logr.Logger, mem *convstore.Memory, j *convstore.RedisJournal) *ownership {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &ownership{replica: cfg.ReplicaID, ttl: cfg.LeaseTTL, log: log, now: cfg.Now, mem: mem,
		j: j, token: cfg.ReplicaID + "/" + hex.EncodeToString(b), held: map[string]bool{}, stored: map[string]bool{},
		changed: make(chan struct{})}
}

// incarnation is the prefix of every lease token of this replica id, in
// this run and earlier ones (replica ids have no "/").
func (o *ownership) incarnation() string { return o.replica + "/" }

// signalLocked wakes what waits for a change of held or live; o.mu held.
func (o *ownership) signalLocked() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// placement is what a replica does with a message about an agent.
type placement int

const (
	// placeHere: this replica holds the agent: serve.
	placeHere placement = iota
	// placeSoon: the agent is assigned here (or the live replicas are not
	// known yet) but not held yet: hold the message back until it is.
	placeSoon
	// placeElsewhere: another replica is assigned the agent and consumes its
	// request topic: leave the request to it.
	placeElsewhere
)

// place says where agent is served from this replica's point of view.
func (o *ownership) place(agent string) placement {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.placeLocked(agent)
}

func (o *ownership) placeLocked(agent string) placement {
	switch {
	case o.held[agent]:
		return placeHere
	case !o.liveKnown || assigned(agent, o.replica, o.live):
		return placeSoon
	}
	return placeElsewhere
}

// consumes reports whether this replica subscribes agent's request topic:
// it holds the agent, or the agent is assigned to it (it will take it over
// from the previous owner: consuming before it holds the agent, the
// hand-over has no moment where nobody reads the topic).
func (o *ownership) consumes(agent string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.held[agent] || (o.liveKnown && assigned(agent, o.replica, o.live))
}

// awaitHeld blocks until this replica holds agent (true), or the agent is
// assigned elsewhere or ctx ends (false).
func (o *ownership) awaitHeld(ctx context.Context, agent string) bool {
	for {
		o.mu.Lock()
		p, changed := o.placeLocked(agent), o.changed
		o.mu.Unlock()
		switch p {
		case placeHere:
			return true
		case placeElsewhere:
			return false
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
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
	if !slices.Contains(live, o.replica) {
		live = append(slices.Clone(live), o.replica)
	}
	if AssignedReplica(agent, live) != o.replica {
		return historyIgnore
	}
	if stored || o.gated.agent(agent) != nil {
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
// when poked (the set of gated agents changed, a replica joined, left or let
// an agent go). waiting is what the first round (Start runs it before the
// replica reports ready) returned.
func (o *ownership) run(ctx context.Context, poke chan struct{}, waiting bool) {
	kick := func() {
		select {
		case poke <- struct{}{}:
		default:
		}
	}
	go o.j.WatchChanges(ctx, kick)
	round := o.ttl / 3
	joined := false
	for first := true; ; first = false {
		if !first {
			waiting = o.rebalance(ctx)
		}
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
	live, changed, ok := o.heartbeat(ctx)
	if !ok {
		return false
	}
	agents, stale := o.agentsToOwn(ctx)
	empty := o.forgetEmpty(ctx, agents)
	for agent := range empty {
		stale = append(stale, agent)
	}
	renew, takeOvers, handOffs := o.plan(agents, empty, live)
	handOffs = append(stale, handOffs...)
	moved, waiting := o.move(ctx, handOffs, takeOvers)
	if o.renew(ctx, renew) || moved {
		changed = true
	}
	if changed {
		// Subscribe or unsubscribe the request topics to match.
		o.gated.poke()
	}
	return waiting
}

// heartbeat records this replica as live and returns the live replicas, and whether they
// changed (the assignment may have moved: subscriptions and parked requests follow).
func (o *ownership) heartbeat(ctx context.Context) (live []string, changed, ok bool) {
	live, err := o.j.Heartbeat(ctx, o.replica, o.ttl)
	if err != nil {
		if ctx.Err() == nil {
			o.log.Info("replica heartbeat failed; keeping current agents until their leases lapse", "err", err.Error())
		}
		return nil, false, false
	}
	if !slices.Contains(live, o.replica) {
		live = append(live, o.replica)
		slices.Sort(live)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.liveKnown || !slices.Equal(o.live, live) {
		o.live, o.liveKnown, changed = live, true, true
		o.signalLocked()
	}
	return live, changed, true
}

// agentsToOwn are the gated agents and those with state in Redis (an agent that stopped being
// gated keeps its contexts until they expire, under the default policy, and someone must sweep
// them); stale are the agents this replica holds that are neither.
func (o *ownership) agentsToOwn(ctx context.Context) (agents, stale []string) {
	agents = o.gated.keys()
	storedList, err := o.j.Agents(ctx)
	if err != nil {
		o.log.Info("cannot list the agents with stored state; keeping the last list", "err", err.Error())
		o.mu.Lock()
		for a := range o.stored {
			storedList = append(storedList, a)
		}
		o.mu.Unlock()
	}
	// Sets, not slices.Contains: a round is linear in the agents (with 10 000
	// gated agents the nested scans cost more than the round's Redis work).
	toOwn := make(map[string]bool, len(agents)+len(storedList))
	for _, a := range agents {
		toOwn[a] = true
	}
	stored := make(map[string]bool, len(storedList))
	for _, a := range storedList {
		stored[a] = true
		if !toOwn[a] {
			toOwn[a] = true
			agents = append(agents, a)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stored = stored
	for agent := range o.held {
		if !toOwn[agent] {
			stale = append(stale, agent)
		}
	}
	return agents, stale
}

// forgetEmpty forgets the agents this replica holds that are not gated and whose every context
// was swept: their state is gone (they come back if gated again). It returns them.
func (o *ownership) forgetEmpty(ctx context.Context, agents []string) map[string]bool {
	empty := map[string]bool{}
	for _, agent := range agents {
		if o.owns(agent) && o.gated.agent(agent) == nil && o.mem.Empty(agent) {
			empty[agent] = true
		}
	}
	for agent := range empty {
		if err := o.j.ForgetAgent(ctx, agent); err != nil {
			o.log.Info("cannot forget an agent without state", "agent", agent, "err", err.Error())
			delete(empty, agent)
			continue
		}
		o.log.Info("agent no longer gated and without contexts: forgotten", "agent", agent)
	}
	return empty
}

// plan sorts the agents by what this replica does with their leases under the assignment.
func (o *ownership) plan(agents []string, skip map[string]bool, live []string) (renew, takeOvers, handOffs []string) {
	for _, agent := range agents {
		if skip[agent] {
			continue
		}
		mine := assigned(agent, o.replica, live)
		held := o.owns(agent)
		switch {
		case mine && held:
			renew = append(renew, agent)
		case mine && !held:
			takeOvers = append(takeOvers, agent)
		case !mine && held:
			handOffs = append(handOffs, agent)
		}
	}
	return renew, takeOvers, handOffs
}

// move hands agents off and takes agents over. Each is a few Redis round trips (the lease, the
// agent's state, the requests handled last, its inbox): they run ownershipParallel at a time, so
// a replica that starts, or survives another, holds thousands of agents in a fraction of a
// second instead of seconds. It reports whether any agent moved, and whether one assigned here
// is still held by another replica.
func (o *ownership) move(ctx context.Context, handOffs, takeOvers []string) (moved, waiting bool) {
	began := time.Now()
	var mu sync.Mutex
	var taken int
	eachAgent(handOffs, func(agent string) { o.handOff(ctx, agent) })
	eachAgent(takeOvers, func(agent string) {
		ok, busy := o.takeOver(ctx, agent)
		mu.Lock()
		defer mu.Unlock()
		waiting = waiting || busy
		if ok {
			taken++
		}
	})
	if len(handOffs) > 0 {
		// The next owners, retrying, take the agents at once.
		_ = o.j.AnnounceChange(ctx)
	}
	if taken > 0 || len(handOffs) > 0 {
		o.log.Info("agents moved", "taken_over", taken, "handed_over", len(handOffs), "duration", time.Since(began).Round(time.Millisecond).String())
		return true, waiting
	}
	return false, waiting
}

// handedKeep is how long the requests a previous owner handled are dropped
// as duplicates by the next one (and kept in Redis for it): longer than a
// request can wait parked or queued.
const handedKeep = 30 * time.Second

// drop stops deciding for agent and returns the requests it handled last;
// requests still arriving are left to the agent's next owner (its request
// topic is unsubscribed by the registry's next pass).
func (o *ownership) drop(agent string) [][]byte {
	o.mu.Lock()
	delete(o.held, agent)
	o.signalLocked()
	o.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// What this replica decided must be durable before the next owner
	// rebuilds the agent (a commit that was fenced off has nothing to wait
	// for: it failed, and its request was answered with -32004).
	durable, handled := o.mem.Drop(agent)
	_ = durable.Wait(ctx)
	return handled
}

// handOff lets an agent go to its next owner: drop it, record the requests
// handled last for the next owner, release the lease and tell the replicas
// (the next owner, retrying, takes the agent at once).
func (o *ownership) handOff(ctx context.Context, agent string) {
	handled := o.drop(agent)
	if err := o.j.RecordHandled(ctx, agent, handled, handedKeep); err != nil {
		o.log.Info("cannot record the requests handled before the hand-over; the next owner may answer one twice", "agent", agent, "err", err.Error())
	}
	_ = o.j.Release(ctx, agent, o.token)
	o.log.V(1).Info("agent handed over", "agent", agent)
}

// takeOver takes an agent assigned here: its lease (also from this
// replica's previous run: kill -9, restarted under the same id), its state,
// the requests the previous owner handled last and its inbox. busy: the
// previous owner still holds the lease (try again soon).
func (o *ownership) takeOver(ctx context.Context, agent string) (taken, busy bool) {
	ok, err := o.j.TakeOver(ctx, agent, o.token, o.incarnation(), o.ttl)
	if err != nil || !ok {
		return false, true
	}
	if err := o.mem.Recover(ctx, agent, &convstore.Fence{Token: o.token}); err != nil {
		o.log.Error(err, "rebuild agent state", "agent", agent)
		_ = o.j.Release(ctx, agent, o.token)
		return false, false
	}
	if handed, err := o.j.Handled(ctx, agent); err != nil {
		o.log.Info("cannot read the requests the previous owner handled; a request both received may be answered twice", "agent", agent, "err", err.Error())
	} else {
		o.mem.Handed(agent, handed, handedKeep)
	}
	o.applyInbox(ctx, agent)
	o.mu.Lock()
	o.held[agent] = true
	o.signalLocked()
	o.mu.Unlock()
	o.log.V(1).Info("agent taken over", "agent", agent)
	return true, false
}

// ownershipParallel bounds the take-overs and hand-overs a round runs at
// once (each waits on Redis round trips, not on CPU).
const ownershipParallel = 16

// eachAgent runs fn for every agent, ownershipParallel at a time, and
// returns when all are done.
func eachAgent(agents []string, fn func(agent string)) {
	var g errgroup.Group
	g.SetLimit(ownershipParallel)
	for _, agent := range agents {
		g.Go(func() error { fn(agent); return nil })
	}
	_ = g.Wait()
}

// handOver gives an event of an agent this replica does not own to the
// owner (Redis inbox), which applies it on its next round.
func (o *ownership) handOver(ctx context.Context, agent string, ev conversation.Event) {
	if err := o.j.PushEvent(ctx, agent, ev); err != nil {
		o.log.Error(err, "hand reply event to the agent's owner", "agent", agent, "task", ev.TaskID)
	}
}

// renew renews the leases of the agents this replica holds and keeps, and
// applies the events other replicas handed over for them: two pipelined
// calls for the whole round, not two round trips per agent. It reports
// whether an agent was lost (its lease taken by another replica).
func (o *ownership) renew(ctx context.Context, agents []string) (lost bool) {
	if len(agents) == 0 {
		return false
	}
	held, err := o.j.RenewLeases(ctx, agents, o.token, o.ttl)
	if err != nil {
		// Keep the agents: a lease that lapses meanwhile fences this
		// replica's commits off, and the next round finds it lost.
		if ctx.Err() == nil {
			o.log.Info("cannot renew the leases this round; retrying at the next", "agents", len(agents), "err", err.Error())
		}
		return false
	}
	kept := agents[:0:0]
	for i, agent := range agents {
		if held[i] {
			kept = append(kept, agent)
			continue
		}
		o.log.Info("lease on agent lost to another replica", "agent", agent)
		o.drop(agent)
		lost = true
	}
	inboxes, err := o.j.PopInboxes(ctx, kept, inboxBatch)
	if err != nil && ctx.Err() == nil {
		o.log.Error(err, "read handed-over events")
	}
	for agent, evs := range inboxes {
		o.applyEvents(agent, evs)
	}
	return lost
}

// inboxBatch is how many handed-over events of one agent a round applies.
const inboxBatch = 256

// applyPending applies the events waiting in agent's inbox now, instead of
// at the next round, and reports whether there were any. A replica relays a
// reply only after it handed the reply's event over (handOver), so a
// requester's follow-up never overtakes it: the decision that refuses the
// follow-up calls this and decides again.
func (o *ownership) applyPending(ctx context.Context, agent string) bool {
	if !o.owns(agent) {
		return false
	}
	evs, err := o.j.PopEvents(ctx, agent, inboxBatch)
	if err != nil {
		o.log.Error(err, "read handed-over events", "agent", agent)
		return false
	}
	o.applyEvents(agent, evs)
	return len(evs) > 0
}

func (o *ownership) applyInbox(ctx context.Context, agent string) {
	evs, err := o.j.PopEvents(ctx, agent, inboxBatch)
	if err != nil {
		o.log.Error(err, "read handed-over events", "agent", agent)
		return
	}
	o.applyEvents(agent, evs)
}

func (o *ownership) applyEvents(agent string, evs []conversation.Event) {
	for _, ev := range evs {
		if _, _, err := o.mem.Observe(agent, o.gated.policyOf(agent), o.now(), ev); err != nil {
			o.log.Error(err, "apply handed-over event", "agent", agent, "task", ev.TaskID)
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
	if err := o.j.ReleaseLeases(ctx, agents, o.token); err != nil {
		o.log.Info("could not give every lease up; the others take those agents over when the leases lapse", "err", err.Error())
	}
	_ = o.j.Leave(ctx, o.replica)
}
