package tenancy

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Authorizer answers the tenancy questions from a client.Reader (the manager's cache, which must
// index Agents by identity.IndexAgentClientID, identity.IndexAgentPool and
// identity.IndexAgentCallerRule).
type Authorizer struct {
	Reader client.Reader
	// Graph, when set (or when Reader carries one: WithCallerGraph), answers which Agents caller
	// rules cover without listing the cache. It is used once it has synced.
	Graph *CallerGraph
}

// View is one consistent look at the objects tenancy depends on, memoizing what it reads and
// decides, for the length of one reconcile (or one generation of the conversation service's
// decisions). It is safe for concurrent use: each memo has its own lock, and two goroutines that
// miss the same entry at once both decide it, alike. Objects it returns (holders) are the
// cache's own: read them, never change them.
type View struct {
	reader   client.Reader
	graph    *CallerGraph
	bindings *Bindings
	ns       memo[string, *corev1.Namespace]
	grants   memo[string, []a2av1.AgentGrant]
	// byClaim memoizes decisions per namespace and claim: Agents claiming the same org, unit and
	// pool from one namespace get the same answer (a unit of a thousand Agents, one decision).
	byClaim memo[nsClaim, Decision]
	// claimants are the Agents claiming each client ID (listed once, or preloaded), holders the
	// decided holder of each client ID (nil: nobody may hold it), poolOwners the owning namespace
	// of each pool.
	claimants  memo[a2amqtt.AgentRef, []*a2av1.Agent]
	holders    memo[a2amqtt.AgentRef, *a2av1.Agent]
	poolOwners memo[string, string]
	// scopes are the namespaces counted against each maxAgents, and quotas the standings against
	// it where they are counted or listed, by scope ("tenant/{name}", "namespace/{name}").
	scopes memo[string, agentScope]
	quotas memo[string, agentQuota]
}

// memo is a map safe for concurrent use.
type memo[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]V
}

func (m *memo[K, V]) get(k K) (V, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	v, ok := m.m[k]
	return v, ok
}

func (m *memo[K, V]) put(k K, v V) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[K]V{}
	}
	m.m[k] = v
}

type nsClaim struct {
	namespace string
	claim     Claim
}

// View lists the Tenants and starts a View.
func (a *Authorizer) View(ctx context.Context) (*View, error) {
	var tenants a2av1.TenantList
	// Read-only: Bindings keeps pointers to the cache's Tenants and never changes them.
	if err := a.Reader.List(ctx, &tenants, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	graph := a.Graph
	if gr, ok := a.Reader.(CallerGraphReader); ok && graph == nil {
		graph = gr.CallerGraph()
	}
	if graph != nil && !graph.Synced() {
		graph = nil
	}
	return &View{reader: a.Reader, graph: graph, bindings: NewBindings(tenants.Items)}, nil
}

// PreloadClaimants tells the view that agents include every Agent claiming any of their client
// IDs (all the Agents of a unit or of an org do), so that Holder and Live need no read per
// client ID: deciding the members of a unit or an org is then linear in its size. The view keeps
// pointers to agents and never changes them.
func (v *View) PreloadClaimants(agents []a2av1.Agent) {
	byID := make(map[a2amqtt.AgentRef][]*a2av1.Agent, len(agents))
	for i := range agents {
		id := identity.Of(&agents[i])
		byID[id] = append(byID[id], &agents[i])
	}
	for id, list := range byID {
		if _, known := v.claimants.get(id); !known {
			v.claimants.put(id, list)
		}
	}
}

// claimantsOf lists the Agents claiming the client ID of id, once per view.
func (v *View) claimantsOf(ctx context.Context, id a2amqtt.AgentRef) ([]*a2av1.Agent, error) {
	if list, ok := v.claimants.get(id); ok {
		return list, nil
	}
	var same a2av1.AgentList
	// Read-only use of the cache's objects: no deep copies.
	if err := v.reader.List(ctx, &same, client.MatchingFields{identity.IndexAgentClientID: id.ClientID()}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list agents with client ID %s: %w", id.ClientID(), err)
	}
	list := make([]*a2av1.Agent, 0, len(same.Items))
	for i := range same.Items {
		list = append(list, &same.Items[i])
	}
	v.claimants.put(id, list)
	return list, nil
}

// Reader is the reader the view reads through.
func (v *View) Reader() client.Reader { return v.reader }

// Bindings are the Tenants' bindings of this view.
func (v *View) Bindings() *Bindings { return v.bindings }

// Namespace returns a namespace (a missing one as a Namespace with only its name, so that the
// rules still apply: Agents outlive their namespace only while it terminates).
func (v *View) Namespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	if ns, ok := v.ns.get(name); ok {
		return ns, nil
	}
	ns := &corev1.Namespace{}
	if err := v.reader.Get(ctx, client.ObjectKey{Name: name}, ns); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("get namespace %s: %w", name, err)
		}
		ns = &corev1.Namespace{}
		ns.Name = name
	}
	v.ns.put(name, ns)
	return ns, nil
}

// Grants returns the AgentGrants of namespace ns.
func (v *View) Grants(ctx context.Context, ns string) ([]a2av1.AgentGrant, error) {
	if g, ok := v.grants.get(ns); ok {
		return g, nil
	}
	var list a2av1.AgentGrantList
	if err := v.reader.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("list agent grants in %s: %w", ns, err)
	}
	v.grants.put(ns, list.Items)
	return list.Items, nil
}

// Authorize decides whether agent's namespace may make the agent's claim.
func (v *View) Authorize(ctx context.Context, agent *a2av1.Agent) (Decision, error) {
	key := nsClaim{namespace: agent.Namespace, claim: ClaimOf(agent)}
	d, ok := v.byClaim.get(key)
	if !ok {
		ns, err := v.Namespace(ctx, agent.Namespace)
		if err != nil {
			return Decision{}, err
		}
		d = v.bindings.Authorize(ns, key.claim)
		v.byClaim.put(key, d)
	}
	return d, nil
}

// Permit decides whether agent may be on the bus at all: its namespace may make its claim
// (Authorize), and it is within its Tenant's (or namespace's) limits.maxAgents, the oldest first.
// An Agent beyond the limit is refused like a claim that is not permitted (LimitExceeded set).
func (v *View) Permit(ctx context.Context, agent *a2av1.Agent) (Decision, error) {
	d, err := v.Authorize(ctx, agent)
	if err != nil || !d.Permitted {
		return d, err
	}
	within, why, err := v.withinAgentLimit(ctx, agent)
	if err != nil {
		return Decision{}, err
	}
	if !within {
		return Decision{Tenant: d.Tenant, Message: why, LimitExceeded: true}, nil
	}
	return d, nil
}

// Holder is the Agent that holds agent's client ID: among the Agents that claim it and are
// permitted to, the oldest (then lexically first namespace, then name). Agents being deleted
// still count, because they hold the identity until their finalizer has removed the broker
// state. nil means nobody may hold it.
//
// The decision is memoized per client ID for the view, as long as agent is one of the claimants
// the view knows (a fresh create the cache has not seen yet is decided on its own).
func (v *View) Holder(ctx context.Context, agent *a2av1.Agent) (*a2av1.Agent, error) {
	id := identity.Of(agent)
	claimants, err := v.claimantsOf(ctx, id)
	if err != nil {
		return nil, err
	}
	known := containsUIDPtr(claimants, agent.UID)
	if h, ok := v.holders.get(id); ok && known {
		if h != nil && h.UID == agent.UID {
			return agent, nil
		}
		return h, nil
	}
	var holder *a2av1.Agent
	consider := func(c *a2av1.Agent) error {
		d, err := v.Permit(ctx, c)
		if err != nil {
			return err
		}
		if d.Permitted && (holder == nil || AgentPrecedes(c, holder)) {
			holder = c
		}
		return nil
	}
	for _, c := range claimants {
		if c.UID == agent.UID {
			c = agent
		}
		if err := consider(c); err != nil {
			return nil, err
		}
	}
	if !known {
		// The cache may not have seen the Agent yet (a fresh create).
		if err := consider(agent); err != nil {
			return nil, err
		}
		return holder, nil
	}
	v.holders.put(id, holder)
	return holder, nil
}

// HolderOf is the Agent that holds client ID id (nil: nobody may hold it), as Holder decides it:
// who is on the bus as id, whatever other Agents claim it.
func (v *View) HolderOf(ctx context.Context, id a2amqtt.AgentRef) (*a2av1.Agent, error) {
	if h, ok := v.holders.get(id); ok {
		return h, nil
	}
	claimants, err := v.claimantsOf(ctx, id)
	if err != nil || len(claimants) == 0 {
		return nil, err
	}
	return v.Holder(ctx, claimants[0])
}

// Live reports whether agent is a live identity on the bus: permitted, the holder of its client
// ID, and not being deleted. Only live Agents appear in other Agents' ACLs.
func (v *View) Live(ctx context.Context, agent *a2av1.Agent) (bool, error) {
	if !agent.DeletionTimestamp.IsZero() {
		return false, nil
	}
	h, err := v.Holder(ctx, agent)
	if err != nil || h == nil {
		return false, err
	}
	return h.UID == agent.UID, nil
}

// PoolOwner is the namespace that owns agent's pool: the namespace of the pool's oldest live
// member ("" when agent is in no pool or the pool has no live member).
func (v *View) PoolOwner(ctx context.Context, agent *a2av1.Agent) (string, error) {
	if agent.Spec.PoolID == "" {
		return "", nil
	}
	key := PoolKey(agent)
	if owner, ok := v.poolOwners.get(key); ok {
		return owner, nil
	}
	var members a2av1.AgentList
	// Read-only use of the cache's objects: no deep copies.
	if err := v.reader.List(ctx, &members, client.MatchingFields{identity.IndexAgentPool: key}, client.UnsafeDisableDeepCopy); err != nil {
		return "", fmt.Errorf("list members of pool %s: %w", key, err)
	}
	known := containsUID(members.Items, agent.UID)
	if !known {
		// The cache may not have seen the Agent yet (a fresh create): decided on its own.
		members.Items = append(members.Items, *agent)
	}
	var oldest *a2av1.Agent
	for i := range members.Items {
		m := &members.Items[i]
		live, err := v.Live(ctx, m)
		if err != nil {
			return "", err
		}
		if live && (oldest == nil || AgentPrecedes(m, oldest)) {
			oldest = m
		}
	}
	owner := ""
	if oldest != nil {
		owner = oldest.Namespace
	}
	if known {
		v.poolOwners.put(key, owner)
	}
	return owner, nil
}

// PoolJoined reports whether agent may be a member of its pool: it is in one, and the pool is
// owned by its own namespace or the owner grants its namespace Pools. owner is the owning
// namespace, for messages.
func (v *View) PoolJoined(ctx context.Context, agent *a2av1.Agent) (joined bool, owner string, err error) {
	if agent.Spec.PoolID == "" {
		return false, "", nil
	}
	if owner, err = v.PoolOwner(ctx, agent); err != nil {
		return false, "", err
	}
	if owner == "" || owner == agent.Namespace {
		return true, agent.Namespace, nil
	}
	grants, err := v.Grants(ctx, owner)
	if err != nil {
		return false, owner, err
	}
	return PoolGranted(grants, owner, agent.Namespace, agent.Spec.PoolID), owner, nil
}

// CallerGranted reports whether an Agent of selectorNS may select caller through callers.from
// (from the caller graph's AgentGrants when the view has one: its reports then re-reconcile the
// Agents a grant concerns after the graph holds it).
func (v *View) CallerGranted(ctx context.Context, selectorNS string, caller *a2av1.Agent) (bool, error) {
	if selectorNS == caller.Namespace {
		return true, nil
	}
	if v.graph != nil {
		return CallerGranted(v.graph.Grants(caller.Namespace), selectorNS, caller), nil
	}
	grants, err := v.Grants(ctx, caller.Namespace)
	if err != nil {
		return false, err
	}
	return CallerGranted(grants, selectorNS, caller), nil
}

// PoolKey is the index value of an Agent's pool: "{org}/{unit}/{pool}".
func PoolKey(agent *a2av1.Agent) string {
	return agent.Spec.OrgID + "/" + agent.Spec.UnitID + "/" + agent.Spec.PoolID
}

// AgentPrecedes orders claimants of one identity: the oldest first, then the lexically first
// namespace, then name.
func AgentPrecedes(a, b *a2av1.Agent) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	return a.Name < b.Name
}

func containsUID(agents []a2av1.Agent, uid types.UID) bool {
	for i := range agents {
		if agents[i].UID == uid {
			return true
		}
	}
	return false
}

func containsUIDPtr(agents []*a2av1.Agent, uid types.UID) bool {
	for _, a := range agents {
		if a.UID == uid {
			return true
		}
	}
	return false
}
