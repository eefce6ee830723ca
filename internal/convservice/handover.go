package convservice

import (
	"context"
	"fmt"
	"time"

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
	if s.owners.place(agent) == placeElsewhere {
		s.m.requests.WithLabelValues(kindElsewhere).Inc()
		s.log.V(1).Info("request for an agent another replica serves left to it", "agent", agent, "topic", in.topic)
		s.gated.dropStale(in.topic)
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
		s.owners.awaitHeld(ctx, agent)
		s.dispatch(in.corr, retry)
	}()
	return true
}

// unavailable answers a request for an agent this replica could not take
// over in time.
func (s *handover) unavailable(ctx context.Context, in *inbound, id any, agent string) {
	s.m.rejections.WithLabelValues(a2amqtt.A2AErrorResponderUnavailable).Inc()
	s.replyError(ctx, in, id, a2amqtt.NewBindingError(a2amqtt.A2AErrorResponderUnavailable,
		fmt.Sprintf("agent %s is being taken over by another conversation service replica; retry", agent)))
}

// awaitReplyAgent holds a reply back (on its worker, so its stream keeps its
// order) while its agent is being taken over by this replica, so the event
// is applied to the agent's state before it is relayed: a restarted replica
// receives the replies to what its previous run forwarded before it holds
// the agents again. Bounded by HandoverWait; then the event is handed to the
// owner's inbox as for any agent this replica does not hold.
func (s *handover) awaitReplyAgent(ctx context.Context, agent string) {
	if s.owners == nil || s.owners.place(agent) != placeSoon {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.HandoverWait)
	defer cancel()
	s.owners.awaitHeld(wctx, agent)
}
