package tenancy

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// CallerRule is one callers.from rule of an Agent, compiled once: its agent selector and its
// namespace rule (the rule owner's namespace, or the namespaces a namespace selector matches).
// It is the one implementation of "a rule covers an Agent": the predicate (View.Selects), the
// enumeration (CallerGraph.Candidates, View.SelectedCallers) and the event mapping all use it.
// Consent (an AgentGrant of kind Callers) is checked on top of it, by CallerGranted.
type CallerRule struct {
	// OwnerNamespace is the namespace of the Agent whose rule it is.
	OwnerNamespace string
	// Agents is the parsed agent selector (nil: invalid, the rule covers nobody).
	Agents labels.Selector
	// AnyNamespace: the rule has a namespace selector; Namespaces is it parsed (nil: invalid).
	AnyNamespace bool
	Namespaces   labels.Selector
	// IndexKey files the rule in a CallerGraph (and the cache's caller-rule index): one label pair
	// its selector requires, or "*" when it requires none, scoped by namespace.
	IndexKey string
}

// CompileCallerRules compiles owner's callers.from rules. err is the first rule that cannot be
// evaluated; that rule is still returned and covers nobody.
func CompileCallerRules(owner *a2av1.Agent) (rules []CallerRule, err error) {
	for i := range owner.Spec.Callers.From {
		from := &owner.Spec.Callers.From[i]
		r := CallerRule{OwnerNamespace: owner.Namespace, AnyNamespace: from.NamespaceSelector != nil, IndexKey: RuleIndexKey(owner.Namespace, from)}
		sel, serr := metav1.LabelSelectorAsSelector(&from.AgentSelector)
		if serr != nil && err == nil {
			err = fmt.Errorf("callers.from[%d].agentSelector: %w", i, serr)
		} else if serr == nil {
			r.Agents = sel
		}
		if r.AnyNamespace {
			nsSel, nerr := metav1.LabelSelectorAsSelector(from.NamespaceSelector)
			if nerr != nil && err == nil {
				err = fmt.Errorf("callers.from[%d].namespaceSelector: %w", i, nerr)
			} else if nerr == nil {
				r.Namespaces = nsSel
			}
		}
		rules = append(rules, r)
	}
	return rules, err
}

// MatchesLabels reports whether the rule may cover agent by its labels and namespace alone: its
// agent selector matches and, without a namespace selector, agent is in the owner's namespace.
// A namespace selector counts as a possible match (it needs the Namespace: Covers decides).
func (r *CallerRule) MatchesLabels(agent *a2av1.Agent) bool {
	if r.Agents == nil || !r.Agents.Matches(labels.Set(agent.Labels)) {
		return false
	}
	return r.AnyNamespace || agent.Namespace == r.OwnerNamespace
}

// Covers reports whether the rule covers agent, whose namespace's labels nsLabels returns (it is
// only called for a rule with a namespace selector).
func (r *CallerRule) Covers(agent *a2av1.Agent, nsLabels func() (labels.Set, error)) (bool, error) {
	if !r.MatchesLabels(agent) {
		return false, nil
	}
	if !r.AnyNamespace {
		return true, nil
	}
	if r.Namespaces == nil {
		return false, nil
	}
	set, err := nsLabels()
	if err != nil {
		return false, err
	}
	return r.Namespaces.Matches(set), nil
}

// The caller-rule index keys: a rule is filed under one label pair its agent selector requires (a
// selector matches only Agents carrying all of its matchLabels, so any one of them is a necessary
// condition), scoped to the owner's namespace unless the rule has a namespace selector. Rules that
// require no label (matchExpressions only, or an empty selector) are filed under the wildcard,
// which every lookup reads.
const (
	ruleAnyNamespace = "*"
	ruleAnyLabel     = "*"
)

func ruleKey(scope, pair string) string { return scope + "|" + pair }

// RuleIndexKey is the index key of a rule of an Agent of namespace ownerNS.
func RuleIndexKey(ownerNS string, from *a2av1.CallerSelector) string {
	scope := ownerNS
	if from.NamespaceSelector != nil {
		scope = ruleAnyNamespace
	}
	pair := ruleAnyLabel
	if keys := from.AgentSelector.MatchLabels; len(keys) > 0 {
		// The smallest key, so that the key does not depend on map order.
		k := ""
		for key := range keys {
			if k == "" || key < k {
				k = key
			}
		}
		pair = k + "=" + keys[k]
	}
	return ruleKey(scope, pair)
}

// RuleLookupKeys are the index keys under which a rule that may cover agent is filed.
func RuleLookupKeys(agent *a2av1.Agent) []string {
	out := make([]string, 0, 2*len(agent.Labels)+2)
	for _, scope := range []string{agent.Namespace, ruleAnyNamespace} {
		out = append(out, ruleKey(scope, ruleAnyLabel))
		for k, v := range agent.Labels {
			out = append(out, ruleKey(scope, k+"="+v))
		}
	}
	return out
}
