package convservice

import (
	"context"
	"fmt"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/ownership"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// maxParked bounds the requests held back at once until their agents are
// taken over; past it, requests are answered -32004 at once.
const maxParked = 10000

// kindElsewhere counts (requests_total) requests received for an agent that
// another replica serves: during a hand-over both consume its request topic,
// and a persistent session may still hold a subscription of an agent that
// moved while this replica was down. The serving replica answers them.
const kindElsewhere = "elsewhere"

// kindParked counts (requests_total) requests held back until this replica
// had taken their agent over.
const kindParked = "parked"

// notHeld handles a request for an agent this replica does not hold (several
// replicas). It reports whether the request was taken care of: held back
// until this replica holds the agent (it is assigned here: a hand-over or a
// restart in progress), or left to the replica the agent is assigned to.
// retry handles the request again once held. False: the request already waited HandoverWait;
// answer it -32004.
func (s *handover) notHeld(in *inbound, agent string, retry func()) bool {
	if s.owners.Place(agent) == ownership.PlaceElsewhere {
		s.m.requests.WithLabelValues(kindElsewhere).Inc()
		s.log.V(1).Info("request for an agent another replica serves left to it", "agent", agent, "topic", in.topic)
		s.stale.dropStale(in.topic)
		return true
	}
	return s.parkUntilHeld(in, agent, retry)
}

// parkUntilHeld runs retry (on the message's worker) once this replica holds
// agent, once the agent turns out to be assigned elsewhere, or after
// HandoverWait since the message arrived. False when the message was parked
// before (or too many are): the caller answers it.
func (s *handover) parkUntilHeld(in *inbound, agent string, retry func()) bool {
	if in.parked {
		return false
	}
	if s.parked.Add(1) > maxParked {
		s.parked.Add(-1)
		return false
	}
	in.parked = true
	s.m.requests.WithLabelValues(kindParked).Inc()
	go func() {
		defer s.parked.Add(-1)
		ctx, cancel := context.WithTimeout(s.runCtx, s.cfg.HandoverWait-time.Since(in.received))
		defer cancel()
		s.owners.AwaitHeld(ctx, agent)
		s.work.dispatch(in.corr, retry)
	}()
	return true
}

// unavailable answers a request for an agent this replica could not take
// over in time.
func (s *handover) unavailable(ctx context.Context, in *inbound, id any, agent string) {
	s.m.rejections.WithLabelValues(a2amqtt.A2AErrorResponderUnavailable).Inc()
	s.out.replyError(ctx, in, id, a2amqtt.NewBindingError(a2amqtt.A2AErrorResponderUnavailable,
		fmt.Sprintf("agent %s is being taken over by another conversation service replica; retry", agent)))
}

// awaitReplyAgent holds a reply back (on its worker, so its stream keeps its
// order) while its agent is being taken over by this replica, so the event
// is applied to the agent's state before it is relayed: a restarted replica
// receives the replies to what its previous run forwarded before it holds
// the agents again. Bounded by HandoverWait; then the event is handed to the
// owner's inbox as for any agent this replica does not hold.
func (s *handover) awaitReplyAgent(ctx context.Context, agent string) {
	if s.owners == nil || s.owners.Place(agent) != ownership.PlaceSoon {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.HandoverWait)
	defer cancel()
	s.owners.AwaitHeld(wctx, agent)
}

// AssignedReplica is the replica (among live) that owns agent: rendezvous
// hashing, the same on every replica (ownership.AssignedReplica). Exported for tooling and
// tests that want to know where an agent lives.
func AssignedReplica(agent string, live []string) string {
	return ownership.AssignedReplica(agent, live)
}

// ownedAgents is the registry as the ownership reads it (ownership.Agents).
type ownedAgents struct{ r *registry }

func (a ownedAgents) Keys() []string                            { return a.r.keys() }
func (a ownedAgents) Gated(agent string) bool                   { return a.r.agent(agent) != nil }
func (a ownedAgents) PolicyOf(agent string) conversation.Policy { return a.r.policyOf(agent) }
func (a ownedAgents) Resubscribe()                              { a.r.poke() }

// serves reports whether this replica decides for agent: always with one
// replica, else while it owns the agent.
func (s *handover) serves(agent string) bool {
	return s.owners == nil || s.owners.Owns(agent)
}

// consumes reports whether this replica subscribes agent's request topic:
// always with one replica, else while it owns the agent or is assigned it.
func (s *handover) consumes(agent string) bool {
	return s.owners == nil || s.owners.Consumes(agent)
}

// historyRole says what this replica does with a history query about an
// agent (every replica receives them).
type historyRole int

const (
	// historyAnswer: answer from memory (this replica owns the agent; an
	// agent nobody holds state for is answered as empty by its assigned
	// replica).
	historyAnswer historyRole = iota
	// historyIgnore: another replica answers.
	historyIgnore
	// historyUnavailable: the agent has state that no replica holds yet
	// (it is being taken over): answer -32004, retryable.
	historyUnavailable
)

// historyRole: the replica that holds the agent answers; one that does not hold it answers
// when the agent is assigned to it (an agent with state, gated or stored, that it has not taken
// over yet is refused -32004, retryable; an agent nobody has state for is answered from nothing:
// TaskNotFound, an empty list); any other replica ignores the query.
func (s *handover) historyRole(agent string) historyRole {
	if s.serves(agent) {
		return historyAnswer
	}
	switch assignedHere, hasState := s.owners.Answers(agent); {
	case !assignedHere:
		return historyIgnore
	case hasState:
		return historyUnavailable
	}
	return historyAnswer
}
