package tenancy

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Who may call whom is decided here, once, for everything that needs it: the ACL compiler
// (internal/registration compiles the broker's grants from it) and the conversation service
// (internal/convservice admits a gated agent's callers by it). The two can therefore never
// disagree; TestACLMatrix* in test/registration checks, pair by pair, that the broker's
// decisions and the service's agree.

// ScopeAdmits reports whether callers.scope admits caller by identity alone: every agent of the
// callee's unit (SameUnit) or org (SameOrg). The broker grants it through the unit's and the
// org's shared roles, which every live agent of the unit and org holds.
func ScopeAdmits(scope a2av1.CallerScope, callee, caller a2amqtt.AgentRef) bool {
	switch scope {
	case a2av1.CallerScopeSameUnit:
		return caller.Org == callee.Org && caller.Unit == callee.Unit
	case a2av1.CallerScopeSameOrg:
		return caller.Org == callee.Org
	}
	return false
}

// Selects reports whether one of callee's callers.from rules admits agent: its agent selector
// matches, its namespace rule covers the agent's namespace, and the agent's namespace consents
// (an AgentGrant of kind Callers) when it is another one. A rule never selects the callee itself.
func (v *View) Selects(ctx context.Context, callee, agent *a2av1.Agent) (bool, error) {
	if callee.UID == agent.UID {
		return false, nil
	}
	for _, from := range callee.Spec.Callers.From {
		sel, err := metav1.LabelSelectorAsSelector(&from.AgentSelector)
		if err != nil || !sel.Matches(labels.Set(agent.Labels)) {
			continue
		}
		if from.NamespaceSelector == nil {
			if callee.Namespace != agent.Namespace {
				continue
			}
		} else {
			ns, err := v.Namespace(ctx, agent.Namespace)
			if err != nil {
				return false, err
			}
			nsSel, err := metav1.LabelSelectorAsSelector(from.NamespaceSelector)
			if err != nil || !nsSel.Matches(labels.Set(ns.Labels)) {
				continue
			}
		}
		granted, err := v.CallerGranted(ctx, callee.Namespace, agent)
		if err != nil {
			return false, err
		}
		if granted {
			return true, nil
		}
	}
	return false, nil
}

// AdmitsCaller reports whether caller may call callee: both are live identities (permitted, the
// holders of their client IDs, not being deleted), and callee's scope covers caller's identity
// or one of its callers.from rules selects caller with its namespace's consent. This is exactly
// what the broker ACLs grant: publishing to callee's request topic and, for an ungated callee,
// replying into caller's reply topics.
func (v *View) AdmitsCaller(ctx context.Context, callee, caller *a2av1.Agent) (bool, error) {
	for _, a := range []*a2av1.Agent{callee, caller} {
		live, err := v.Live(ctx, a)
		if err != nil || !live {
			return false, err
		}
	}
	if ScopeAdmits(callee.Spec.Callers.Scope, identity.Of(callee), identity.Of(caller)) {
		return true, nil
	}
	return v.Selects(ctx, callee, caller)
}

// IndexFields registers the Agent indexes a View reads through (identity.IndexAgentClientID,
// identity.IndexAgentPool) on a cache: the operator's manager and the conversation service's
// cache use the same ones.
func IndexFields(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &a2av1.Agent{}, identity.IndexAgentClientID, func(o client.Object) []string {
		return []string{identity.Of(o.(*a2av1.Agent)).ClientID()}
	}); err != nil {
		return fmt.Errorf("index agents by client ID: %w", err)
	}
	if err := idx.IndexField(ctx, &a2av1.Agent{}, identity.IndexAgentPool, func(o client.Object) []string {
		if a := o.(*a2av1.Agent); a.Spec.PoolID != "" {
			return []string{PoolKey(a)}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index agents by pool: %w", err)
	}
	return nil
}
