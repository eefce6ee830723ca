package ownership

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
)

// Config configures a Replica.
type Config struct {
	// Replica is this replica's id (unique among live replicas; no "/").
	Replica string
	// TTL is how long a lease lasts without renewal; a round runs every third of it.
	TTL time.Duration
	// Now is the clock the handed-over events are applied at.
	Now func() time.Time
	Log logr.Logger
}

// Replica is one replica's share of the agents: what it holds, and the rounds that take,
// renew and give up leases to match the assignment.
type Replica struct {
	cfg    Config
	leases Leases
	state  State
	agents Agents
	// token is this run's lease token; incarnation the prefix of every token of this
	// replica id, in this run and earlier ones (replica ids have no "/").
	token, incarnation string
	h                  *holdings
	// inbox is held while handed-over events are popped and applied, by a round and by
	// ApplyPending: a refusal that asks for them waits for a round that has popped an agent's
	// events but not applied them yet, instead of finding the inbox empty and the state old.
	inbox sync.Mutex
	// applied counts, per agent, the handed-over events applied (by a round or ApplyPending),
	// so ApplyPending can tell that a round applied some while it waited for inbox.
	appliedMu sync.Mutex
	applied   map[string]uint64
}

// New is a replica that holds nothing yet: Rebalance (then Run) takes its share.
func New(cfg Config, leases Leases, state State, agents Agents) *Replica {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &Replica{cfg: cfg, leases: leases, state: state, agents: agents,
		token: cfg.Replica + "/" + hex.EncodeToString(b), incarnation: cfg.Replica + "/", h: newHoldings(cfg.Replica)}
}

// Place says where agent is served from this replica's point of view.
func (r *Replica) Place(agent string) Placement { return r.h.place(agent) }

// Consumes reports whether this replica subscribes agent's request topic:
// it holds the agent, or the agent is assigned to it (it will take it over
// from the previous owner: consuming before it holds the agent, the
// hand-over has no moment where nobody reads the topic).
func (r *Replica) Consumes(agent string) bool { return r.h.consumes(agent) }

// Owns reports whether this replica decides for agent now.
func (r *Replica) Owns(agent string) bool { return r.h.owns(agent) }

// AwaitHeld blocks until this replica holds agent (true), or the agent is
// assigned elsewhere or ctx ends (false).
func (r *Replica) AwaitHeld(ctx context.Context, agent string) bool { return r.h.awaitHeld(ctx, agent) }

// Answers says whether this replica answers a history query about an agent it does not
// hold (assigned: the agent's assigned replica answers), and whether the agent has state
// (gated, or stored) that this replica has not taken over yet.
func (r *Replica) Answers(agent string) (assignedHere, hasState bool) {
	live, stored := r.h.liveAndStored(agent)
	if AssignedReplica(agent, live) != r.cfg.Replica {
		return false, false
	}
	return true, stored || r.agents.Gated(agent)
}

// Run heartbeats and rebalances every third of the lease TTL, and at once
// when poked (the set of gated agents changed, a replica joined, left or let
// an agent go). waiting is what the first round (Rebalance, run before the
// replica reports ready) returned.
func (r *Replica) Run(ctx context.Context, poke chan struct{}, waiting bool) {
	kick := func() {
		select {
		case poke <- struct{}{}:
		default:
		}
	}
	go r.leases.WatchChanges(ctx, kick)
	round := r.cfg.TTL / 3
	joined := false
	for first := true; ; first = false {
		if !first {
			waiting = r.Rebalance(ctx)
		}
		if !joined {
			// Tell the others this replica is live: they hand its share
			// over now, not at their next round.
			if err := r.leases.AnnounceChange(ctx); err == nil {
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

// Rebalance takes, renews and gives up leases to match the assignment. It
// reports whether an agent assigned here is still held by another replica.
func (r *Replica) Rebalance(ctx context.Context) (waiting bool) {
	live, changed, ok := r.heartbeat(ctx)
	if !ok {
		return false
	}
	agents, stale := r.agentsToOwn(ctx)
	empty := r.forgetEmpty(ctx, agents)
	for agent := range empty {
		stale = append(stale, agent)
	}
	renew, takeOvers, handOffs := plan(r.cfg.Replica, agents, empty, live, r.h.owns)
	handOffs = append(stale, handOffs...)
	moved, waiting := r.move(ctx, handOffs, takeOvers)
	if r.renew(ctx, renew) || moved {
		changed = true
	}
	if changed {
		// Subscribe or unsubscribe the request topics to match.
		r.agents.Resubscribe()
	}
	return waiting
}

// heartbeat records this replica as live and returns the live replicas, and whether they
// changed (the assignment may have moved: subscriptions and parked requests follow).
func (r *Replica) heartbeat(ctx context.Context) (live []string, changed, ok bool) {
	live, err := r.leases.Heartbeat(ctx, r.cfg.Replica, r.cfg.TTL)
	if err != nil {
		if ctx.Err() == nil {
			r.cfg.Log.Info("replica heartbeat failed; keeping current agents until their leases lapse", "err", err.Error())
		}
		return nil, false, false
	}
	if !slices.Contains(live, r.cfg.Replica) {
		live = append(live, r.cfg.Replica)
		slices.Sort(live)
	}
	return live, r.h.setLive(live), true
}

// agentsToOwn are the gated agents and those with stored state (an agent that stopped being
// gated keeps its contexts until they expire, under the default policy, and someone must sweep
// them); stale are the agents this replica holds that are neither.
func (r *Replica) agentsToOwn(ctx context.Context) (agents, stale []string) {
	agents = r.agents.Keys()
	storedList, err := r.leases.Agents(ctx)
	if err != nil {
		r.cfg.Log.Info("cannot list the agents with stored state; keeping the last list", "err", err.Error())
		storedList = append(storedList, r.h.storedList()...)
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
	return agents, r.h.setStored(stored, toOwn)
}

// forgetEmpty forgets the agents this replica holds that are not gated and whose every context
// was swept: their state is gone (they come back if gated again). It returns them.
func (r *Replica) forgetEmpty(ctx context.Context, agents []string) map[string]bool {
	empty := map[string]bool{}
	for _, agent := range agents {
		if r.h.owns(agent) && !r.agents.Gated(agent) && r.state.Empty(agent) {
			empty[agent] = true
		}
	}
	for agent := range empty {
		if err := r.leases.ForgetAgent(ctx, agent); err != nil {
			r.cfg.Log.Info("cannot forget an agent without state", "agent", agent, "err", err.Error())
			delete(empty, agent)
			continue
		}
		r.cfg.Log.Info("agent no longer gated and without contexts: forgotten", "agent", agent)
	}
	return empty
}

// plan sorts the agents by what replica does with their leases under the assignment.
func plan(replica string, agents []string, skip map[string]bool, live []string, held func(string) bool) (renew, takeOvers, handOffs []string) {
	for _, agent := range agents {
		if skip[agent] {
			continue
		}
		mine := assigned(agent, replica, live)
		holds := held(agent)
		switch {
		case mine && holds:
			renew = append(renew, agent)
		case mine && !holds:
			takeOvers = append(takeOvers, agent)
		case !mine && holds:
			handOffs = append(handOffs, agent)
		}
	}
	return renew, takeOvers, handOffs
}

// move hands agents off and takes agents over. Each is a few round trips (the lease, the
// agent's state, the requests handled last, its inbox): they run parallel at a time, so
// a replica that starts, or survives another, holds thousands of agents in a fraction of a
// second instead of seconds. It reports whether any agent moved, and whether one assigned here
// is still held by another replica.
func (r *Replica) move(ctx context.Context, handOffs, takeOvers []string) (moved, waiting bool) {
	began := time.Now()
	var mu sync.Mutex
	var taken int
	eachAgent(handOffs, func(agent string) { r.handOff(ctx, agent) })
	eachAgent(takeOvers, func(agent string) {
		ok, busy := r.takeOver(ctx, agent)
		mu.Lock()
		defer mu.Unlock()
		waiting = waiting || busy
		if ok {
			taken++
		}
	})
	if len(handOffs) > 0 {
		// The next owners, retrying, take the agents at once.
		_ = r.leases.AnnounceChange(ctx)
	}
	if taken > 0 || len(handOffs) > 0 {
		r.cfg.Log.Info("agents moved", "taken_over", taken, "handed_over", len(handOffs), "duration", time.Since(began).Round(time.Millisecond).String())
		return true, waiting
	}
	return false, waiting
}

// handedKeep is how long the requests a previous owner handled are dropped
// as duplicates by the next one (and kept in the store for it): longer than a
// request can wait parked or queued.
const handedKeep = 30 * time.Second

// drop stops deciding for agent and returns the requests it handled last;
// requests still arriving are left to the agent's next owner (its request
// topic is unsubscribed by the registry's next pass).
func (r *Replica) drop(agent string) [][]byte {
	r.h.hold(agent, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// What this replica decided must be durable before the next owner
	// rebuilds the agent (a commit that was fenced off has nothing to wait
	// for: it failed, and its request was answered with -32004).
	durable, handled := r.state.Drop(agent)
	_ = durable.Wait(ctx)
	return handled
}

// handOff lets an agent go to its next owner: drop it, record the requests
// handled last for the next owner, release the lease and tell the replicas
// (the next owner, retrying, takes the agent at once).
func (r *Replica) handOff(ctx context.Context, agent string) {
	handled := r.drop(agent)
	if err := r.leases.RecordHandled(ctx, agent, handled, handedKeep); err != nil {
		r.cfg.Log.Info("cannot record the requests handled before the hand-over; the next owner may answer one twice", "agent", agent, "err", err.Error())
	}
	_ = r.leases.Release(ctx, agent, r.token)
	r.cfg.Log.V(1).Info("agent handed over", "agent", agent)
}

// takeOver takes an agent assigned here: its lease (also from this
// replica's previous run: kill -9, restarted under the same id), its state,
// the requests the previous owner handled last and its inbox. busy: the
// previous owner still holds the lease (try again soon).
func (r *Replica) takeOver(ctx context.Context, agent string) (taken, busy bool) {
	ok, err := r.leases.TakeOver(ctx, agent, r.token, r.incarnation, r.cfg.TTL)
	if err != nil || !ok {
		return false, true
	}
	if err := r.state.Recover(ctx, agent, &convstore.Fence{Token: r.token}); err != nil {
		r.cfg.Log.Error(err, "rebuild agent state", "agent", agent)
		_ = r.leases.Release(ctx, agent, r.token)
		return false, false
	}
	if handed, err := r.leases.Handled(ctx, agent); err != nil {
		r.cfg.Log.Info("cannot read the requests the previous owner handled; a request both received may be answered twice", "agent", agent, "err", err.Error())
	} else {
		r.state.Handed(agent, handed, handedKeep)
	}
	r.applyInbox(ctx, agent)
	r.h.hold(agent, true)
	r.cfg.Log.V(1).Info("agent taken over", "agent", agent)
	return true, false
}

// parallel bounds the take-overs and hand-overs a round runs at
// once (each waits on round trips, not on CPU).
const parallel = 16

// eachAgent runs fn for every agent, parallel at a time, and
// returns when all are done.
func eachAgent(agents []string, fn func(agent string)) {
	var g errgroup.Group
	g.SetLimit(parallel)
	for _, agent := range agents {
		g.Go(func() error { fn(agent); return nil })
	}
	_ = g.Wait()
}

// HandOver gives an event of an agent this replica does not own to the
// owner (inbox), which applies it on its next round.
func (r *Replica) HandOver(ctx context.Context, agent string, ev conversation.Event) {
	if err := r.leases.PushEvent(ctx, agent, ev); err != nil {
		r.cfg.Log.Error(err, "hand reply event to the agent's owner", "agent", agent, "task", ev.TaskID)
	}
}

// renew renews the leases of the agents this replica holds and keeps, and
// applies the events other replicas handed over for them: two pipelined
// calls for the whole round, not two round trips per agent. It reports
// whether an agent was lost (its lease taken by another replica).
func (r *Replica) renew(ctx context.Context, agents []string) (lost bool) {
	if len(agents) == 0 {
		return false
	}
	held, err := r.leases.RenewLeases(ctx, agents, r.token, r.cfg.TTL)
	if err != nil {
		// Keep the agents: a lease that lapses meanwhile fences this
		// replica's commits off, and the next round finds it lost.
		if ctx.Err() == nil {
			r.cfg.Log.Info("cannot renew the leases this round; retrying at the next", "agents", len(agents), "err", err.Error())
		}
		return false
	}
	kept := agents[:0:0]
	for i, agent := range agents {
		if held[i] {
			kept = append(kept, agent)
			continue
		}
		r.cfg.Log.Info("lease on agent lost to another replica", "agent", agent)
		r.drop(agent)
		lost = true
	}
	r.inbox.Lock()
	defer r.inbox.Unlock()
	inboxes, err := r.leases.PopInboxes(ctx, kept, inboxBatch)
	if err != nil && ctx.Err() == nil {
		r.cfg.Log.Error(err, "read handed-over events")
	}
	for agent, evs := range inboxes {
		r.applyEvents(agent, evs)
	}
	return lost
}

// inboxBatch is how many handed-over events of one agent a round applies.
const inboxBatch = 256

// ApplyPending applies the events waiting in agent's inbox now, instead of
// at the next round, and reports whether any were applied: by this call, or
// by a round that had popped them and was applying them while this call
// waited (the inbox lock), which an empty inbox alone would hide. A replica relays a
// reply only after it handed the reply's event over (HandOver), so a
// requester's follow-up never overtakes it: the decision that refuses the
// follow-up calls this and decides again.
func (r *Replica) ApplyPending(ctx context.Context, agent string) bool {
	if !r.h.owns(agent) {
		return false
	}
	applied := func() uint64 {
		r.appliedMu.Lock()
		defer r.appliedMu.Unlock()
		return r.applied[agent]
	}
	before := applied()
	n := r.applyInbox(ctx, agent)
	return n > 0 || applied() != before
}

// applyInbox applies the events waiting in agent's inbox and returns how many there were.
func (r *Replica) applyInbox(ctx context.Context, agent string) int {
	r.inbox.Lock()
	defer r.inbox.Unlock()
	evs, err := r.leases.PopEvents(ctx, agent, inboxBatch)
	if err != nil {
		r.cfg.Log.Error(err, "read handed-over events", "agent", agent)
		return 0
	}
	r.applyEvents(agent, evs)
	return len(evs)
}

func (r *Replica) applyEvents(agent string, evs []conversation.Event) {
	if len(evs) > 0 {
		r.appliedMu.Lock()
		if r.applied == nil {
			r.applied = map[string]uint64{}
		}
		r.applied[agent] += uint64(len(evs))
		r.appliedMu.Unlock()
	}
	for _, ev := range evs {
		if _, _, err := r.state.Observe(agent, r.agents.PolicyOf(agent), r.cfg.Now(), ev); err != nil {
			r.cfg.Log.Error(err, "apply handed-over event", "agent", agent, "task", ev.TaskID)
		}
	}
}

// Release gives every lease up and leaves the live set (clean shutdown), so
// the other replicas take the agents over at once instead of after the TTL.
func (r *Replica) Release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	agents := r.h.releaseAll()
	if err := r.leases.ReleaseLeases(ctx, agents, r.token); err != nil {
		r.cfg.Log.Info("could not give every lease up; the others take those agents over when the leases lapse", "err", err.Error())
	}
	_ = r.leases.Leave(ctx, r.cfg.Replica)
}
