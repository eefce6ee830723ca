// Package controllers holds the reconcilers for Agents and ConversationPolicies.
package controllers

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// Field indexes on the manager's cache; they keep the cross-object look-ups of the mapping
// functions proportional to the objects involved rather than to the fleet.
const (
	// IndexAgentClientID indexes Agents by their resolved MQTT Client ID {org}/{unit}/{agent}.
	IndexAgentClientID = "a2a.fleet.dev/client-id"
	// IndexAgentPolicy indexes Agents by status.conversationPolicy.
	IndexAgentPolicy = "a2a.fleet.dev/conversation-policy"
	// IndexAgentHasCallerSelectors marks Agents with callers.from selectors ("true"), the only
	// ones whose rules can admit another Agent individually.
	IndexAgentHasCallerSelectors = "a2a.fleet.dev/has-caller-selectors"
)

// FieldIndexer is the part of a manager that registers cache indexes.
type FieldIndexer interface {
	GetFieldIndexer() client.FieldIndexer
}

// SetupIndexes registers the field indexes the reconcilers rely on.
func SetupIndexes(ctx context.Context, mgr FieldIndexer) error {
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &a2av1.Agent{}, IndexAgentClientID, func(o client.Object) []string {
		return []string{AgentIdentity(o.(*a2av1.Agent)).ClientID()}
	}); err != nil {
		return fmt.Errorf("index agents by client ID: %w", err)
	}
	if err := idx.IndexField(ctx, &a2av1.Agent{}, IndexAgentPolicy, func(o client.Object) []string {
		if p := o.(*a2av1.Agent).Status.ConversationPolicy; p != "" {
			return []string{p}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index agents by conversation policy: %w", err)
	}
	if err := idx.IndexField(ctx, &a2av1.Agent{}, IndexAgentHasCallerSelectors, func(o client.Object) []string {
		if len(o.(*a2av1.Agent).Spec.Callers.From) > 0 {
			return []string{"true"}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index agents with caller selectors: %w", err)
	}
	return nil
}
