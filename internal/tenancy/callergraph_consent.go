package tenancy

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// The graph's Namespaces and AgentGrants: both only decide relations whose caller is in the
// namespace that changed (a namespace selector matches the caller's namespace; consent is given
// by the caller's namespace), so a change is reported by comparing that namespace's relations
// before and after it.

// relation is how a rule owner relates to an Agent its rules may cover.
type relation uint8

const (
	unrelated relation = iota
	// coveredUngranted: a rule covers the Agent, its namespace does not consent (the owner's
	// status names the namespace).
	coveredUngranted
	// admitted: a rule covers the Agent and its namespace consents.
	admitted
)

type ownerCaller struct{ owner, caller types.UID }

// UpsertNamespace records ns's labels and returns the Agents whose callers or callees changed.
func (g *CallerGraph) UpsertNamespace(ns *corev1.Namespace) []types.NamespacedName {
	g.mu.Lock()
	defer g.mu.Unlock()
	if old, known := g.nsLabels[ns.Name]; known && maps.Equal(old, ns.Labels) {
		return nil
	}
	return g.changeIn(ns.Name, func() { g.nsLabels[ns.Name] = labels.Set(maps.Clone(ns.Labels)) })
}

// RemoveNamespace forgets a Namespace's labels (its Agents, while they last, have none).
func (g *CallerGraph) RemoveNamespace(name string) []types.NamespacedName {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, known := g.nsLabels[name]; !known {
		return nil
	}
	return g.changeIn(name, func() { delete(g.nsLabels, name) })
}

// UpsertGrant records an AgentGrant and returns the Agents whose callers or callees changed.
func (g *CallerGraph) UpsertGrant(grant *a2av1.AgentGrant) []types.NamespacedName {
	g.mu.Lock()
	defer g.mu.Unlock()
	if old := g.grants[grant.Namespace][grant.Name]; old != nil && old.Generation != 0 && old.Generation == grant.Generation {
		// The same spec (a resync, a metadata change): nothing it decides changed.
		g.grants[grant.Namespace][grant.Name] = grant
		g.listGrants(grant.Namespace)
		return nil
	}
	return g.changeIn(grant.Namespace, func() {
		byName := g.grants[grant.Namespace]
		if byName == nil {
			byName = map[string]*a2av1.AgentGrant{}
			g.grants[grant.Namespace] = byName
		}
		byName[grant.Name] = grant
		g.listGrants(grant.Namespace)
	})
}

// RemoveGrant forgets an AgentGrant and returns the Agents whose callers or callees changed.
func (g *CallerGraph) RemoveGrant(grant *a2av1.AgentGrant) []types.NamespacedName {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, known := g.grants[grant.Namespace][grant.Name]; !known {
		return nil
	}
	return g.changeIn(grant.Namespace, func() {
		delete(g.grants[grant.Namespace], grant.Name)
		if len(g.grants[grant.Namespace]) == 0 {
			delete(g.grants, grant.Namespace)
		}
		g.listGrants(grant.Namespace)
	})
}

// listGrants rebuilds a namespace's grant slice (a new one: readers may hold the old one).
func (g *CallerGraph) listGrants(ns string) {
	byName := g.grants[ns]
	if len(byName) == 0 {
		delete(g.grantList, ns)
		return
	}
	list := make([]a2av1.AgentGrant, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		list = append(list, *byName[name])
	}
	g.grantList[ns] = list
}

// changeIn applies change (under the write lock) and reports the owners and callers of every
// relation with a caller in ns that it changed.
func (g *CallerGraph) changeIn(ns string, change func()) []types.NamespacedName {
	before := g.relationsIn(ns)
	change()
	after := g.relationsIn(ns)
	out := map[types.NamespacedName]bool{}
	report := func(p ownerCaller) {
		for _, uid := range []types.UID{p.owner, p.caller} {
			if n := g.nodes[uid]; n != nil {
				out[agentKey(n.agent)] = true
			}
		}
	}
	for p, r := range before {
		if after[p] != r {
			report(p)
		}
	}
	for p := range after {
		if _, was := before[p]; !was {
			report(p)
		}
	}
	return slicesOfKeys(out)
}

// relationsIn are the relations (other than unrelated) whose caller is an Agent of ns.
func (g *CallerGraph) relationsIn(ns string) map[ownerCaller]relation {
	out := map[ownerCaller]relation{}
	for uid, c := range g.byNamespace[ns] {
		for _, owner := range g.rulesCovering(c.agent) {
			if r := g.relate(owner.agent, owner.rules, c.agent); r != unrelated {
				out[ownerCaller{owner: owner.agent.UID, caller: uid}] = r
			}
		}
	}
	return out
}

// relate is how owner, whose compiled rules are rules, relates to caller (under a lock).
func (g *CallerGraph) relate(owner *a2av1.Agent, rules []CallerRule, caller *a2av1.Agent) relation {
	if owner.UID == caller.UID {
		return unrelated
	}
	nsLabels := func() (labels.Set, error) { return g.nsLabels[caller.Namespace], nil }
	if !slices.ContainsFunc(rules, func(r CallerRule) bool { ok, _ := r.Covers(caller, nsLabels); return ok }) {
		return unrelated
	}
	if CallerGranted(g.grantList[caller.Namespace], owner.Namespace, caller) {
		return admitted
	}
	return coveredUngranted
}

// NamespaceLabels are the labels of Namespace name as the graph holds them (none when unseen).
func (g *CallerGraph) NamespaceLabels(name string) labels.Set {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.nsLabels[name]
}

// Grants are the AgentGrants of namespace ns as the graph holds them: read them, never change them.
func (g *CallerGraph) Grants(ns string) []a2av1.AgentGrant {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.grantList[ns]
}

// Admits reports whether one of callee's rules covers caller and caller's namespace consents
// (View.Selects without a cache read). callee's rules are compiled from the object given.
func (g *CallerGraph) Admits(callee, caller *a2av1.Agent) bool {
	rules, _ := CompileCallerRules(callee)
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.relate(callee, rules, caller) == admitted
}

// Callers are the Agents callee's rules cover: admitted (their namespace consents) and covered
// without consent, each once, liveness not considered. callee's rules are compiled from the
// object given; the Agents are the informer's.
func (g *CallerGraph) Callers(callee *a2av1.Agent) (callers, ungranted []*a2av1.Agent) {
	rules, _ := CompileCallerRules(callee)
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, n := range g.candidates(rules) {
		switch g.relate(callee, rules, n.agent) {
		case admitted:
			callers = append(callers, n.agent)
		case coveredUngranted:
			ungranted = append(ungranted, n.agent)
		}
	}
	return callers, ungranted
}

// Callees are the Agents whose rules admit agent, each once, liveness not considered. The
// Agents are the informer's.
func (g *CallerGraph) Callees(agent *a2av1.Agent) []*a2av1.Agent {
	g.mu.RLock()
	defer g.mu.RUnlock()
	var out []*a2av1.Agent
	for _, owner := range g.rulesCovering(agent) {
		if g.relate(owner.agent, owner.rules, agent) == admitted {
			out = append(out, owner.agent)
		}
	}
	return out
}
