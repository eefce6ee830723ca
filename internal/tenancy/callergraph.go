package tenancy

import (
	"context"
	"fmt"
	"maps"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// CallerGraph is every Agent's compiled callers.from rules, indexed both ways: the rules that may
// cover an Agent (by the label pairs they require, RulesCovering) and the Agents a rule may cover
// (by their labels, Candidates). It is kept by an Agent informer's event handler, one Agent at a
// time, and is safe for concurrent use: reads take a shared lock and never list the cache.
//
// It is compiled from three informers: the Agents (their labels and rules), the Namespaces (the
// labels namespace selectors match) and the AgentGrants (consent of the callers' namespaces), so
// it answers who may call whom up to liveness (Callers, Callees, Admits); liveness (Tenants,
// holders, limits) stays the View's. After each change it tells its subscribers which Agents'
// caller relations the change can touch (Subscribe), so that an Agent reconciled before the graph
// saw a change is reconciled again after it: for a Namespace or an AgentGrant, exactly the Agents
// whose callers or callees (admitted, or covered without consent) changed.
type CallerGraph struct {
	mu    sync.RWMutex
	nodes map[types.UID]*graphNode
	// byLabel files Agents under each "key=value" of their labels, byNamespace under their
	// namespace; rules files rule owners under their rules' IndexKeys.
	byLabel     map[string]map[types.UID]*graphNode
	byNamespace map[string]map[types.UID]*graphNode
	rules       map[string]map[types.UID]*graphNode
	// nsLabels are the Namespaces' labels (a Namespace not seen has none); grants the AgentGrants
	// of each namespace by name, grantList the same as a slice rebuilt on each change (readers
	// share it and never change it).
	nsLabels  map[string]labels.Set
	grants    map[string]map[string]*a2av1.AgentGrant
	grantList map[string][]a2av1.AgentGrant

	subMu       sync.Mutex
	subscribers []func([]types.NamespacedName)
	regs        []toolscache.ResourceEventHandlerRegistration
}

type graphNode struct {
	agent *a2av1.Agent
	rules []CallerRule
}

// NewCallerGraph returns an empty graph; Watch fills it from an informer.
func NewCallerGraph() *CallerGraph {
	return &CallerGraph{nodes: map[types.UID]*graphNode{}, byLabel: map[string]map[types.UID]*graphNode{},
		byNamespace: map[string]map[types.UID]*graphNode{}, rules: map[string]map[types.UID]*graphNode{},
		nsLabels: map[string]labels.Set{}, grants: map[string]map[string]*a2av1.AgentGrant{}, grantList: map[string][]a2av1.AgentGrant{}}
}

// Watch registers the graph's event handlers on c's Agent, Namespace and AgentGrant informers.
func (g *CallerGraph) Watch(ctx context.Context, c cache.Informers) error {
	handlers := []struct {
		obj    client.Object
		upsert func(old, obj any) []types.NamespacedName
		remove func(obj any) []types.NamespacedName
		what   string
	}{
		{&a2av1.Agent{}, g.upsertAgentEvent, func(obj any) []types.NamespacedName {
			if a, ok := obj.(*a2av1.Agent); ok {
				return g.Remove(a)
			}
			return nil
		}, "agents"},
		{&corev1.Namespace{}, func(_, obj any) []types.NamespacedName {
			if ns, ok := obj.(*corev1.Namespace); ok {
				return g.UpsertNamespace(ns)
			}
			return nil
		}, func(obj any) []types.NamespacedName {
			if ns, ok := obj.(*corev1.Namespace); ok {
				return g.RemoveNamespace(ns.Name)
			}
			return nil
		}, "namespaces"},
		{&a2av1.AgentGrant{}, func(_, obj any) []types.NamespacedName {
			if gr, ok := obj.(*a2av1.AgentGrant); ok {
				return g.UpsertGrant(gr)
			}
			return nil
		}, func(obj any) []types.NamespacedName {
			if gr, ok := obj.(*a2av1.AgentGrant); ok {
				return g.RemoveGrant(gr)
			}
			return nil
		}, "agent grants"},
	}
	for _, h := range handlers {
		inf, err := c.GetInformer(ctx, h.obj, cache.BlockUntilSynced(false))
		if err != nil {
			return fmt.Errorf("%s informer for the caller graph: %w", h.what, err)
		}
		reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { g.notify(h.upsert(nil, obj)) },
			UpdateFunc: func(old, obj any) { g.notify(h.upsert(old, obj)) },
			DeleteFunc: func(obj any) {
				if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
					obj = t.Obj
				}
				g.notify(h.remove(obj))
			},
		})
		if err != nil {
			return fmt.Errorf("watch %s for the caller graph: %w", h.what, err)
		}
		g.mu.Lock()
		g.regs = append(g.regs, reg)
		g.mu.Unlock()
	}
	return nil
}

// Synced reports whether the graph holds every Agent, Namespace and AgentGrant of the informers'
// initial lists (a graph
// filled by hand, without Watch, always is).
func (g *CallerGraph) Synced() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, reg := range g.regs {
		if !reg.HasSynced() {
			return false
		}
	}
	return true
}

// Subscribe calls fn, after each change the graph applies, with the Agents whose caller relations
// the change can touch.
func (g *CallerGraph) Subscribe(fn func([]types.NamespacedName)) {
	g.subMu.Lock()
	defer g.subMu.Unlock()
	g.subscribers = append(g.subscribers, fn)
}

func (g *CallerGraph) upsertAgentEvent(oldObj, newObj any) []types.NamespacedName {
	a, ok := newObj.(*a2av1.Agent)
	if !ok {
		return nil
	}
	old, _ := oldObj.(*a2av1.Agent)
	return g.Upsert(old, a)
}

func (g *CallerGraph) notify(keys []types.NamespacedName) {
	if len(keys) == 0 {
		return
	}
	g.subMu.Lock()
	subs := g.subscribers
	g.subMu.Unlock()
	for _, fn := range subs {
		fn(keys)
	}
}

// Upsert records agent (old: its previous version, nil when new or unknown) and returns the other
// Agents whose caller relations the change can touch: the owners of the rules that cover it
// before or after (they start or stop admitting it) and the Agents its rules cover before or
// after (they may start or stop calling it). A change of nothing the relations depend on (labels,
// spec, deletion, gating) touches nobody. agent itself is not among them: its own questions
// (Candidates of its rules, RulesCovering its labels) are asked with the object being reconciled,
// never the graph's copy, so only the other Agents the graph holds can be behind, and each of
// them is reported when the graph applies it.
func (g *CallerGraph) Upsert(old, agent *a2av1.Agent) []types.NamespacedName {
	g.mu.Lock()
	defer g.mu.Unlock()
	prev := g.nodes[agent.UID]
	if old == nil && prev != nil {
		old = prev.agent
	}
	if prev != nil {
		g.unfile(prev)
	}
	n := &graphNode{agent: agent}
	n.rules, _ = CompileCallerRules(agent)
	g.file(n)
	if old != nil && !relationsChanged(old, agent) {
		return nil
	}
	return g.touched(old, agent, prev)
}

// Remove forgets agent and returns the Agents whose caller relations its removal touches.
func (g *CallerGraph) Remove(agent *a2av1.Agent) []types.NamespacedName {
	g.mu.Lock()
	defer g.mu.Unlock()
	prev := g.nodes[agent.UID]
	if prev == nil {
		return nil
	}
	g.unfile(prev)
	return g.touched(nil, prev.agent, prev)
}

// relationsChanged: what the caller relations depend on changed (labels, spec, deletion, gating).
func relationsChanged(old, agent *a2av1.Agent) bool {
	return old.Generation != agent.Generation || !maps.Equal(old.Labels, agent.Labels) || old.Namespace != agent.Namespace ||
		!old.DeletionTimestamp.Equal(agent.DeletionTimestamp) || gated(old) != gated(agent)
}

func gated(a *a2av1.Agent) bool { return a.Status.Topics != nil && a.Status.Topics.Delivery != "" }

// touched computes Upsert's answer under the lock (prev: agent's node before, for its old rules).
func (g *CallerGraph) touched(old, agent *a2av1.Agent, prev *graphNode) []types.NamespacedName {
	out := map[types.NamespacedName]bool{}
	for _, subject := range []*a2av1.Agent{agent, old} {
		if subject == nil {
			continue
		}
		for _, owner := range g.rulesCovering(subject) {
			out[agentKey(owner.agent)] = true
		}
	}
	var rules []CallerRule
	if n := g.nodes[agent.UID]; n != nil {
		rules = n.rules
	}
	if prev != nil {
		rules = append(append([]CallerRule(nil), rules...), prev.rules...)
	}
	for _, n := range g.candidates(rules) {
		out[agentKey(n.agent)] = true
	}
	delete(out, agentKey(agent))
	return slicesOfKeys(out)
}

// RulesCovering returns the Agents with a rule that may cover agent by its labels and namespace
// (CallerRule.MatchesLabels; a namespace selector counts as a possible match), never agent
// itself. The objects are the informer's: read them, never change them.
func (g *CallerGraph) RulesCovering(agent *a2av1.Agent) []*a2av1.Agent {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return agentsOf(g.rulesCovering(agent), agent.UID)
}

func (g *CallerGraph) rulesCovering(agent *a2av1.Agent) []*graphNode {
	seen := map[types.UID]bool{agent.UID: true}
	var out []*graphNode
	for _, key := range RuleLookupKeys(agent) {
		for uid, n := range g.rules[key] {
			if seen[uid] {
				continue
			}
			for i := range n.rules {
				if n.rules[i].MatchesLabels(agent) {
					seen[uid] = true
					out = append(out, n)
					break
				}
			}
		}
	}
	return out
}

// Candidates returns the Agents owner's rules may cover by labels and namespace
// (CallerRule.MatchesLabels), each once, never owner itself: the rules' namespace selectors,
// liveness and consent are the caller's to check. The objects are the informer's.
func (g *CallerGraph) Candidates(owner *a2av1.Agent) []*a2av1.Agent {
	rules, _ := CompileCallerRules(owner)
	g.mu.RLock()
	defer g.mu.RUnlock()
	return agentsOf(g.candidates(rules), owner.UID)
}

func (g *CallerGraph) candidates(rules []CallerRule) []*graphNode {
	seen := map[types.UID]bool{}
	var out []*graphNode
	for i := range rules {
		r := &rules[i]
		for uid, n := range g.scan(r) {
			if !seen[uid] && r.MatchesLabels(n.agent) {
				seen[uid] = true
				out = append(out, n)
			}
		}
	}
	return out
}

// scan is the smallest set the graph files that holds every Agent r may cover.
func (g *CallerGraph) scan(r *CallerRule) map[types.UID]*graphNode {
	_, pair, _ := cutKey(r.IndexKey)
	if pair != ruleAnyLabel {
		return g.byLabel[pair]
	}
	if !r.AnyNamespace {
		return g.byNamespace[r.OwnerNamespace]
	}
	return g.nodes
}

func (g *CallerGraph) file(n *graphNode) {
	a := n.agent
	g.nodes[a.UID] = n
	fileUnder(g.byNamespace, a.Namespace, n)
	for k, v := range a.Labels {
		fileUnder(g.byLabel, k+"="+v, n)
	}
	for i := range n.rules {
		fileUnder(g.rules, n.rules[i].IndexKey, n)
	}
}

func (g *CallerGraph) unfile(n *graphNode) {
	a := n.agent
	delete(g.nodes, a.UID)
	unfileFrom(g.byNamespace, a.Namespace, a.UID)
	for k, v := range a.Labels {
		unfileFrom(g.byLabel, k+"="+v, a.UID)
	}
	for i := range n.rules {
		unfileFrom(g.rules, n.rules[i].IndexKey, a.UID)
	}
}

func fileUnder(m map[string]map[types.UID]*graphNode, key string, n *graphNode) {
	set := m[key]
	if set == nil {
		set = map[types.UID]*graphNode{}
		m[key] = set
	}
	set[n.agent.UID] = n
}

func unfileFrom(m map[string]map[types.UID]*graphNode, key string, uid types.UID) {
	if set := m[key]; set != nil {
		delete(set, uid)
		if len(set) == 0 {
			delete(m, key)
		}
	}
}

func cutKey(key string) (scope, pair string, ok bool) {
	for i := 0; i < len(key); i++ {
		if key[i] == '|' {
			return key[:i], key[i+1:], true
		}
	}
	return "", key, false
}

func agentKey(a *a2av1.Agent) types.NamespacedName {
	return types.NamespacedName{Namespace: a.Namespace, Name: a.Name}
}

func agentsOf(nodes []*graphNode, skip types.UID) []*a2av1.Agent {
	out := make([]*a2av1.Agent, 0, len(nodes))
	for _, n := range nodes {
		if n.agent.UID != skip {
			out = append(out, n.agent)
		}
	}
	return out
}

func slicesOfKeys(m map[types.NamespacedName]bool) []types.NamespacedName {
	out := make([]types.NamespacedName, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// CallerGraphReader is a reader that carries a caller graph (WithCallerGraph): Views read through
// it use the graph for the caller relations.
type CallerGraphReader interface {
	CallerGraph() *CallerGraph
}

type graphClient struct {
	client.Client
	graph *CallerGraph
}

func (c graphClient) CallerGraph() *CallerGraph { return c.graph }

// AgentCount passes the wrapped client's AgentCounter on, if it has one.
func (c graphClient) AgentCount(namespace string) (int, bool) {
	if counter, ok := c.Client.(AgentCounter); ok {
		return counter.AgentCount(namespace)
	}
	return 0, false
}

// AgentStanding passes the wrapped client's AgentRanker on, if it has one: without it a View
// over this client would list and rank a Tenant's Agents in every reconcile near its limit.
func (c graphClient) AgentStanding(agent *a2av1.Agent, namespaces []string) (before, total int, ok bool) {
	if ranker, ok := c.Client.(AgentRanker); ok {
		return ranker.AgentStanding(agent, namespaces)
	}
	return 0, 0, false
}

// WithCallerGraph returns c, whose Views then read the caller relations from g. It keeps what c
// counts and ranks (WithAgentCounts), whichever was applied first.
func WithCallerGraph(c client.Client, g *CallerGraph) client.Client {
	return graphClient{Client: c, graph: g}
}
