package controllers

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// agentStatus derives the conditions that summarize the others (Ready from IdentityPermitted,
// Registered, ACLsSynced and WorkloadAvailable; Connected from the broker's presence) and records
// an Event for each transition a human would want to see.
type agentStatus struct {
	presence         PresenceReader
	poolsUnsupported string
	recorder         events.EventRecorder
}

// derive sets Ready and Connected.
func (u *agentStatus) derive(agent, holder *a2av1.Agent) {
	u.setReady(agent)
	u.setConnected(agent, holder)
}

// setReady derives Ready from the other conditions: the first that is not True explains why.
func (u *agentStatus) setReady(agent *a2av1.Agent) {
	for _, t := range []string{a2av1.ConditionIdentityPermitted, a2av1.ConditionRegistered, a2av1.ConditionACLsSynced, a2av1.ConditionWorkloadAvailable} {
		c := meta.FindStatusCondition(agent.Status.Conditions, t)
		if c == nil {
			continue // WorkloadAvailable exists only with a workload
		}
		if c.Status != metav1.ConditionTrue {
			setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionReady, metav1.ConditionFalse, c.Reason, c.Message)
			return
		}
	}
	if agent.Spec.PoolID != "" && u.poolsUnsupported != "" {
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonPoolUnsupportedByBroker,
			fmt.Sprintf("the agent is registered and may connect as %s, but its pool %s cannot be served on this broker: %s; remove spec.poolID or use a broker that delivers shared subscriptions on $-topics",
				agent.Status.ClientID, agent.Spec.PoolID, u.poolsUnsupported))
		return
	}
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled,
		"the agent is registered and may connect as "+agent.Status.ClientID)
}

// wasNotReady reports whether a Ready condition said the Agent was not Ready for a reason worth an
// Event (not merely waiting for its shared ACLs on the way to Ready).
func wasNotReady(c *metav1.Condition) bool {
	return c != nil && c.Status != metav1.ConditionTrue && c.Reason != a2av1.ReasonSharedACLsPending
}

// emitTransitions records an Event for each change a human would want to see in kubectl describe.
func (u *agentStatus) emitTransitions(before, after *a2av1.Agent, holder *a2av1.Agent) {
	if b, a := before.Status.ConversationPolicy, after.Status.ConversationPolicy; b != a {
		if a == "" {
			u.recorder.Eventf(after, nil, corev1.EventTypeNormal, EventPolicyRemoved, "ResolvePolicy",
				"no ConversationPolicy selects this Agent any more (was %s)", b)
		} else {
			u.recorder.Eventf(after, nil, corev1.EventTypeNormal, EventPolicyApplied, "ResolvePolicy",
				"ConversationPolicy %s applies", a)
		}
	}
	if o := after.Status.OverlappingPolicies; len(o) > 0 && !slices.Equal(o, before.Status.OverlappingPolicies) {
		u.recorder.Eventf(after, nil, corev1.EventTypeWarning, a2av1.ReasonOverlappingPolicies, "ResolvePolicy",
			"ConversationPolicy %s applies; %v select this Agent too but lose on precedence (highest priority, then oldest, then name)",
			after.Status.ConversationPolicy, o)
	}
	wasReady := meta.FindStatusCondition(before.Status.Conditions, a2av1.ConditionReady)
	nowReady := meta.FindStatusCondition(after.Status.Conditions, a2av1.ConditionReady)
	if nowReady == nil || (wasReady != nil && wasReady.Status == nowReady.Status && wasReady.Reason == nowReady.Reason) {
		return
	}
	switch {
	case nowReady.Status == metav1.ConditionTrue && !wasNotReady(wasReady):
		// A new Agent becoming Ready is what applying it means, and status says so: an Event per
		// Agent of a fleet rollout would only load the API server. Recovering is news.
	case nowReady.Status == metav1.ConditionTrue:
		u.recorder.Eventf(after, nil, corev1.EventTypeNormal, EventReady, "Reconcile", "%s", nowReady.Message)
	case nowReady.Reason == a2av1.ReasonIdentityNotPermitted, nowReady.Reason == a2av1.ReasonAgentLimitExceeded:
		u.recorder.Eventf(after, nil, corev1.EventTypeWarning, EventIdentityNotAllowed, "Reconcile", "%s", nowReady.Message)
	case nowReady.Reason == a2av1.ReasonIdentityConflict && holder != nil:
		u.recorder.Eventf(after, nil, corev1.EventTypeWarning, EventIdentityConflict, "Reconcile",
			"client ID %s already belongs to Agent %s/%s", identity.Of(after).ClientID(), holder.Namespace, holder.Name)
	case nowReady.Reason == a2av1.ReasonSharedACLsPending:
		// A step on the way to Ready, not news.
	case nowReady.Reason == a2av1.ReasonPoolUnsupportedByBroker:
		u.recorder.Eventf(after, nil, corev1.EventTypeWarning, a2av1.ReasonPoolUnsupportedByBroker, "Reconcile", "%s", nowReady.Message)
	default:
		u.recorder.Eventf(after, nil, corev1.EventTypeNormal, EventNotReady, "Reconcile", "%s: %s", nowReady.Reason, nowReady.Message)
	}
}
