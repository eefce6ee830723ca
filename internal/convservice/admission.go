package convservice

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Why a request's reply path is refused (rejections_total reasons). A refused
// reply path is never answered: answering would publish to the very topic the
// requester may not name.
const (
	reasonReplyTopicNotPermitted = "reply_topic_not_permitted"
	reasonSenderMissing          = "sender_unknown"
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

// senderIdentity reads the publisher's identity that a broker which knows it
// (the embedded broker) stamps on every message as identity.SenderProperty:
// the publisher's broker username, a2a:{org}/{unit}/{agent} for agents.
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

// callerSet is who an agent admits as caller, by the rules the operator
// compiles into broker ACLs (docs/api.md): spec.callers.scope, plus the
// Agents that callers.from selects. Selectors are evaluated against the
// service's Agent cache in the agent's namespace; a selector with a
// namespaceSelector admits any registered Agent (the service does not watch
// Namespaces; the broker ACLs remain the authority for who may publish).
type callerSet struct {
	self      a2amqtt.AgentRef
	scope     a2av1.CallerScope
	namespace string
	anyAgent  bool
	selectors []labels.Selector // callers.from agent selectors (same namespace)
	agents    agentDirectory
}

// agentDirectory is what the Agent cache says of every registered Agent
// (one with a client id), by client id. One is built per resync and shared
// by every gated agent's callerSet, so a resync stays linear in the fleet
// (a set of admitted callers per gated agent would be quadratic in time and
// memory) and admitting a caller costs one lookup.
type agentDirectory map[string]agentFacts

type agentFacts struct {
	namespace string
	labels    labels.Set
}

func newAgentDirectory(all []a2av1.Agent) agentDirectory {
	d := make(agentDirectory, len(all))
	for i := range all {
		if id := all[i].Status.ClientID; id != "" {
			d[id] = agentFacts{namespace: all[i].Namespace, labels: all[i].Labels}
		}
	}
	return d
}

func newCallerSet(a *a2av1.Agent, self a2amqtt.AgentRef, agents agentDirectory) *callerSet {
	cs := &callerSet{self: self, scope: a.Spec.Callers.Scope, namespace: a.Namespace, agents: agents}
	for _, from := range a.Spec.Callers.From {
		if from.NamespaceSelector != nil {
			cs.anyAgent = true
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&from.AgentSelector)
		if err != nil {
			continue // the operator reports the invalid selector
		}
		cs.selectors = append(cs.selectors, sel)
	}
	return cs
}

// admits reports whether ref may call the agent.
func (cs *callerSet) admits(ref a2amqtt.AgentRef) bool {
	if cs == nil {
		return false
	}
	switch cs.scope {
	case a2av1.CallerScopeSameUnit:
		if ref.Org == cs.self.Org && ref.Unit == cs.self.Unit {
			return true
		}
	case a2av1.CallerScopeSameOrg:
		if ref.Org == cs.self.Org {
			return true
		}
	}
	if !cs.anyAgent && len(cs.selectors) == 0 {
		return false
	}
	facts, registered := cs.agents[ref.ClientID()]
	switch {
	case !registered:
		return false
	case cs.anyAgent:
		return true
	case facts.namespace != cs.namespace:
		return false
	}
	for _, sel := range cs.selectors {
		if sel.Matches(facts.labels) {
			return true
		}
	}
	return false
}
