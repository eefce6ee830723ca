package convservice

// The reply path (replies): unseal the route, observe the event, relay it.

import (
	"context"
	"errors"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

func (s *replies) onReply(p *paho.Publish) {
	in := newInbound(p)
	s.work.dispatch(in.corr, func() { s.handleReply(in) })
}

func (s *replies) handleReply(in *inbound) {
	ctx, cancel := context.WithTimeout(context.Background(), handleTimeout)
	defer cancel()
	ctx, sp := s.sp.span(traceFrom(ctx, in.user), "conversation.relay", trace.SpanKindConsumer)
	defer sp.End()
	rt, err := s.seal.open(in.corr)
	if err != nil {
		fail(sp, "unsealed correlation data")
		s.m.replies.WithLabelValues("dropped_unsealed").Inc()
		s.log.Info("dropping reply with unknown correlation data", "topic", in.topic)
		return
	}
	sp.SetAttributes(attrAgent.String(rt.Agent), a2amqtt.AttrMethod.String(string(rt.Method)), a2amqtt.AttrTaskID.String(rt.TaskID), a2amqtt.AttrContextID.String(rt.ContextID))
	// Built only when a line is written: WithValues encodes its fields.
	log := func() logr.Logger { return s.log.WithValues("agent", rt.Agent, "task", rt.TaskID, "method", rt.Method) }
	payload := in.payload
	var durable *convstore.Ticket
	if rt.TaskID != "" {
		s.place.awaitReplyAgent(ctx, rt.Agent)
	}
	if s.replayed(rt, in.corr) {
		fail(sp, "replayed reply")
		s.m.replies.WithLabelValues("dropped_replay").Inc()
		log().Info("dropping a reply on a route that already ended (a replay)")
		return
	}
	first := s.routes.seen(in.corr, time.Now())
	// last: this reply ends its route (a2amqtt.EndsReplies: a unary result, a stream-final
	// event, an error): relayed with its PUBACK counted. Until the reply is read, the method
	// alone says so (a SendMessage reply that cannot be read is its result).
	last := a2amqtt.EndsReplies(string(rt.Method), a2amqtt.ReplyItem{Kind: a2amqtt.ReplyOther, First: first})
	switch {
	case rt.TaskID != "":
		var relay bool
		payload, relay, last, durable = s.observeReply(ctx, rt, payload, first, last)
		if !relay {
			return
		}
	case rt.Method == conversation.MethodListTasks && rt.ContextID != "" && s.ids.agentCreatesIDs(rt.Agent):
		payload = toRequesterIDs(payload, s.contextPairs(rt.Agent, rt.ContextID))
	}
	if last {
		// Nothing may follow the route's last reply: a replay of any of its replies is dropped.
		s.routes.finish(in.corr, time.Now())
	}
	if rt.Internal {
		s.m.replies.WithLabelValues("internal").Inc()
		return
	}
	s.relay(ctx, in, rt, payload, last, durable, log)
}

// relay sends a reply on to the requester: a stream item pipelined (after its event is durable
// when it must be), the last reply once its event is durable (relayLast).
func (s *replies) relay(ctx context.Context, in *inbound, rt route, payload []byte, last bool, durable *convstore.Ticket, log func() logr.Logger) {
	out := &paho.Publish{
		Topic: rt.ResponseTopic, QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{CorrelationData: rt.Correlation, ContentType: in.contentType, User: withTrace(ctx, in.user)},
	}
	if durable != nil && !last {
		// Not the stream's last item, but it must be durable before it is
		// relayed: wait here, so the items after it stay in order.
		observed := time.Now()
		if err := durable.Wait(ctx); err != nil {
			log().Error(err, "make reply event durable")
		}
		s.m.durableReply.Observe(time.Since(observed).Seconds())
		durable = nil
	}
	if !last {
		// Stream items are pipelined: the worker owning this correlation
		// sends in order, and a long stream is not paced by one PUBACK
		// round trip per item; without the PUBACK they count as
		// relayed_unconfirmed, not relayed.
		if err := s.conn.PublishAsync(ctx, out); err != nil {
			s.m.replies.WithLabelValues("relay_failed").Inc()
			log().Error(err, "relay reply", "response_topic", rt.ResponseTopic)
			return
		}
		s.m.replies.WithLabelValues("relayed_unconfirmed").Inc()
		s.m.latency.WithLabelValues("reply").Observe(time.Since(in.received).Seconds())
		return
	}
	if durable != nil {
		// The final event is relayed once durable, by the goroutine that
		// commits it (Ticket.Then): this worker does not park for the
		// commit.
		detached := context.WithoutCancel(ctx)
		observed := time.Now()
		durable.Then(func(err error) {
			s.m.durableReply.Observe(time.Since(observed).Seconds())
			if err != nil {
				// Relaying matters more than bookkeeping: the memory state
				// is right; the store is not ready (readiness).
				log().Error(err, "make reply event durable")
			}
			ctx, cancel := context.WithTimeout(detached, handleTimeout)
			defer cancel()
			s.relayLast(ctx, in, rt, out, log)
		})
		return
	}
	s.relayLast(ctx, in, rt, out, log)
}

// relayLast relays the last reply of a stream (or a unary result), counted
// by its PUBACK (in order behind the pipelined items), so the counters say
// what the broker did with it; nothing waits for the PUBACK.
func (s *replies) relayLast(ctx context.Context, in *inbound, rt route, out *paho.Publish, log func() logr.Logger) {
	err := s.conn.PublishNotify(ctx, out, func(resp *paho.PublishResponse, err error) {
		switch {
		case resp != nil && resp.ReasonCode >= 0x80:
			s.m.replies.WithLabelValues("relay_refused").Inc()
			log().Info("broker refused the relayed reply", "response_topic", rt.ResponseTopic, "reason", resp.ReasonCode)
		case err != nil:
			s.m.replies.WithLabelValues("relay_failed").Inc()
			log().Error(err, "relay reply", "response_topic", rt.ResponseTopic)
		case resp != nil && resp.ReasonCode == reasonNoMatchingSubscribers:
			// Accepted, but nobody reads the requester's reply topic (it left).
			s.m.replies.WithLabelValues("relayed_unread").Inc()
		default:
			s.m.replies.WithLabelValues("relayed").Inc()
		}
	})
	s.m.latency.WithLabelValues("reply").Observe(time.Since(in.received).Seconds())
	if err != nil {
		s.m.replies.WithLabelValues("relay_failed").Inc()
		log().Error(err, "relay reply", "response_topic", rt.ResponseTopic)
	}
}

// observeReply applies a reply of the agent to the engine before it is
// relayed: the ids it names are translated to the requester's (agents that
// create their own task ids), a pause records the responder's continuation
// hint with the service's accepted_history_digest (stamped into the relayed
// status message), history content is kept (mode Messages), and the final
// event of a stream is durable before it is relayed. It returns the payload
// to relay, whether to relay it (a first answer that made the service
// present the task again is not), whether it ends its stream and, for a
// final event, the ticket that must be durable before it is relayed (nil
// when nothing is left to wait for).
func (s *replies) observeReply(ctx context.Context, rt route, payload []byte, first, last bool) ([]byte, bool, bool, *convstore.Ticket) {
	// Built only when a line is written: WithValues encodes its fields.
	log := func() logr.Logger { return s.log.WithValues("agent", rt.Agent, "task", rt.TaskID, "method", rt.Method) }
	pr, err := parseReply(payload)
	if err != nil {
		log().Info("reply not understood; relaying without observing it", "err", err.Error())
		return payload, true, last, nil
	}
	if pr.ev.Kind == "" {
		return payload, true, last, nil
	}
	if pr.ev.Kind == conversation.EventError && !rt.Internal && s.reshape(ctx, rt, pr) {
		s.m.replies.WithLabelValues("task_presented_again").Inc()
		return nil, false, last, nil
	}
	ev := pr.ev
	payload = s.toRequesterIDs(rt, pr, &ev, payload)
	// The sealed route, not the payload, says which task this is: error
	// replies carry no task id, and an agent must not move another task's
	// state.
	ev.TaskID, ev.ContextID = rt.TaskID, rt.ContextID
	ev.Correlation = rt.Correlation
	// The route ends at its stream-final reply, whatever the method: a SendMessage may be
	// answered with a stream of events, as SendStreamingMessage is.
	ev.Final = a2amqtt.EndsReplies(string(rt.Method), pr.item(first))
	// A Task opening a stream only acknowledges the run unless terminal (core A2A servers open
	// with the task as it stands); as a SendMessage's first reply it is the result.
	ev.Snapshot = pr.isTask && first && streaming(rt.Method)
	pause := !ev.Snapshot && (ev.State == a2a.TaskStateInputRequired || ev.State == a2a.TaskStateAuthRequired)
	if pause && !rt.Internal {
		payload = s.recordHint(rt, pr, &ev, payload, log)
	}
	pol := s.agents.policyOf(rt.Agent)
	var items []convstore.Item
	if pol.KeepsMessages() {
		if items, err = replyItems(payload, pr); err != nil {
			log().Info("reply content not kept in the history", "err", err.Error())
		}
	}
	last = ev.Final
	durable := s.record(ctx, rt, pol, ev, items, log)
	return payload, true, last, durable
}

// toRequesterIDs names the requester's ids in a reply of an agent that creates its own task
// ids, and records the agent's ids on the event (taskids.go).
func (s *replies) toRequesterIDs(rt route, pr parsedReply, ev *conversation.Event, payload []byte) []byte {
	if !s.ids.agentCreatesIDs(rt.Agent) {
		return payload
	}
	pairs := replyPairs(rt, pr)
	for _, p := range pairs {
		if p.requester == rt.TaskID {
			ev.AgentTaskID = p.agent
		} else {
			ev.AgentContextID = p.agent
		}
	}
	return toRequesterIDs(payload, pairs)
}

// recordHint records the continuation hint of a pause with the service's
// accepted_history_digest and stamps the digest into the relayed status message.
func (s *replies) recordHint(rt route, pr parsedReply, ev *conversation.Event, payload []byte, log func() logr.Logger) []byte {
	h, err := hintOf(pr.statusMessage)
	if err != nil {
		log().Info("ignoring a malformed continuation hint", "err", err.Error())
	}
	digest, known, err := s.runs.digest(rt.Agent, rt.TaskID)
	switch {
	case err != nil:
		log().Info("cannot compute the accepted history digest", "err", err.Error())
	case !known:
		log().V(1).Info("run unknown (forwarded before a restart): pause relayed without a digest")
	}
	ev.Continuation = withDigest(h, digest)
	if digest != "" {
		if stamped, err := stampHint(payload, *ev.Continuation); err == nil {
			payload = stamped
		} else if !errors.Is(err, errNoStatusMessage) {
			log().Info("cannot stamp the digest into the relayed status", "err", err.Error())
		}
	}
	return payload
}

// record applies a reply event to the agent's state, ends the run it finished and acts on what
// expired. For the final event of a stream it returns the ticket that must be durable before
// the event is relayed (nil when nothing is left to wait for).
func (s *replies) record(ctx context.Context, rt route, pol conversation.Policy, ev conversation.Event, items []convstore.Item, log func() logr.Logger) *convstore.Ticket {
	o, ticket, err := s.mem.Observe(rt.Agent, pol, s.cfg.Now(), ev, items...)
	var durable *convstore.Ticket
	switch {
	case errors.Is(err, convstore.ErrNotOwner) && s.owners != nil:
		// The agent moved to another replica after this one forwarded the
		// request: its owner applies the event (not its history content).
		s.owners.HandOver(ctx, rt.Agent, ev)
	case err != nil:
		log().Error(err, "record reply event")
	case convstore.Final(o) && len(o.Expirations) == 0:
		// The final event of a stream is durable before the requester sees
		// it: a follow-up it sends at once, and any replica after a crash,
		// find the slot free. The caller relays it once it is.
		durable = ticket
	case convstore.Final(o):
		observed := time.Now()
		if err := ticket.Wait(ctx); err != nil {
			// Relaying matters more than bookkeeping: the memory state is
			// right; the store is not ready (readiness).
			log().Error(err, "make reply event durable")
		}
		s.m.durableReply.Observe(time.Since(observed).Seconds())
	}
	if err == nil && o.Known && (o.Task == nil || !runningState(o.Task.State)) {
		s.runs.end(rt.Agent, rt.TaskID)
	}
	for _, x := range o.Expirations {
		s.exp.expired(ctx, rt.Agent, x)
	}
	return durable
}

// contextPairs are the id translations of every task of a context that the
// agent knows by its own ids.
func (s *replies) contextPairs(agent, contextID string) []idPair {
	c := s.mem.Context(agent, contextID)
	if c == nil {
		return nil
	}
	var pairs []idPair
	for _, t := range c.Tasks {
		if t.AgentTaskID != "" {
			pairs = append(pairs, idPair{t.AgentTaskID, t.ID})
		}
		if t.AgentContextID != "" {
			pairs = append(pairs, idPair{t.AgentContextID, c.ID})
		}
	}
	return pairs
}
