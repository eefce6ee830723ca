package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/policy"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// agentIdentity resolves what an Agent's spec claims: its client ID, topics and governing
// ConversationPolicy (status), and whether its namespace may claim the identity at all
// (IdentityPermitted). It only reads.
type agentIdentity struct {
	reader client.Reader
	gating bool
}

// refusal is why an Agent may not be on the bus: the reason and message of its conditions.
type refusal struct{ reason, message string }

// view starts a tenancy view for one reconcile (with the caller graph the reader carries).
func (u *agentIdentity) view(ctx context.Context) (*tenancy.View, error) {
	return (&tenancy.Authorizer{Reader: u.reader}).View(ctx)
}

// observe resolves what the Agent's identity implies: client ID, topics, governing policy.
func (u *agentIdentity) observe(ctx context.Context, agent *a2av1.Agent) error {
	id := identity.Of(agent)
	agent.Status.AgentID = id.Agent
	agent.Status.ClientID = id.ClientID()
	agent.Status.Topics = &a2av1.AgentTopics{
		Request:     id.RequestTopic(),
		ReplyPrefix: id.Topic(a2amqtt.MethodReply),
		Discovery:   id.DiscoveryTopic(),
		Event:       id.EventTopic(),
	}
	if agent.Spec.PoolID != "" {
		agent.Status.Topics.Pool = a2amqtt.PoolRef{Org: id.Org, Unit: id.Unit, Pool: agent.Spec.PoolID}.RequestTopic()
	}
	if err := u.resolvePolicy(ctx, agent); err != nil {
		return err
	}
	if u.gating && agent.Status.ConversationPolicy != "" {
		agent.Status.Topics.Delivery = identity.DeliveryTopic(id)
	}
	return nil
}

// resolvePolicy records in status the ConversationPolicy that governs the Agent and the ones it
// outranks.
func (u *agentIdentity) resolvePolicy(ctx context.Context, agent *a2av1.Agent) error {
	var policies a2av1.ConversationPolicyList
	// Read-only use of the cache's objects: no deep copies.
	if err := u.reader.List(ctx, &policies, client.InNamespace(agent.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list conversation policies: %w", err)
	}
	names := policy.Names(policy.Matching(policies.Items, agent.Labels))
	agent.Status.ConversationPolicy, agent.Status.OverlappingPolicies = "", nil
	if len(names) > 0 {
		agent.Status.ConversationPolicy = names[0]
	}
	if len(names) > 1 {
		agent.Status.OverlappingPolicies = names[1:min(len(names), maxOverlappingPolicies+1)]
	}
	return nil
}

// permit decides whether the Agent's namespace may claim its identity, within its Tenant's
// limits, records it in IdentityPermitted and status.tenant, and returns why not (nil: permitted).
func (u *agentIdentity) permit(ctx context.Context, view *tenancy.View, agent *a2av1.Agent) (*refusal, error) {
	decision, err := view.Permit(ctx, agent)
	if err != nil {
		return nil, err
	}
	agent.Status.Tenant = decision.Tenant
	var why *refusal
	switch {
	case decision.LimitExceeded:
		// The oldest Agents of the Tenant keep their place.
		why = &refusal{a2av1.ReasonAgentLimitExceeded, decision.Message}
	case !decision.Permitted:
		why = &refusal{a2av1.ReasonIdentityNotPermitted, decision.Message}
	}
	if why != nil {
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionIdentityPermitted, metav1.ConditionFalse, why.reason, why.message)
		return why, nil
	}
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionIdentityPermitted, metav1.ConditionTrue, a2av1.ReasonIdentityPermitted, decision.Message)
	return nil, nil
}

// ownsBrokerState reports whether the broker objects named after agent's identity are agent's to
// remove: it holds the identity, or nobody may hold it now and agent is the one that registered
// it (its status says so). The loser of an identity conflict never owns them.
func ownsBrokerState(ctx context.Context, view *tenancy.View, agent, recorded *a2av1.Agent) (bool, error) {
	holder, err := view.Holder(ctx, agent)
	if err != nil {
		return false, err
	}
	if holder != nil {
		return holder.UID == agent.UID, nil
	}
	return meta.IsStatusConditionTrue(recorded.Status.Conditions, a2av1.ConditionRegistered) || recorded.Status.PublishedCardDigest != "", nil
}
