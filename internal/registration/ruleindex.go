package registration

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// The caller-rule index (identity.IndexAgentCallerRule) finds the Agents whose callers.from rules
// may admit a given Agent without scanning every rule: each rule is indexed under one label pair
// its agent selector requires (a selector matches only Agents carrying all of its matchLabels, so
// any one of them is a necessary condition), scoped to the rule owner's namespace unless the rule
// has a namespace selector. Rules that require no label (matchExpressions only, or an empty
// selector) go to a wildcard bucket that every lookup reads. The index only narrows the
// candidates: Selects still decides each of them exactly.

const (
	ruleAnyNamespace = "*"
	ruleAnyLabel     = "*"
)

func ruleKey(scope, pair string) string { return scope + "|" + pair }

// RuleIndexValues are the caller-rule index values of agent (none without callers.from rules).
func RuleIndexValues(agent *a2av1.Agent) []string {
	var out []string
	for _, from := range agent.Spec.Callers.From {
		scope := agent.Namespace
		if from.NamespaceSelector != nil {
			scope = ruleAnyNamespace
		}
		pair := ruleAnyLabel
		if keys := from.AgentSelector.MatchLabels; len(keys) > 0 {
			// The smallest key, so that the value does not depend on map order.
			k := slices.Min(slices.Collect(maps.Keys(keys)))
			pair = k + "=" + keys[k]
		}
		if v := ruleKey(scope, pair); !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// ruleLookupKeys are the index values under which a rule that may admit agent is filed.
func ruleLookupKeys(agent *a2av1.Agent) []string {
	out := make([]string, 0, 2*len(agent.Labels)+2)
	for _, scope := range []string{agent.Namespace, ruleAnyNamespace} {
		out = append(out, ruleKey(scope, ruleAnyLabel))
		for k, v := range agent.Labels {
			out = append(out, ruleKey(scope, k+"="+v))
		}
	}
	return out
}

// RulesMaySelect returns the Agents with callers.from rules that may admit agent by its labels
// (each at most once, never agent itself), read from the cache through the caller-rule index.
// The objects are the cache's own: read them, never change them.
func RulesMaySelect(ctx context.Context, reader client.Reader, agent *a2av1.Agent) ([]*a2av1.Agent, error) {
	var out []*a2av1.Agent
	seen := map[types.UID]bool{agent.UID: true}
	for _, key := range ruleLookupKeys(agent) {
		var owners a2av1.AgentList
		if err := reader.List(ctx, &owners, client.MatchingFields{identity.IndexAgentCallerRule: key}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list caller rules under %s: %w", key, err)
		}
		for i := range owners.Items {
			if o := &owners.Items[i]; !seen[o.UID] {
				seen[o.UID] = true
				out = append(out, o)
			}
		}
	}
	return out, nil
}
