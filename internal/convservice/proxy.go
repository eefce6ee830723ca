package convservice

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/go-logr/logr"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// reasonNoMatchingSubscribers is PUBACK reason 0x10: nobody reads the topic
// (the agent is not connected to its delivery topic).
const reasonNoMatchingSubscribers = 0x10

// handleTimeout bounds the store and broker work of one message.
const handleTimeout = 30 * time.Second

// inbound is a copy of what a handler needs of a received publish (paho
// reuses nothing, but the copy keeps handlers independent of it).
type inbound struct {
	topic       string
	payload     []byte
	respTo      string
	corr        []byte
	user        paho.UserProperties
	contentType string
	expiry      *uint32
	received    time.Time
	// parked: the message already waited for its agent to be taken over
	// (parkUntilHeld); it is not held back twice.
	parked bool
	// verified: the publisher is caller (verifySender), and respTo is one of
	// its reply topics; only then is it answered.
	verified bool
	caller   a2amqtt.AgentRef
	// rateChecked: the caller's rate was checked (withinRate), once.
	rateChecked bool
}

func newInbound(p *paho.Publish) *inbound {
	in := &inbound{topic: p.Topic, payload: p.Payload, received: time.Now()}
	if pp := p.Properties; pp != nil {
		in.respTo, in.corr, in.user, in.contentType, in.expiry = pp.ResponseTopic, pp.CorrelationData, pp.User, pp.ContentType, pp.MessageExpiry
	}
	return in
}

// onRequest runs on the MQTT receive goroutine: hand over to a worker.
func (s *requests) onRequest(topic string, p *paho.Publish) {
	in := newInbound(p)
	in.topic = topic
	if g := s.gated.byRequestTopic(topic); g != nil && s.serves(g.key) && !s.withinRate(in) {
		// Beyond its caller's rate: refused before it waits for a worker, so a
		// flood never queues in front of other callers' requests.
		return
	}
	s.dispatch(in.corr, func() { s.handleRequest(in) })
}

// onQueued routes a message that arrived before its handler was registered
// (a persistent session's backlog at reconnect); workers run it once the
// replica is started.
func (s *Service) onQueued(p *paho.Publish) {
	in := newInbound(p)
	s.workers.dispatch(in.corr, func() {
		switch {
		case in.topic == s.replyTopic:
			s.replies.handleReply(in)
		case in.topic == identity.Service.RequestTopic():
			s.history.handleHistory(in)
		default:
			s.requests.handleRequest(in)
		}
	})
}

func (s *replies) onReply(p *paho.Publish) {
	in := newInbound(p)
	s.dispatch(in.corr, func() { s.handleReply(in) })
}

// verifySender establishes who is asking: the publisher the broker stamped
// (identity.SenderProperty), which must be an agent naming a reply topic of
// its own as Response Topic. Anything else is dropped and counted, never
// answered: the answer would go where the requester may not publish. On
// success the request is marked verified and in.caller set: only then may
// the service answer it (replyError).
func (s *admission) verifySender(in *inbound) bool {
	caller, reason, why := verifiedCaller(in)
	if reason != "" {
		s.log.Info("dropping request: "+why, "topic", in.topic, "response_topic", in.respTo, "sender", in.user.Get(identity.SenderProperty))
		s.m.rejections.WithLabelValues(reason).Inc()
		return false
	}
	in.caller, in.verified = caller, true
	return true
}

// verifiedCaller is the publisher a request may be answered to, or why
// there is none (a rejections_total reason and a phrase).
func verifiedCaller(in *inbound) (caller a2amqtt.AgentRef, reason, why string) {
	switch {
	case in.respTo == "":
		// No reply path: the profile allows dropping.
		return caller, "no_response_topic", "no Response Topic"
	case strings.ContainsAny(in.respTo, "+#"):
		return caller, "no_response_topic", "a wildcard Response Topic"
	}
	sender, present, ok := senderIdentity(in)
	if !present {
		// The broker did not say who published (a Mosquitto without the
		// sender-stamp plugin): nobody can be verified, nobody is answered.
		return caller, reasonSenderMissing, "the broker did not stamp it with its publisher (is the sender-stamp plugin loaded?)"
	}
	if owner, isReply := replyIdentity(in.respTo); !ok || !isReply || owner != sender {
		return caller, reasonReplyTopicNotPermitted, "its Response Topic is not the publisher's own reply topic"
	}
	return sender, "", ""
}

// withinRate checks a request's caller against its rate (ratelimit.go),
// as the message arrives or in the worker; false when the request was
// refused (its answer queued, or dropped unanswered). A request whose
// publisher cannot be verified passes: verifySender drops it, counted.
func (s *admission) withinRate(in *inbound) bool {
	if s.limiter == nil || in.rateChecked {
		return true
	}
	caller, reason, _ := verifiedCaller(in)
	if reason != "" {
		return true
	}
	in.rateChecked = true
	ok, wait, answer := s.limiter.allow(caller, time.Now())
	if !ok {
		s.refuseForRate(in, bucketKey{ref: caller, budget: budgetCaller}, wait, answer)
	}
	return ok
}

// answerRateLimited publishes the rate-limit answers, without waiting for
// their PUBACKs, until the replica closes.
func (s *admission) answerRateLimited() {
	for {
		select {
		case <-s.quit:
			return
		case p := <-s.rateAnswers:
			ctx, cancel := context.WithTimeout(s.runCtx, publishTimeout)
			if err := s.conn.PublishAsync(ctx, p); err != nil {
				s.log.Info("cannot answer a rate-limited request", "response_topic", p.Topic, "err", err.Error())
			}
			cancel()
		}
	}
}

// checkRequest applies the profile's checks of a verified request shared by
// the proxy and the history endpoint, answering the ones it refuses. It
// returns false when the request was answered.
func (s *admission) checkRequest(ctx context.Context, in *inbound) bool {
	if len(in.corr) == 0 {
		s.m.rejections.WithLabelValues(a2amqtt.A2AErrorTransportProtocolError).Inc()
		s.replyError(ctx, in, nil, a2amqtt.NewBindingError(a2amqtt.A2AErrorTransportProtocolError, "request lacks MQTT Correlation Data"))
		return false
	}
	if in.expiry != nil && time.Since(in.received) > time.Duration(*in.expiry)*time.Second {
		s.m.rejections.WithLabelValues(a2amqtt.A2AErrorRequestExpired).Inc()
		s.replyError(ctx, in, nil, a2amqtt.NewBindingError(a2amqtt.A2AErrorRequestExpired,
			fmt.Sprintf("request expired after waiting %s in the conversation service (message expiry %ds)",
				time.Since(in.received).Round(time.Millisecond), *in.expiry)))
		return false
	}
	return true
}

func (s *admission) decode(ctx context.Context, in *inbound, requireTaskID bool) *a2amqtt.InboundRequest {
	req, err := a2amqtt.DecodeRequest(in.payload, a2amqtt.DecodeLimits{MaxPayloadBytes: s.cfg.MaxPayloadBytes, RequireTaskID: requireTaskID})
	if err == nil {
		return req
	}
	var de *a2amqtt.DecodeError
	if errors.As(err, &de) {
		s.m.rejections.WithLabelValues(de.Err.Reason()).Inc()
		s.replyError(ctx, in, de.ID, de.Err)
		return nil
	}
	s.m.rejections.WithLabelValues("invalid_request").Inc()
	s.replyError(ctx, in, nil, rpcerr.NewA2A(a2a.ErrInvalidRequest, err.Error(), nil, s.cfg.Now()))
	return nil
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
	ctx, sp := s.span(traceFrom(ctx, in.user), "conversation.request", trace.SpanKindConsumer)
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
	t.g = s.gated.byRequestTopic(in.topic)
	if t.g != nil && !s.serves(t.g.key) && s.notHeld(in, t.g.key, func() { s.handleRequest(in) }) {
		// Held back until this replica has taken the agent over, or left
		// to the replica that serves it: nothing to answer here.
		return false
	}
	if !s.verifySender(in) {
		fail(t.sp, "publisher not verified")
		return false
	}
	if t.g == nil {
		// Unsubscribe raced with this message: the agent is no longer gated.
		s.replyError(ctx, in, nil, a2amqtt.NewBindingError(a2amqtt.A2AErrorResponderUnavailable,
			"agent is no longer served by the conversation service; retry"))
		return false
	}
	if !s.gated.callers.admits(ctx, t.g.agent, in.caller) {
		// The broker's ACLs are compiled from the same rule: this is a
		// publish the broker let through before its ACLs caught up (or a
		// cache behind them). Dropped, not answered.
		s.log.Info("dropping request of a caller the agent does not admit", "agent", t.g.key, "caller", in.caller.String())
		s.m.rejections.WithLabelValues(reasonCallerNotAdmitted).Inc()
		fail(t.sp, "caller not admitted")
		return false
	}
	if !s.withinRate(in) {
		fail(t.sp, "rate limited")
		return false
	}
	if !s.checkRequest(ctx, in) {
		fail(t.sp, "refused at admission")
		return false
	}
	return true
}

// decodeTurn decodes the JSON-RPC request, holds its header to its body, and gives a v0.3
// request without ids the ids the rules key on.
func (s *requests) decodeTurn(ctx context.Context, t *turn) bool {
	in, g := t.in, t.g
	req := s.decode(ctx, in, true)
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
		s.replyError(ctx, in, req.ID, a2amqtt.NewBindingError(a2amqtt.A2AErrorTransportProtocolError,
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
			s.replyError(ctx, in, req.ID, rpcerr.NewA2A(a2a.ErrInvalidParams, err.Error(), nil, s.cfg.Now()))
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
		case errors.Is(err, convstore.ErrNotOwner) && s.notHeld(in, g.key, func() { s.handleRequest(in) }):
			return false
		case err != nil:
			s.unavailable(ctx, in, req.ID, g.key)
			return false
		case dup:
			t.log().V(1).Info("request the previous owner answered dropped")
			return false
		}
	}
	s.m.requests.WithLabelValues(string(conversation.KindRead)).Inc()
	if t.method == conversation.MethodGetTask && req.TaskID != "" && s.agentCreatesIDs(g.key) {
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
	dctx, dsp := s.span(ctx, "conversation.decide", trace.SpanKindInternal)
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
	if err == nil && d.Kind == conversation.KindReject && s.owners != nil && s.owners.applyPending(dctx, g.key) {
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
		if s.owners == nil || !s.notHeld(in, g.key, func() { s.handleRequest(in) }) {
			s.unavailable(ctx, in, req.ID, g.key)
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
		s.expired(ctx, t.g.key, x)
	}
	if d.Kind == conversation.KindReject {
		fail(t.sp, d.Err.Reason())
		t.log().V(1).Info("request rejected", "code", d.Err.Code, "reason", d.Err.Reason())
		s.m.rejections.WithLabelValues(d.Err.Reason()).Inc()
		s.replyError(ctx, t.in, t.req.ID, d.Err)
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
	s.replyError(ctx, in, req.ID, a2amqtt.NewBindingError(a2amqtt.A2AErrorResponderUnavailable, msg))
}

// forward sends an admitted request on to the agent; when the agent does
// not take it, it undoes the run and answers the requester.
func (s *requests) forward(ctx context.Context, g *gatedAgent, in *inbound, req *a2amqtt.InboundRequest, payload []byte, user paho.UserProperties, rt route, tracked bool, log func() logr.Logger) {
	fctx, fsp := s.span(ctx, "conversation.forward", trace.SpanKindProducer)
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
		s.replyError(ctx, in, req.ID, a2amqtt.NewBindingError(a2amqtt.A2AErrorResponderUnavailable,
			fmt.Sprintf("agent %s is not reading its delivery topic", g.key)))
	}
	if err := s.forwardTo(fctx, g, in, payload, user, rt, failed); err != nil {
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
	case req.HasMessage && s.agentCreatesIDs(g.key):
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

// errNoSubscribers: the broker said nobody reads the delivery topic.
var errNoSubscribers = errors.New("no subscriber on the delivery topic")

// forwardTo publishes a request to the agent's delivery topic, with the
// route sealed into its correlation data and the service's reply topic as
// Response Topic. It returns an error when the request was not sent; when
// the broker's PUBACK says nobody reads the delivery topic (or the broker
// refused it, or the session dropped it), failed runs on a goroutine of its
// own: the worker does not wait for the PUBACK (the agent receives the
// request while it travels), so it is free for the next message. With a nil
// failed, forwardTo waits for the PUBACK and returns what it says.
func (s *forwarder) forwardTo(ctx context.Context, g *gatedAgent, in *inbound, payload []byte, user paho.UserProperties, rt route, failed func(error)) error {
	out := &paho.Publish{
		Topic: g.delivery, QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{
			ResponseTopic:   s.replyTopic,
			CorrelationData: s.seal.seal(rt),
			ContentType:     in.contentType,
			User:            withTrace(ctx, user),
		},
	}
	if in.expiry != nil {
		left := int64(*in.expiry) - int64(time.Since(in.received)/time.Second)
		left = max(left, 1)
		v := uint32(left)
		out.Properties.MessageExpiry = &v
	}
	outcome := func(resp *paho.PublishResponse, err error) error {
		if err == nil && resp != nil && resp.ReasonCode == reasonNoMatchingSubscribers {
			err = errNoSubscribers
		}
		return err
	}
	if failed == nil {
		return outcome(s.publish(ctx, out))
	}
	return s.conn.PublishNotify(ctx, out, func(resp *paho.PublishResponse, err error) {
		if err = outcome(resp, err); err != nil {
			// Off the connection's read goroutine: answering publishes.
			go failed(err)
		}
	})
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

// streaming reports whether replies to m form a stream (several replies,
// the last one marked by its state) rather than one unary result.
func streaming(m conversation.Method) bool {
	return m == conversation.MethodSendStreamingMessage || m == conversation.MethodSubscribeToTask
}

func (s *replies) handleReply(in *inbound) {
	ctx, cancel := context.WithTimeout(context.Background(), handleTimeout)
	defer cancel()
	ctx, sp := s.span(traceFrom(ctx, in.user), "conversation.relay", trace.SpanKindConsumer)
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
		s.awaitReplyAgent(ctx, rt.Agent)
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
	case rt.Method == conversation.MethodListTasks && rt.ContextID != "" && s.agentCreatesIDs(rt.Agent):
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
	pol := s.gated.policyOf(rt.Agent)
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
	if !s.agentCreatesIDs(rt.Agent) {
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
		s.owners.handOver(ctx, rt.Agent, ev)
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
		s.expired(ctx, rt.Agent, x)
	}
	return durable
}

// runningState reports whether a task in state st is in a run (forwarded,
// not yet paused or finished).
func runningState(st a2a.TaskState) bool {
	return st == a2a.TaskStateSubmitted || st == a2a.TaskStateWorking
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

// replyError answers the requester itself, echoing its correlation data;
// only a requester verifySender has verified, on its own reply topic.
func (s *outbox) replyError(ctx context.Context, in *inbound, id any, e *a2amqtt.RPCError) {
	if !in.verified {
		s.unverified(in)
		return
	}
	s.answer(ctx, in.respTo, in.corr, id, e)
}

// unverified drops an answer to a requester that was not verified.
func (s *outbox) unverified(in *inbound) {
	s.log.Error(errors.New("answer to an unverified requester"), "not answering", "topic", in.topic, "response_topic", in.respTo)
	s.m.rejections.WithLabelValues(reasonUnverifiedAnswer).Inc()
}

// answer publishes a JSON-RPC error to a requester's reply path.
func (s *outbox) answer(ctx context.Context, respTo string, corr []byte, id any, e *a2amqtt.RPCError) {
	if respTo == "" {
		return
	}
	b, err := encodeResponse(id, nil, e)
	if err != nil {
		s.log.Error(err, "encode error reply")
		return
	}
	s.sendTo(ctx, respTo, corr, b)
}

func (s *outbox) send(ctx context.Context, in *inbound, payload []byte) {
	if !in.verified {
		s.unverified(in)
		return
	}
	s.sendTo(ctx, in.respTo, in.corr, payload)
}

func (s *outbox) sendTo(ctx context.Context, respTo string, corr, payload []byte) {
	_, err := s.publish(ctx, &paho.Publish{
		Topic: respTo, QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{CorrelationData: corr, ContentType: "application/json"},
	})
	if err != nil {
		s.log.Error(err, "answer requester", "response_topic", respTo)
	}
}

// notifyFailed tells a requester on a stream that already ended that the
// engine failed its task: a final A2A v1.0 statusUpdate (TASK_STATE_FAILED
// with the engine's status message).
func (s *outbox) notifyFailed(ctx context.Context, st conversation.Stream, contextID, taskID, why string) {
	ev := a2a.NewStatusUpdateEvent(a2a.TaskInfo{TaskID: a2a.TaskID(taskID), ContextID: contextID}, a2a.TaskStateFailed,
		a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart(why)))
	result, err := json.Marshal(map[string]any{"statusUpdate": ev})
	if err != nil {
		s.log.Error(err, "encode failure notice")
		return
	}
	b, err := encodeResponse(nil, json.RawMessage(result), nil)
	if err != nil {
		s.log.Error(err, "encode failure notice")
		return
	}
	s.sendTo(ctx, st.ResponseTopic, st.Correlation, b)
}

// cancelAtAgent sends CancelTask for a task the engine gave up on, so the
// agent frees what it holds; the reply is observed, not relayed.
func (s *forwarder) cancelAtAgent(ctx context.Context, agent, contextID, taskID string) {
	g := s.gated.agent(agent)
	if g == nil {
		return
	}
	corr := make([]byte, 16)
	_, _ = rand.Read(corr)
	agentTaskID := taskID
	if _, t := s.mem.Task(agent, taskID); t != nil && t.AgentTaskID != "" {
		agentTaskID = t.AgentTaskID
	}
	payload, err := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": "conversation-service-cancel-" + taskID, "method": "CancelTask",
		"params": map[string]string{"id": agentTaskID},
	})
	if err != nil {
		s.log.Error(err, "encode CancelTask")
		return
	}
	rt := route{Agent: agent, TaskID: taskID, ContextID: contextID, Method: conversation.MethodCancelTask, Correlation: corr, Internal: true}
	_, err = s.publish(ctx, &paho.Publish{
		Topic: g.delivery, QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{ResponseTopic: s.replyTopic, CorrelationData: s.seal.seal(rt), ContentType: "application/json"},
	})
	if err != nil {
		s.log.Info("cannot cancel expired task at the agent", "agent", agent, "task", taskID, "err", err.Error())
	}
}
