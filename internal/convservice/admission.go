package convservice

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
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
	mu      sync.Mutex // a tenancy.View is not safe for concurrent use
	view    *tenancy.View
	decided sync.Map // callerPair -> bool
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
	g.mu.Lock()
	defer g.mu.Unlock()
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
