package tenancy

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
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
// Tenant each time, O(fleet) per reconcile and O(fleet²) per rollout (docs/benchmarks.md, "The
// fleet's waits" and "The Tenant limit's decision"). Here a place is a binary search per
// namespace of the scope.
//
// Each namespace's Agents are a slice sorted in AgentPrecedes order: a new Agent is the newest
// almost always, so it is appended; a deletion moves the pointers after it (8 bytes an Agent,
// microseconds at 10 000), once per deletion, not per reconcile.
type AgentCounts struct {
	cache cache.Informers
	once  sync.Once
	// synced reports whether the handler has seen every Agent of the informer's initial list; nil
	// until it is registered.
	synced func() bool

	mu sync.RWMutex
	by map[string][]*agentPlace

	subMu sync.Mutex
	subs  []func(namespace string)
}

// agentPlace is what the order of an Agent within its namespace depends on (all immutable).
type agentPlace struct {
	created time.Time
	name    string
	uid     types.UID
}

// NewAgentCounts returns a counter of c's Agents. It registers its event handler on first use
// (the cache is running by then).
func NewAgentCounts(c cache.Informers) *AgentCounts {
	return &AgentCounts{cache: c, by: map[string][]*agentPlace{}}
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
	return len(a.by[namespace]), true
}

// AgentStanding implements AgentRanker: a binary search per namespace.
func (a *AgentCounts) AgentStanding(agent *a2av1.Agent, namespaces []string) (before, total int, ok bool) {
	if !a.watch() {
		return 0, 0, false
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	own := a.by[agent.Namespace]
	i := placeBefore(own, agent.Namespace, agent)
	if i == len(own) || own[i].uid != agent.UID || own[i].name != agent.Name {
		// Not here (yet): the handler trails the cache by the events it has not handled.
		return 0, 0, false
	}
	for _, ns := range namespaces {
		places := a.by[ns]
		total += len(places)
		if ns == agent.Namespace {
			before += i
		} else {
			before += placeBefore(places, ns, agent)
		}
	}
	if !slices.Contains(namespaces, agent.Namespace) {
		before += i
		total += len(own)
	}
	return before, total, true
}

// placeBefore is how many of places (namespace ns's, sorted) precede agent (AgentPrecedes).
func placeBefore(places []*agentPlace, ns string, agent *a2av1.Agent) int {
	at := agent.CreationTimestamp.Time
	i, _ := slices.BinarySearchFunc(places, agent, func(p *agentPlace, _ *a2av1.Agent) int {
		switch {
		case !p.created.Equal(at):
			return p.created.Compare(at)
		case ns != agent.Namespace:
			return strings.Compare(ns, agent.Namespace)
		default:
			return strings.Compare(p.name, agent.Name)
		}
	})
	return i
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

// find is where o's place is, or would be, in its namespace (caller holds mu).
func (a *AgentCounts) find(o client.Object) ([]*agentPlace, int, bool) {
	places := a.by[o.GetNamespace()]
	at := o.GetCreationTimestamp().Time
	i, found := slices.BinarySearchFunc(places, o, func(p *agentPlace, _ client.Object) int {
		if !p.created.Equal(at) {
			return p.created.Compare(at)
		}
		return strings.Compare(p.name, o.GetName())
	})
	return places, i, found
}

func (a *AgentCounts) insert(o client.Object) {
	places, i, found := a.find(o)
	p := &agentPlace{created: o.GetCreationTimestamp().Time, name: o.GetName(), uid: o.GetUID()}
	if found {
		places[i] = p
		return
	}
	a.by[o.GetNamespace()] = slices.Insert(places, i, p)
}

func (a *AgentCounts) remove(o client.Object) {
	places, i, found := a.find(o)
	if !found || places[i].uid != o.GetUID() {
		return
	}
	places = slices.Delete(places, i, i+1)
	if len(places) == 0 {
		delete(a.by, o.GetNamespace())
		return
	}
	a.by[o.GetNamespace()] = places
}

// countingClient is a client whose reads also count and rank Agents (AgentCounter, AgentRanker).
type countingClient struct {
	client.Client
	*AgentCounts
}

// WithAgentCounts returns c, whose Views then count a Tenant's Agents and place an Agent among
// them with counts instead of listing them.
func WithAgentCounts(c client.Client, counts *AgentCounts) client.Client {
	return countingClient{Client: c, AgentCounts: counts}
}
