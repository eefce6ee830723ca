package tenancy

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Who may call whom is decided here, once, for everything that needs it: the ACL compiler
// (internal/registration compiles the broker's grants from it) and the conversation service
// (internal/convservice admits a gated agent's callers by it). Both evaluate the same compiled
// rules (CallerRule), enumerated from one caller graph (CallerGraph) where the reader carries one
// (which then also answers namespace labels and consent, leaving only liveness to the cache):
// Callers is exactly the live Agents Selects admits (TestCallersIsSelects checks it as a
// property over random fleets).

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

// Selects reports whether one of callee's callers.from rules admits agent: the rule covers it
// (CallerRule.Covers: its agent selector matches, its namespace rule covers the agent's
// namespace), and the agent's namespace consents (an AgentGrant of kind Callers) when it is
// another one. A rule never selects the callee itself.
func (v *View) Selects(ctx context.Context, callee, agent *a2av1.Agent) (bool, error) {
	if callee.UID == agent.UID {
		return false, nil
	}
	if v.graph != nil {
		return v.graph.Admits(callee, agent), nil
	}
	rules, _ := CompileCallerRules(callee)
	covered, err := v.covered(ctx, rules, agent)
	if err != nil || !covered {
		return false, err
	}
	return v.CallerGranted(ctx, callee.Namespace, agent)
}

// covered reports whether one of rules covers agent.
func (v *View) covered(ctx context.Context, rules []CallerRule, agent *a2av1.Agent) (bool, error) {
	nsLabels := func() (labels.Set, error) {
		ns, err := v.Namespace(ctx, agent.Namespace)
		if err != nil {
			return nil, err
		}
		return labels.Set(ns.Labels), nil
	}
	for i := range rules {
		ok, err := rules[i].Covers(agent, nsLabels)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// Callers enumerates the live Agents callee's callers.from rules admit: exactly the live Agents
// for which Selects is true (each once). Agents of another namespace count only where an
// AgentGrant of their namespace consents; ungranted lists, sorted, the namespaces whose covered
// live Agents were left out for want of one. An invalid rule is an error.
func (v *View) Callers(ctx context.Context, callee *a2av1.Agent) (callers []*a2av1.Agent, ungranted []string, err error) {
	rules, err := CompileCallerRules(callee)
	if err != nil {
		return nil, nil, err
	}
	if v.graph != nil {
		return v.graphCallers(ctx, callee)
	}
	candidates, err := v.candidates(ctx, callee, rules)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range candidates {
		ok, err := v.covered(ctx, rules, c)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			continue
		}
		if live, err := v.Live(ctx, c); err != nil || !live {
			if err != nil {
				return nil, nil, err
			}
			continue
		}
		granted, err := v.CallerGranted(ctx, callee.Namespace, c)
		if err != nil {
			return nil, nil, err
		}
		if !granted {
			if !slices.Contains(ungranted, c.Namespace) {
				ungranted = append(ungranted, c.Namespace)
			}
			continue
		}
		callers = append(callers, c)
	}
	slices.Sort(ungranted)
	return callers, ungranted, nil
}

// graphCallers is Callers answered by the caller graph: only liveness is read per call.
func (v *View) graphCallers(ctx context.Context, callee *a2av1.Agent) (callers []*a2av1.Agent, ungranted []string, err error) {
	admitted, covered := v.graph.Callers(callee)
	if callers, err = v.liveOnly(ctx, admitted); err != nil {
		return nil, nil, err
	}
	live, err := v.liveOnly(ctx, covered)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range live {
		if !slices.Contains(ungranted, c.Namespace) {
			ungranted = append(ungranted, c.Namespace)
		}
	}
	slices.Sort(ungranted)
	return callers, ungranted, nil
}

// liveOnly keeps the live Agents of agents (a new slice).
func (v *View) liveOnly(ctx context.Context, agents []*a2av1.Agent) ([]*a2av1.Agent, error) {
	var out []*a2av1.Agent
	for _, a := range agents {
		live, err := v.Live(ctx, a)
		if err != nil {
			return nil, err
		}
		if live {
			out = append(out, a)
		}
	}
	return out, nil
}

// candidates are the Agents rules may cover by labels and namespace, each once, never callee: from
// the caller graph, or listed from the cache by each rule's selectors.
func (v *View) candidates(ctx context.Context, callee *a2av1.Agent, rules []CallerRule) ([]*a2av1.Agent, error) {
	if v.graph != nil {
		return v.graph.Candidates(callee), nil
	}
	seen := map[types.UID]bool{callee.UID: true}
	var out []*a2av1.Agent
	for i := range rules {
		r := &rules[i]
		if r.Agents == nil {
			continue
		}
		// Read-only use of the cache's objects: no deep copies.
		opts := []client.ListOption{client.MatchingLabelsSelector{Selector: r.Agents}, client.UnsafeDisableDeepCopy}
		if !r.AnyNamespace {
			opts = append(opts, client.InNamespace(r.OwnerNamespace))
		}
		var agents a2av1.AgentList
		if err := v.reader.List(ctx, &agents, opts...); err != nil {
			return nil, fmt.Errorf("list caller agents: %w", err)
		}
		for j := range agents.Items {
			if a := &agents.Items[j]; !seen[a.UID] {
				seen[a.UID] = true
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// Callees returns the live Agents whose callers.from rules admit agent (Selects), each once. Only
// the rules filed under agent's labels are examined (the caller graph, which also holds the
// namespace labels and consent, or the cache's caller-rule index), so the cost follows the number of rules that may cover it, not the size of the fleet.
func (v *View) Callees(ctx context.Context, agent *a2av1.Agent) ([]*a2av1.Agent, error) {
	if v.graph != nil {
		return v.liveOnly(ctx, v.graph.Callees(agent))
	}
	owners, err := v.RuleOwners(ctx, agent)
	if err != nil {
		return nil, err
	}
	var out []*a2av1.Agent
	for _, callee := range owners {
		selects, err := v.Selects(ctx, callee, agent)
		if err != nil {
			return nil, err
		}
		if !selects {
			continue
		}
		if live, err := v.Live(ctx, callee); err != nil {
			return nil, err
		} else if live {
			out = append(out, callee)
		}
	}
	return out, nil
}

// RuleOwners returns the Agents with callers.from rules that may cover agent by its labels (each
// at most once, never agent itself): from the caller graph, or through the cache's caller-rule
// index (identity.IndexAgentCallerRule). The objects are the cache's own: read them, never change
// them.
func (v *View) RuleOwners(ctx context.Context, agent *a2av1.Agent) ([]*a2av1.Agent, error) {
	return ruleOwners(ctx, v.reader, v.graph, agent)
}

// RuleOwners is View.RuleOwners for a reader (with the caller graph it carries, if any).
func RuleOwners(ctx context.Context, reader client.Reader, agent *a2av1.Agent) ([]*a2av1.Agent, error) {
	var graph *CallerGraph
	if gr, ok := reader.(CallerGraphReader); ok && gr.CallerGraph().Synced() {
		graph = gr.CallerGraph()
	}
	return ruleOwners(ctx, reader, graph, agent)
}

func ruleOwners(ctx context.Context, reader client.Reader, graph *CallerGraph, agent *a2av1.Agent) ([]*a2av1.Agent, error) {
	if graph != nil {
		return graph.RulesCovering(agent), nil
	}
	var out []*a2av1.Agent
	seen := map[types.UID]bool{agent.UID: true}
	for _, key := range RuleLookupKeys(agent) {
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
