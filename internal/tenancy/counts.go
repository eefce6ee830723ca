package tenancy

import (
	"context"
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

// AgentCounts is an AgentCounter kept by an Agent informer's event handler. The Tenant limit
// (limits.maxAgents) needs a Tenant's Agent count in every reconcile: listing them from the cache
// copied every Agent of the Tenant each time, O(fleet) per reconcile and O(fleet²) per rollout
// (54 % of the operator's CPU at 10 000 Agents, docs/benchmarks.md, "The fleet's waits").
type AgentCounts struct {
	cache cache.Informers
	once  sync.Once
	reg   toolscache.ResourceEventHandlerRegistration

	mu sync.RWMutex
	by map[string]int
}

// NewAgentCounts returns a counter of c's Agents. It registers its event handler on first use
// (the cache is running by then).
func NewAgentCounts(c cache.Informers) *AgentCounts {
	return &AgentCounts{cache: c, by: map[string]int{}}
}

// AgentCount implements AgentCounter.
func (a *AgentCounts) AgentCount(namespace string) (int, bool) {
	a.once.Do(func() {
		inf, err := a.cache.GetInformer(context.Background(), &a2av1.Agent{}, cache.BlockUntilSynced(false))
		if err != nil {
			return
		}
		a.reg, _ = inf.AddEventHandler(a)
	})
	if a.reg == nil || !a.reg.HasSynced() {
		return 0, false
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.by[namespace], true
}

// OnAdd implements toolscache.ResourceEventHandler.
func (a *AgentCounts) OnAdd(obj any, _ bool) { a.add(obj, 1) }

// OnUpdate implements toolscache.ResourceEventHandler: an Agent keeps its namespace.
func (a *AgentCounts) OnUpdate(_, _ any) {}

// OnDelete implements toolscache.ResourceEventHandler.
func (a *AgentCounts) OnDelete(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	a.add(obj, -1)
}

func (a *AgentCounts) add(obj any, d int) {
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	a.mu.Lock()
	a.by[o.GetNamespace()] += d
	if a.by[o.GetNamespace()] <= 0 {
		delete(a.by, o.GetNamespace())
	}
	a.mu.Unlock()
}

// countingClient is a client whose reads also count Agents (AgentCounter).
type countingClient struct {
	client.Client
	*AgentCounts
}

// WithAgentCounts returns c, whose Views then count a Tenant's Agents with counts instead of
// listing them (while the count is clear of the limit).
func WithAgentCounts(c client.Client, counts *AgentCounts) client.Client {
	return countingClient{Client: c, AgentCounts: counts}
}
