package tenancy

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// ResolveLimits is a Tenant's limits with every unset field at its default (a2av1.Default*); t nil
// (a namespace no Tenant binds) gets the defaults.
func ResolveLimits(t *a2av1.Tenant) a2av1.TenantLimits {
	var set a2av1.TenantLimits
	if t != nil && t.Spec.Limits != nil {
		set = *t.Spec.Limits
	}
	var c a2av1.PolicyCeilings
	if set.ConversationPolicy != nil {
		c = *set.ConversationPolicy
	}
	out := a2av1.TenantLimits{
		MaxAgents:    orInt(set.MaxAgents, a2av1.DefaultMaxAgents),
		MaxCardBytes: orInt(set.MaxCardBytes, a2av1.DefaultMaxCardBytes),
		ConversationPolicy: &a2av1.PolicyCeilings{
			MaxContextIdleTTL:            orDuration(c.MaxContextIdleTTL, a2av1.DefaultMaxContextIdleTTL),
			MaxContextMaxAge:             orDuration(c.MaxContextMaxAge, a2av1.DefaultMaxContextMaxAge),
			MaxInputRequiredTimeout:      orDuration(c.MaxInputRequiredTimeout, a2av1.DefaultMaxInputRequiredTimeout),
			MaxActiveContextsPerAgent:    orInt(c.MaxActiveContextsPerAgent, a2av1.DefaultMaxActiveContextsPerAgent),
			MaxConcurrentTasksPerContext: orInt(c.MaxConcurrentTasksPerContext, a2av1.DefaultMaxConcurrentTasksPerContext),
			MaxHistoryBytesPerContext:    orInt(c.MaxHistoryBytesPerContext, a2av1.DefaultMaxHistoryBytesPerContext),
		},
	}
	return out
}

func orInt(v *int32, def int32) *int32 {
	if v != nil {
		return v
	}
	return &def
}

func orDuration(v *metav1.Duration, def string) *metav1.Duration {
	if v != nil {
		return v
	}
	d, err := time.ParseDuration(def)
	if err != nil {
		panic(fmt.Sprintf("default duration %q: %v", def, err))
	}
	return &metav1.Duration{Duration: d}
}

// LimitsFor are the resolved limits of namespace ns and the Tenant that sets them (nil: the
// namespace is bound by no Tenant and gets the defaults).
func (v *View) LimitsFor(ctx context.Context, ns string) (a2av1.TenantLimits, *a2av1.Tenant, error) {
	n, err := v.Namespace(ctx, ns)
	if err != nil {
		return a2av1.TenantLimits{}, nil, err
	}
	t := v.bindings.TenantFor(n)
	return ResolveLimits(t), t, nil
}

// agentQuota is how a scope (a Tenant's namespaces, or one namespace no Tenant binds) stands
// against its maxAgents: ranked (each Agent's place, oldest first) is nil while the scope holds
// fewer than max Agents.
type agentQuota struct {
	max    int
	count  int
	ranked map[types.UID]int
	scope  string
}

// agentScope is the namespaces whose Agents count against one maxAgents (a Tenant's bound
// namespaces, or one namespace no Tenant binds), with the limit and the scope's name.
type agentScope struct {
	max        int
	name       string
	namespaces []string
}

// withinAgentLimit reports whether agent is among the oldest limits.maxAgents Agents of its
// scope (every Agent object of the Tenant's bound namespaces, or of its namespace when no Tenant
// binds it, counts), with a message when it is not.
//
// With a reader that ranks Agents (AgentRanker: an ordered index kept by the informer's events)
// the place is a lookup, whatever the distance to the limit. Without one, or while it cannot
// tell (not synced, or the Agent not in it yet), the scope's Agents are counted, and near the
// limit listed and ranked exactly, once per view.
func (v *View) withinAgentLimit(ctx context.Context, agent *a2av1.Agent) (bool, string, error) {
	ns, err := v.Namespace(ctx, agent.Namespace)
	if err != nil {
		return false, "", err
	}
	t := v.bindings.TenantFor(ns)
	key := "namespace/" + agent.Namespace
	if t != nil {
		key = "tenant/" + t.Name
	}
	scope, err := v.scopeOf(ctx, key, t, agent.Namespace)
	if err != nil {
		return false, "", err
	}
	if r, ok := v.reader.(AgentRanker); ok {
		if before, total, ok := r.AgentStanding(agent, scope.namespaces); ok {
			return limitVerdict(scope, before, total)
		}
	}
	q, ok := v.quotas.get(key)
	if !ok {
		if q, err = v.quotaOf(ctx, scope, agent.Namespace); err != nil {
			return false, "", err
		}
		v.quotas.put(key, q)
	}
	if q.ranked == nil {
		// Fewer Agents than the limit: even one the cache has not seen yet (a fresh create) fits.
		return true, "", nil
	}
	rank, listed := q.ranked[agent.UID]
	if !listed {
		// Not in the cache yet (a fresh create): the newest of all.
		rank = q.count
	}
	return limitVerdict(scope, rank, max(q.count, rank+1))
}

// limitVerdict decides an Agent with before Agents ahead of it in a scope of total.
func limitVerdict(scope agentScope, before, total int) (bool, string, error) {
	if before < scope.max {
		return true, "", nil
	}
	return false, fmt.Sprintf("%s holds %d Agents and allows %d (limits.maxAgents): this Agent is one of the newest beyond the limit", scope.name, total, scope.max), nil
}

// scopeOf resolves the scope key names (t's namespaces, or namespace alone when t is nil), once
// per view.
func (v *View) scopeOf(ctx context.Context, key string, t *a2av1.Tenant, namespace string) (agentScope, error) {
	if s, ok := v.scopes.get(key); ok {
		return s, nil
	}
	limits := ResolveLimits(t)
	s := agentScope{max: int(*limits.MaxAgents), name: "namespace " + namespace + " (bound by no Tenant)", namespaces: []string{namespace}}
	if t != nil {
		s.name = "Tenant " + t.Name
		var all corev1.NamespaceList
		if err := v.reader.List(ctx, &all, client.UnsafeDisableDeepCopy); err != nil {
			return s, fmt.Errorf("list namespaces: %w", err)
		}
		s.namespaces = s.namespaces[:0]
		for i := range all.Items {
			if b := v.bindings.TenantFor(&all.Items[i]); b != nil && b.Name == t.Name {
				s.namespaces = append(s.namespaces, all.Items[i].Name)
			}
		}
		if !slices.Contains(s.namespaces, namespace) {
			s.namespaces = append(s.namespaces, namespace)
		}
	}
	v.scopes.put(key, s)
	return s, nil
}

// quotaOf counts scope's Agents, and near the limit lists and ranks them exactly.
func (v *View) quotaOf(ctx context.Context, scope agentScope, namespace string) (agentQuota, error) {
	q := agentQuota{max: scope.max, scope: scope.name}
	if n, ok := countAgents(v.reader, scope.namespaces); ok && n+countSlack < q.max {
		// Clear of the limit: every Agent fits, and a count is enough (no list, no ranking).
		q.count = n
		return q, nil
	}
	var members []*a2av1.Agent
	for _, ns := range scope.namespaces {
		var list a2av1.AgentList
		// Read-only use of the cache's objects: no deep copies.
		if err := v.reader.List(ctx, &list, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
			if ns != namespace {
				// A bound namespace the reader does not cover (an operator restricted to some
				// namespaces, as in the tests): it holds no Agents this operator registers.
				continue
			}
			return q, fmt.Errorf("list agents in %s: %w", ns, err)
		}
		for i := range list.Items {
			members = append(members, &list.Items[i])
		}
	}
	q.count = len(members)
	if q.count < q.max {
		// Even a fresh create that the cache has not seen yet fits.
		return q, nil
	}
	slices.SortFunc(members, func(a, b *a2av1.Agent) int {
		if AgentPrecedes(a, b) {
			return -1
		}
		if AgentPrecedes(b, a) {
			return 1
		}
		return 0
	})
	q.ranked = make(map[types.UID]int, len(members))
	for i, m := range members {
		q.ranked[m.UID] = i
	}
	return q, nil
}

// countSlack is how far below limits.maxAgents a Tenant's counted Agents must be for the count
// alone to decide (AgentCounter): a counter kept by event handlers may trail the cache by the
// events it has not handled yet, so near the limit the Agents are listed and ranked exactly.
const countSlack = 128

// countAgents counts the Agents of namespaces with the reader's AgentCounter, if it has one that
// can tell.
func countAgents(r client.Reader, namespaces []string) (int, bool) {
	c, ok := r.(AgentCounter)
	if !ok {
		return 0, false
	}
	total := 0
	for _, ns := range namespaces {
		n, ok := c.AgentCount(ns)
		if !ok {
			return 0, false
		}
		total += n
	}
	return total, true
}
