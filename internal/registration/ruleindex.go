package registration

import (
	"context"
	"slices"

	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// The caller-rule index (identity.IndexAgentCallerRule) files each Agent under its rules'
// tenancy.RuleIndexKey, so that a reader without a caller graph finds the rules that may admit a
// given Agent without scanning every rule. The index only narrows the candidates:
// tenancy.View.Selects still decides each of them exactly.

// RuleIndexValues are the caller-rule index values of agent (none without callers.from rules).
func RuleIndexValues(agent *a2av1.Agent) []string {
	var out []string
	for i := range agent.Spec.Callers.From {
		if v := tenancy.RuleIndexKey(agent.Namespace, &agent.Spec.Callers.From[i]); !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// RulesMaySelect returns the Agents with callers.from rules that may admit agent by its labels
// (each at most once, never agent itself), read from the cache through the caller-rule index.
// The objects are the cache's own: read them, never change them.
func RulesMaySelect(ctx context.Context, reader client.Reader, agent *a2av1.Agent) ([]*a2av1.Agent, error) {
	return tenancy.RuleOwners(ctx, reader, agent)
}
