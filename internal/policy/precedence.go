// Package policy decides which ConversationPolicy governs an Agent when several select it.
//
// The rule: the highest spec.priority wins; among equals the oldest policy (creationTimestamp)
// wins, so adding a policy never silently takes Agents away from an established one; among equally
// old policies the alphabetically first name wins, so the outcome is total and deterministic.
package policy

import (
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// Selects reports whether the policy's agentSelector matches the given Agent labels.
func Selects(p *a2av1.ConversationPolicy, agentLabels map[string]string) (bool, error) {
	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.AgentSelector)
	if err != nil {
		return false, fmt.Errorf("policy %s: invalid agentSelector: %w", p.Name, err)
	}
	return sel.Matches(labels.Set(agentLabels)), nil
}

// Less orders policies by precedence: a sorts before b when a takes precedence.
func Less(a, b *a2av1.ConversationPolicy) bool {
	if a.Spec.Priority != b.Spec.Priority {
		return a.Spec.Priority > b.Spec.Priority
	}
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// Matching returns the policies (of one namespace) that select an Agent with the given labels,
// ordered by precedence: the first one applies. Policies being deleted and policies whose selector
// is invalid select nothing.
func Matching(policies []a2av1.ConversationPolicy, agentLabels map[string]string) []*a2av1.ConversationPolicy {
	var out []*a2av1.ConversationPolicy
	for i := range policies {
		p := &policies[i]
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		if ok, err := Selects(p, agentLabels); err == nil && ok {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return Less(out[i], out[j]) })
	return out
}

// Names returns the names of the given policies, in order.
func Names(ps []*a2av1.ConversationPolicy) []string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return names
}
