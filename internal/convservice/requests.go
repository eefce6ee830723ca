package convservice

// The request path (requests): admit, decode, decide, present, forward.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/go-logr/logr"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// onRequest runs on the MQTT receive goroutine: hand over to a worker.
func (s *requests) onRequest(topic string, p *paho.Publish) {
	in := newInbound(p)
	in.topic = topic
	if g := s.agents.byRequestTopic(topic); g != nil && s.place.serves(g.key) && !s.adm.withinRate(in) {
		// Beyond its caller's rate: refused before it waits for a worker, so a
		// flood never queues in front of other callers' requests.
		return
	}
	s.work.dispatch(in.corr, func() { s.handleRequest(in) })
}

// turn is one request on its way through the request path.
type turn struct {
	in  *inbound
	g   *gatedAgent
	req *a2amqtt.InboundRequest
	sp  trace.Span
	// log is built only when a line is written: WithValues encodes its fields.
	log    func() logr.Logger
	method conversation.Method
	ruled  bool
	rt     route
	d      conversation.Decision
	// tracked: the decision started a run that a failed forward must undo.
	tracked bool
	// durable, when set, is the ticket the forward waits for without blocking the worker
	// (decided: when the decision was made).
	durable *convstore.Ticket
	decided time.Time
	// payload and user are the request as the agent takes it.
	payload []byte
	user    paho.UserProperties
}

// handleRequest takes a request to a gated agent through the named steps of the request path;
// each step answers (or drops) what it refuses and says whether the request goes on.
func (s *requests) handleRequest(in *inbound) {
	ctx, cancel := context.WithTimeout(context.Background(), handleTimeout)
	defer cancel()
	ctx, sp := s.sp.span(traceFrom(ctx, in.user), "conversation.request", trace.SpanKindConsumer)
	defer sp.End()
	t := &turn{in: in, sp: sp}
	if !s.admit(ctx, t) || !s.decodeTurn(ctx, t) || !s.decide(ctx, t) {
		return
	}
	s.present(t)
	s.forwardWhenDurable(ctx, t)
}

// admit: the agent is served here, the publisher is who it says, the agent admits it as a
// caller, within its rate, and the profile's checks pass.
func (s *requests) admit(ctx context.Context, t *turn) bool {
	in := t.in
	t.g = s.agents.byRequestTopic(in.topic)
	if t.g != nil && !s.place.serves(t.g.key) && s.place.notHeld(in, t.g.key, func() { s.handleRequest(in) }) {
		// Held back until this replica has taken the agent over, or left
		// to the replica that serves it: nothing to answer here.
		return false
	}
	if !s.adm.verifySender(in) {
		fail(t.sp, "publisher not verified")
		return false
	}
	if t.g == nil {
		// Unsubscribe raced with this message: the agent is no longer gated.
		s.out.replyError(ctx, in, nil, a2amqtt.NewBindingError(a2amqtt.A2AErrorResponderUnavailable,
			"agent is no longer served by the conversation service; retry"))
		return false
	}
	if !s.agents.admits(ctx, t.g.agent, in.caller) {
		// The broker's ACLs are compiled from the same rule: this is a
		// publish the broker let through before its ACLs caught up (or a
		// cache behind them). Dropped, not answered.
		s.log.Info("dropping request of a caller the agent does not admit", "agent", t.g.key, "caller", in.caller.String())
		s.m.rejections.WithLabelValues(reasonCallerNotAdmitted).Inc()
		fail(t.sp, "caller not admitted")
		return false
	}
	if !s.adm.withinRate(in) {
		fail(t.sp, "rate limited")
		return false
	}
	if !s.adm.checkRequest(ctx, in) {
		fail(t.sp, "refused at admission")
		return false
	}
	return true
}

// decodeTurn decodes the JSON-RPC request, holds its header to its body, and gives a v0.3
// request without ids the ids the rules key on.
func (s *requests) decodeTurn(ctx context.Context, t *turn) bool {
	in, g := t.in, t.g
	req := s.adm.decode(ctx, in, true)
	if req == nil {
		return false
	}
	t.req = req
	t.sp.SetAttributes(attrAgent.String(g.key), a2amqtt.AttrMethod.String(req.Method), a2amqtt.AttrTaskID.String(req.TaskID), a2amqtt.AttrContextID.String(req.ContextID))
	t.log = func() logr.Logger {
		return s.log.WithValues("agent", g.key, "method", req.Method, "task", req.TaskID, "context", req.ContextID)
	}
	if prop := in.user.Get(a2amqtt.PropContextID); prop != "" && req.HasMessage && prop != req.ContextID {
		// The same refusal as the SDK responder's: the header and the body
		// of the request must name one context.
		s.m.rejections.WithLabelValues(a2amqtt.A2AErrorTransportProtocolError).Inc()
		s.out.replyError(ctx, in, req.ID, a2amqtt.NewBindingError(a2amqtt.A2AErrorTransportProtocolError,
			fmt.Sprintf("%s user property %q does not match params.message.contextId %q", a2amqtt.PropContextID, prop, req.ContextID)))
		return false
	}
	if req.Dialect == a2amqtt.DialectV03 && req.HasMessage && req.TaskID == "" {
		// v0.3 lets the server create task (and context) ids; over MQTT the
		// rules key on them, so the service creates them for the agent
		// (docs/conversation-service.md, "A2A v0.3 requesters").
		req.TaskID = uuid.NewString()
		if req.ContextID == "" {
			req.ContextID = uuid.NewString()
		}
		payload, err := assignIDs(in.payload, req.TaskID, req.ContextID)
		if err != nil {
			s.out.replyError(ctx, in, req.ID, rpcerr.NewA2A(a2a.ErrInvalidParams, err.Error(), nil, s.cfg.Now()))
			return false
		}
		in.payload = payload
	}
	t.method, t.ruled = conversation.ParseMethod(req.Method)
	t.rt = route{Agent: g.key, TaskID: req.TaskID, ContextID: req.ContextID, Method: t.method, Correlation: in.corr, ResponseTopic: in.respTo}
	t.payload, t.user = in.payload, in.user
	return true
}

// decide: reads and methods the engine does not rule on pass (they change no state); the rest
// is decided by the conversation rules.
func (s *requests) decide(ctx context.Context, t *turn) bool {
	if !t.ruled || t.method == conversation.MethodGetTask || t.method == conversation.MethodListTasks {
		return s.passRead(ctx, t)
	}
	return s.decideByRules(ctx, t) && s.actOnDecision(ctx, t)
}

// passRead forwards a read without a store round trip, once per request across replicas.
func (s *requests) passRead(ctx context.Context, t *turn) bool {
	in, g, req := t.in, t.g, t.req
	if s.owners != nil {
		dup, err := s.mem.Note(g.key, in.corr)
		switch {
		case errors.Is(err, convstore.ErrNotOwner) && s.place.notHeld(in, g.key, func() { s.handleRequest(in) }):
			return false
		case err != nil:
			s.place.unavailable(ctx, in, req.ID, g.key)
			return false
		case dup:
			t.log().V(1).Info("request the previous owner answered dropped")
			return false
		}
	}
	s.m.requests.WithLabelValues(string(conversation.KindRead)).Inc()
	if t.method == conversation.MethodGetTask && req.TaskID != "" && s.ids.agentCreatesIDs(g.key) {
		if _, task := s.mem.Task(g.key, req.TaskID); task != nil && task.AgentTaskID != "" {
			t.payload = s.agentPayload(t.payload, t.method, task)
		}
	}
	return true
}

// decideByRules asks the rules (convstore.Memory.Decide) and arranges for the decision to be
// durable before the request is forwarded: in the common case (no expired tasks to announce
// first) the goroutine that commits it forwards it (Ticket.Then), so this worker does not park
// for the commit. After a crash no accepted request is forgotten and no slot granted twice.
func (s *requests) decideByRules(ctx context.Context, t *turn) bool {
	in, g, req := t.in, t.g, t.req
	now := s.cfg.Now()
	dctx, dsp := s.sp.span(ctx, "conversation.decide", trace.SpanKindInternal)
	defer dsp.End()
	var items []convstore.Item
	var err error
	if req.HasMessage && g.policy.KeepsMessages() {
		if items, err = requestItems(in.payload, req.Dialect, req.MessageID); err != nil {
			t.log().Info("request message not kept in the history", "err", err.Error())
		}
	}
	request := conversation.Request{
		Method: t.method, TaskID: req.TaskID, ContextID: req.ContextID, MessageID: req.MessageID,
		Correlation: in.corr, ResponseTopic: in.respTo, Requester: in.caller.String(),
		Approval: req.HasMessage && isApproval(in.payload, req.Dialect),
	}
	d, ticket, err := s.mem.Decide(g.key, g.policy, now, request, items...)
	if err == nil && d.Kind == conversation.KindReject && s.owners != nil && s.owners.ApplyPending(dctx, g.key) {
		// Another replica relayed an event of this agent's tasks after the agent moved here,
		// and handed it over (the inbox) before the requester saw it: a completion this
		// follow-up may be waiting for. Applied, the rules may say otherwise: decide again.
		// Only refusals pay this round trip.
		earlier := d.Expirations
		d, ticket, err = s.mem.Decide(g.key, g.policy, now, request, items...)
		d.Expirations = append(earlier, d.Expirations...)
	}
	if errors.Is(err, convstore.ErrNotOwner) {
		// The agent went (or has not come yet) between the check above and the decision;
		// nothing was decided.
		if s.owners == nil || !s.place.notHeld(in, g.key, func() { s.handleRequest(in) }) {
			s.place.unavailable(ctx, in, req.ID, g.key)
		}
		return false
	}
	t.d, t.decided = d, time.Now()
	switch {
	case err == nil && d.Forward && len(d.Expirations) == 0:
		t.durable = ticket
	case err == nil && d.Forward:
		err = ticket.Wait(dctx)
		s.m.durableRequest.Observe(time.Since(t.decided).Seconds())
	}
	dsp.SetAttributes(attrDecision.String(string(d.Kind)))
	if err != nil {
		fail(t.sp, "state unavailable")
		s.notDurable(ctx, g, in, req, d, err, t.log)
		return false
	}
	return true
}

// actOnDecision counts the decision, acts on what expired, and answers a refusal; a redelivery
// of a request already forwarded goes no further.
func (s *requests) actOnDecision(ctx context.Context, t *turn) bool {
	d := t.d
	s.m.requests.WithLabelValues(string(d.Kind)).Inc()
	for _, x := range d.Expirations {
		s.exp.expired(ctx, t.g.key, x)
	}
	if d.Kind == conversation.KindReject {
		fail(t.sp, d.Err.Reason())
		t.log().V(1).Info("request rejected", "code", d.Err.Code, "reason", d.Err.Reason())
		s.m.rejections.WithLabelValues(d.Err.Reason()).Inc()
		s.out.replyError(ctx, t.in, t.req.ID, d.Err)
		return false
	}
	if !d.Forward {
		// QoS 1 redelivery of a request already forwarded: its replies flow on the tracked
		// correlation.
		t.log().V(1).Info("duplicate delivery dropped")
		return false
	}
	if d.Context != nil {
		t.rt.ContextID = d.Context.ID
	}
	t.rt.Retry = d.Kind == conversation.KindRetry
	t.tracked = d.Changed && d.Task != nil
	return true
}

// present shapes the request as the agent takes it (presentToAgent) when it addresses a task.
func (s *requests) present(t *turn) {
	if t.d.Task != nil {
		t.payload, t.user = s.presentToAgent(t.g, t.in, t.req, t.method, t.d)
	}
}

// forwardWhenDurable forwards now, or, when the decision is still being committed, from the
// goroutine that commits it.
func (s *requests) forwardWhenDurable(ctx context.Context, t *turn) {
	if t.durable == nil {
		s.forward(ctx, t.g, t.in, t.req, t.payload, t.user, t.rt, t.tracked, t.log)
		return
	}
	detached := context.WithoutCancel(ctx)
	t.durable.Then(func(err error) {
		s.m.durableRequest.Observe(time.Since(t.decided).Seconds())
		if err != nil {
			// Off the committing goroutine: answering publishes.
			go func() {
				if t.tracked {
					s.runs.end(t.g.key, t.req.TaskID)
				}
				s.notDurable(detached, t.g, t.in, t.req, t.d, err, t.log)
			}()
			return
		}
		ctx, cancel := context.WithTimeout(detached, handleTimeout)
		defer cancel()
		s.forward(ctx, t.g, t.in, t.req, t.payload, t.user, t.rt, t.tracked, t.log)
	})
}

// notDurable answers a request whose decision could not be made durable
// (the store is unavailable, or another replica fenced this one off) and
// undoes the run the decision started.
func (s *requests) notDurable(ctx context.Context, g *gatedAgent, in *inbound, req *a2amqtt.InboundRequest, d conversation.Decision, err error, log func() logr.Logger) {
	if d.Changed && d.Task != nil {
		s.undoRun(g, req.TaskID, in.corr)
	}
	msg := "conversation service cannot make its decision durable; retry"
	if errors.Is(err, convstore.ErrNotOwner) {
		// Fenced off: another replica took the agent while this one
		// decided (it was paused past its lease).
		msg = "this conversation service replica no longer serves the agent; retry"
	} else {
		log().Error(err, "conversation state unavailable")
	}
	s.m.rejections.WithLabelValues(a2amqtt.A2AErrorResponderUnavailable).Inc()
	s.out.replyError(ctx, in, req.ID, a2amqtt.NewBindingError(a2amqtt.A2AErrorResponderUnavailable, msg))
}

// forward sends an admitted request on to the agent; when the agent does
// not take it, it undoes the run and answers the requester.
func (s *requests) forward(ctx context.Context, g *gatedAgent, in *inbound, req *a2amqtt.InboundRequest, payload []byte, user paho.UserProperties, rt route, tracked bool, log func() logr.Logger) {
	fctx, fsp := s.sp.span(ctx, "conversation.forward", trace.SpanKindProducer)
	defer fsp.End()
	failed := func(err error) {
		log().Info("cannot forward to the agent", "delivery", g.delivery, "err", err.Error())
		if tracked {
			s.undoRun(g, req.TaskID, in.corr)
			s.runs.end(g.key, req.TaskID)
		}
		s.m.rejections.WithLabelValues(a2amqtt.A2AErrorResponderUnavailable).Inc()
		ctx, cancel := context.WithTimeout(context.Background(), handleTimeout)
		defer cancel()
		s.out.replyError(ctx, in, req.ID, a2amqtt.NewBindingError(a2amqtt.A2AErrorResponderUnavailable,
			fmt.Sprintf("agent %s is not reading its delivery topic", g.key)))
	}
	if err := s.fwd.forwardTo(fctx, g, in, payload, user, rt, failed); err != nil {
		fail(fsp, "agent unavailable")
		failed(err)
		return
	}
	s.m.latency.WithLabelValues("request").Observe(time.Since(in.received).Seconds())
}

// presentToAgent is the request as the agent takes it, and records the run
// a send starts: a task the agent knows by its own id is named by it; a new
// task for an agent that creates its own task ids goes without one
// (taskids.go).
func (s *requests) presentToAgent(g *gatedAgent, in *inbound, req *a2amqtt.InboundRequest, method conversation.Method, d conversation.Decision) ([]byte, paho.UserProperties) {
	payload, user := in.payload, in.user
	agentIDs := false
	switch {
	case d.Task.AgentTaskID != "" || d.Task.AgentContextID != "":
		payload = s.agentPayload(payload, method, d.Task)
		user = withContextProperty(user, d.Task.AgentContextID)
	case req.HasMessage && s.ids.agentCreatesIDs(g.key):
		if p, err := withoutTaskID(payload); err == nil {
			payload, agentIDs = p, true
		} else {
			s.log.Info("cannot present the task without its id", "agent", g.key, "task", req.TaskID, "err", err.Error())
		}
	}
	switch d.Kind {
	case conversation.KindNewContext, conversation.KindNewTask, conversation.KindResume:
		s.runs.start(g.key, req.TaskID, in, req.Dialect, agentIDs)
	}
	return payload, user
}

// agentPayload names the agent's ids in a request (the requester's when the
// rewrite fails: the agent then answers TaskNotFound, which is relayed).
func (s *requests) agentPayload(payload []byte, method conversation.Method, t *conversation.Task) []byte {
	out, err := toAgentIDs(payload, method, t)
	if err != nil {
		s.log.Info("cannot name the agent's task id in the request", "task", t.ID, "err", err.Error())
		return payload
	}
	return out
}

// undoRun undoes the run a decision started, as the agent refusing it would:
// the task must not hold a concurrency slot forever. Written behind: a
// crash before it is durable leaves a submitted task that the first-event
// deadline undoes.
func (s *requests) undoRun(g *gatedAgent, taskID string, corr []byte) {
	_, _, err := s.mem.Observe(g.key, g.policy, s.cfg.Now(), conversation.Event{
		Kind: conversation.EventError, TaskID: taskID, Correlation: corr, Final: true,
	})
	if err != nil {
		s.log.Error(err, "undo forwarded run", "agent", g.key, "task", taskID)
	}
}
