package convservice

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// Why a request is dropped without an answer (rejections_total reasons). The
// service answers only a publisher it has verified, on that publisher's own
// reply topic: answering anyone else would let a requester make the service
// publish where the requester may not (docs/security.md, attack 10).
const (
	// reasonSenderMissing: the broker did not say who published (no
	// identity.SenderProperty: a Mosquitto without the sender-stamp plugin).
	reasonSenderMissing = "sender_unknown"
	// reasonReplyTopicNotPermitted: the Response Topic is not a reply topic
	// of the publisher, or the publisher is not an agent.
	reasonReplyTopicNotPermitted = "reply_topic_not_permitted"
	// reasonCallerNotAdmitted: the publisher is not a caller the gated agent
	// admits (the rule the broker ACLs are compiled from).
	reasonCallerNotAdmitted = "caller_not_admitted"
	// reasonUnverifiedAnswer: an answer to a requester the service has not
	// verified was about to be published, and was not (a bug guard).
	reasonUnverifiedAnswer = "unverified_answer_dropped"
)

// replyIdentity is the agent whose reply topic respTo is
// ($a2a/v1/reply/{org}/{unit}/{agent}/...), ok false for any other topic.
func replyIdentity(respTo string) (a2amqtt.AgentRef, bool) {
	info, err := a2amqtt.ParseTopic(respTo)
	if err != nil || info.Method != a2amqtt.MethodReply || info.Agent == "" {
		return a2amqtt.AgentRef{}, false
	}
	return a2amqtt.AgentRef{Org: info.Org, Unit: info.Unit, Agent: info.Agent}, true
}

// senderIdentity reads the publisher's identity that the broker stamps on
// every message as identity.SenderProperty (the embedded broker's hook, the
// sender-stamp plugin on Mosquitto), replacing any copy the client sent: the
// publisher's broker username, a2a:{org}/{unit}/{agent} for agents.
func senderIdentity(in *inbound) (ref a2amqtt.AgentRef, present, ok bool) {
	v := in.user.Get(identity.SenderProperty)
	if v == "" {
		return a2amqtt.AgentRef{}, false, false
	}
	id, found := strings.CutPrefix(v, identity.BrokerPrefix)
	if !found {
		return a2amqtt.AgentRef{}, true, false
	}
	ref, err := a2amqtt.ParseAgentRef(id)
	return ref, true, err == nil
}

// callerDirectory decides whether a gated agent admits a caller, by
// tenancy.View.AdmitsCaller: the one rule the operator compiles the broker
// ACLs from (scope, callers.from with AgentGrant consent, tenancy), applied
// to the Agent that holds the caller's identity (never to an Agent that
// merely claims it: a refused squatter's status or labels count for
// nothing). One generation per resync: its view and decisions are dropped
// when the Kubernetes objects change, so a decision is made once per pair
// and generation, not per request.
type callerDirectory struct {
	reader  client.Reader
	current atomic.Pointer[directoryGeneration]
}

type directoryGeneration struct {
	view    *tenancy.View // safe for concurrent use: requests decide in parallel
	decided sync.Map      // callerPair -> bool
}

type callerPair struct{ callee, caller a2amqtt.AgentRef }

func newCallerDirectory(reader client.Reader) *callerDirectory {
	return &callerDirectory{reader: reader}
}

// renew starts a generation on view (the resync's own).
func (d *callerDirectory) renew(view *tenancy.View) {
	d.current.Store(&directoryGeneration{view: view})
}

// admits reports whether callee (a live gated Agent of this generation)
// admits caller. An error reading the cache admits nobody.
func (d *callerDirectory) admits(ctx context.Context, callee *a2av1.Agent, caller a2amqtt.AgentRef) bool {
	g := d.current.Load()
	if g == nil || callee == nil {
		return false
	}
	key := callerPair{identity.Of(callee), caller}
	if v, ok := g.decided.Load(key); ok {
		return v.(bool)
	}
	ok, err := admitsCaller(ctx, g.view, callee, caller)
	if err != nil {
		return false // not remembered: the next request asks again
	}
	g.decided.Store(key, ok)
	return ok
}

// admitsCaller is the service's admission decision: the Agent that holds
// caller's client ID, admitted by callee under tenancy's rule.
func admitsCaller(ctx context.Context, v *tenancy.View, callee *a2av1.Agent, caller a2amqtt.AgentRef) (bool, error) {
	holder, err := v.HolderOf(ctx, caller)
	if err != nil || holder == nil {
		return false, err
	}
	return v.AdmitsCaller(ctx, callee, holder)
}

// AdmitsCaller reports whether the conversation service, reading the
// Kubernetes objects through reader (a cache with tenancy.IndexFields), would
// relay requests of caller to the gated agent callee: the decision a replica
// makes, exported so that a test can hold it against the broker's ACLs pair
// by pair (test/registration's ACL matrix).
func AdmitsCaller(ctx context.Context, reader client.Reader, callee, caller a2amqtt.AgentRef) (bool, error) {
	v, err := (&tenancy.Authorizer{Reader: reader}).View(ctx)
	if err != nil {
		return false, err
	}
	holder, err := v.HolderOf(ctx, callee)
	if err != nil || holder == nil {
		return false, err
	}
	return admitsCaller(ctx, v, holder, caller)
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
		s.out.replyError(ctx, in, nil, a2amqtt.NewBindingError(a2amqtt.A2AErrorTransportProtocolError, "request lacks MQTT Correlation Data"))
		return false
	}
	if in.expiry != nil && time.Since(in.received) > time.Duration(*in.expiry)*time.Second {
		s.m.rejections.WithLabelValues(a2amqtt.A2AErrorRequestExpired).Inc()
		s.out.replyError(ctx, in, nil, a2amqtt.NewBindingError(a2amqtt.A2AErrorRequestExpired,
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
		s.out.replyError(ctx, in, de.ID, de.Err)
		return nil
	}
	s.m.rejections.WithLabelValues("invalid_request").Inc()
	s.out.replyError(ctx, in, nil, rpcerr.NewA2A(a2a.ErrInvalidRequest, err.Error(), nil, s.cfg.Now()))
	return nil
}
