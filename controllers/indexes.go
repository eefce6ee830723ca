// Package controllers holds the reconcilers for Agents and ConversationPolicies.
package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// indexAgentOverLimit marks Agents refused for their Tenant's limits.maxAgents.
const indexAgentOverLimit = "a2a.fleet.dev/over-agent-limit"

// FieldIndexer is the part of a manager that registers cache indexes.
type FieldIndexer interface {
	GetFieldIndexer() client.FieldIndexer
}

// SetupIndexes registers the field indexes the reconcilers rely on.
func SetupIndexes(ctx context.Context, mgr FieldIndexer) error {
	idx := mgr.GetFieldIndexer()
	// The tenancy view's own indexes: the conversation service's cache registers the same.
	if err := tenancy.IndexFields(ctx, idx); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &a2av1.Agent{}, identity.IndexAgentPolicy, func(o client.Object) []string {
		if p := o.(*a2av1.Agent).Status.ConversationPolicy; p != "" {
			return []string{p}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index agents by conversation policy: %w", err)
	}
	if err := idx.IndexField(ctx, &a2av1.Agent{}, identity.IndexAgentCallerRule, func(o client.Object) []string {
		return registration.RuleIndexValues(o.(*a2av1.Agent))
	}); err != nil {
		return fmt.Errorf("index agents by caller rule: %w", err)
	}
	for _, ix := range []struct {
		name string
		fn   func(*a2av1.Agent) []string
	}{
		{identity.IndexAgentUnit, func(a *a2av1.Agent) []string { return []string{a.Spec.OrgID + "/" + a.Spec.UnitID} }},
		{identity.IndexAgentOrg, func(a *a2av1.Agent) []string { return []string{a.Spec.OrgID} }},
		{indexAgentOverLimit, func(a *a2av1.Agent) []string {
			if c := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionIdentityPermitted); c != nil && c.Reason == a2av1.ReasonAgentLimitExceeded {
				return []string{"true"}
			}
			return nil
		}},
		{indexAgentGated, func(a *a2av1.Agent) []string {
			if gated(a) {
				return []string{"true"}
			}
			return nil
		}},
	} {
		if err := idx.IndexField(ctx, &a2av1.Agent{}, ix.name, func(o client.Object) []string { return ix.fn(o.(*a2av1.Agent)) }); err != nil {
			return fmt.Errorf("index agents by %s: %w", ix.name, err)
		}
	}
	return nil
}
