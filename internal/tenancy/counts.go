package tenancy

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// AgentCounter counts the Agent objects of a namespace as a cache holds them, without listing
// them; ok is false while it cannot tell (not synced yet).
type AgentCounter interface {
	AgentCount(namespace string) (n int, ok bool)
}

// AgentRanker places an Agent among the Agents of a set of namespaces (a Tenant's scope) in
// AgentPrecedes order without listing them: before is how many precede it, total how many
// there are. ok is false while it cannot tell: not synced yet, or the Agent itself not (or not
// yet) among those it holds, as for a fresh create its events have not reached yet.
type AgentRanker interface {
	AgentStanding(agent *a2av1.Agent, namespaces []string) (before, total int, ok bool)
}

// AgentCounts counts and orders the Agents of each namespace, kept by an Agent informer's event
// handler (AgentCounter, AgentRanker). The Tenant limit (limits.maxAgents) needs a Tenant's
// Agent count in every reconcile, and near the limit the Agent's place among them (the oldest
// maxAgents are within it): listing and sorting them from the cache copied every Agent of the
// Tenant each time, O(fleet) per reconcile and O(fleet²) per rollout (docs/scale.md, "What is not
// linear"). Here each namespace's Agents are a tree in AgentPrecedes order whose nodes know their
// subtree's size (placeTree): an event is O(log n), and so is an Agent's place per namespace of
// its scope.
type AgentCounts struct {
	cache cache.Informers
	once  sync.Once
	// synced reports whether the handler has seen every Agent of the informer's initial list; nil
	// until it is registered.
	synced func() bool

	mu sync.RWMutex
	by map[string]*placeTree
	// seed makes the trees' priorities (hashes of the Agents' UIDs) unpredictable to whoever
	// names Agents, so that no sequence of creates can unbalance them.
	seed maphash.Seed

	subMu sync.Mutex
	subs  []func(namespace string)
}

// NewAgentCounts returns a counter of c's Agents. It registers its event handler on first use
// (the cache is running by then).
func NewAgentCounts(c cache.Informers) *AgentCounts {
	return &AgentCounts{cache: c, by: map[string]*placeTree{}, seed: maphash.MakeSeed()}
}

// watch registers the event handler once; it reports whether the handler has synced.
func (a *AgentCounts) watch() bool {
	a.once.Do(func() {
		if a.cache == nil {
			return
		}
		inf, err := a.cache.GetInformer(context.Background(), &a2av1.Agent{}, cache.BlockUntilSynced(false))
		if err != nil {
			return
		}
		if reg, err := inf.AddEventHandler(a); err == nil {
			a.synced = reg.HasSynced
		}
	})
	return a.synced != nil && a.synced()
}

// AgentCount implements AgentCounter.
func (a *AgentCounts) AgentCount(namespace string) (int, bool) {
	if !a.watch() {
		return 0, false
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	t, ok := a.by[namespace]
	if !ok {
		return 0, true
	}
	return t.len(), true
}

// AgentStanding implements AgentRanker: O(log n) per namespace.
func (a *AgentCounts) AgentStanding(agent *a2av1.Agent, namespaces []string) (before, total int, ok bool) {
	if !a.watch() {
		return 0, 0, false
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	own := a.by[agent.Namespace]
	if own == nil {
		return 0, 0, false
	}
	p, i := own.find(agent.CreationTimestamp.Time, agent.Name)
	if p == nil || p.uid != agent.UID {
		// Not here (yet): the handler trails the cache by the events it has not handled.
		return 0, 0, false
	}
	if !slices.Contains(namespaces, agent.Namespace) {
		namespaces = append(slices.Clip(namespaces), agent.Namespace)
	}
	at := agent.CreationTimestamp.Time
	for _, ns := range namespaces {
		t := a.by[ns]
		if t == nil {
			continue
		}
		total += t.len()
		if ns == agent.Namespace {
			before += i
			continue
		}
		// Another namespace's Agents created in the same second precede the Agent when their
		// namespace sorts first (AgentPrecedes).
		nsFirst := ns < agent.Namespace
		before += t.countBefore(func(p *agentPlace) bool {
			return p.created.Before(at) || (nsFirst && p.created.Equal(at))
		})
	}
	return before, total, true
}

// SubscribeDeletions calls f with an Agent's namespace after each deletion the counts have
// applied (so that f's readers see it: the Agents that a deletion lets within a Tenant's limit
// are reconciled after the limit's decision can see them move in). f must not block for long:
// it runs in the informer's event handler.
func (a *AgentCounts) SubscribeDeletions(f func(namespace string)) {
	a.subMu.Lock()
	a.subs = append(a.subs, f)
	a.subMu.Unlock()
	a.watch()
}

// OnAdd implements toolscache.ResourceEventHandler.
func (a *AgentCounts) OnAdd(obj any, _ bool) {
	if o, ok := obj.(client.Object); ok {
		a.mu.Lock()
		a.insert(o)
		a.mu.Unlock()
	}
}

// OnUpdate implements toolscache.ResourceEventHandler. An Agent keeps its namespace, name, UID
// and creation time; only a relist after a missed delete and re-create under the same name
// changes them (the informer reports it as an update).
func (a *AgentCounts) OnUpdate(oldObj, newObj any) {
	o, ok1 := oldObj.(client.Object)
	n, ok2 := newObj.(client.Object)
	if !ok1 || !ok2 {
		return
	}
	if ot, nt := o.GetCreationTimestamp(), n.GetCreationTimestamp(); o.GetUID() == n.GetUID() && ot.Equal(&nt) {
		return
	}
	a.mu.Lock()
	a.remove(o)
	a.insert(n)
	a.mu.Unlock()
}

// OnDelete implements toolscache.ResourceEventHandler.
func (a *AgentCounts) OnDelete(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	a.mu.Lock()
	a.remove(o)
	a.mu.Unlock()
	a.subMu.Lock()
	subs := a.subs
	a.subMu.Unlock()
	for _, f := range subs {
		f(o.GetNamespace())
	}
}

func (a *AgentCounts) insert(o client.Object) {
	t := a.by[o.GetNamespace()]
	if t == nil {
		t = &placeTree{}
		a.by[o.GetNamespace()] = t
	}
	t.put(agentPlace{created: o.GetCreationTimestamp().Time, name: o.GetName(), uid: o.GetUID()},
		maphash.String(a.seed, string(o.GetUID())))
}

func (a *AgentCounts) remove(o client.Object) {
	t := a.by[o.GetNamespace()]
	if t == nil {
		return
	}
	t.remove(o.GetCreationTimestamp().Time, o.GetName(), o.GetUID())
	if t.len() == 0 {
		delete(a.by, o.GetNamespace())
	}
}

// countingClient is a client whose reads also count and rank Agents (AgentCounter, AgentRanker).
type countingClient struct {
	client.Client
	*AgentCounts
}

// WithAgentCounts returns c, whose Views then count a Tenant's Agents and place an Agent among
// them with counts instead of listing them. It keeps c's caller graph (WithCallerGraph),
// whichever was applied first: the graph's wrapper stays outermost and passes the counts on.
func WithAgentCounts(c client.Client, counts *AgentCounts) client.Client {
	if g, ok := c.(graphClient); ok {
		g.Client = WithAgentCounts(g.Client, counts)
		return g
	}
	return countingClient{Client: c, AgentCounts: counts}
}
