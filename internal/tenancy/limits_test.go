package tenancy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// syncedCounts is an AgentCounts fed by the test instead of an informer, synced from the start.
func syncedCounts() *AgentCounts {
	a := NewAgentCounts(nil)
	a.synced = func() bool { return true }
	return a
}

// exactRanking is the Agents of namespaces in AgentPrecedes order, sorted from scratch.
func exactRanking(agents map[types.UID]*a2av1.Agent, namespaces []string) []*a2av1.Agent {
	var out []*a2av1.Agent
	for _, a := range agents {
		if slices.Contains(namespaces, a.Namespace) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b *a2av1.Agent) int {
		if AgentPrecedes(a, b) {
			return -1
		}
		if AgentPrecedes(b, a) {
			return 1
		}
		return 0
	})
	return out
}

// limitsFleet is a random history of Agents (creates, deletes, delete-and-recreate under the
// same name seen by a relist), Tenant limits and namespace moves, kept in a fake client (the
// cache) and in counts (the informer's handler).
type limitsFleet struct {
	t      *testing.T
	rnd    *rand.Rand
	reader client.Client
	counts *AgentCounts
	agents map[types.UID]*a2av1.Agent
	seq    int
}

var limitsNamespaces = []string{"ns0", "ns1", "ns2", "ns3"}

func newLimitsFleet(t *testing.T, seed uint64) *limitsFleet {
	ctx := context.Background()
	f := &limitsFleet{t: t, rnd: rand.New(rand.NewPCG(seed, 17)), counts: syncedCounts(), agents: map[types.UID]*a2av1.Agent{}}
	var objs []client.Object
	for _, ns := range limitsNamespaces {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	f.reader = fleetReader(t, objs...)
	// acme binds ns0 and ns1; globex the namespaces labelled team=globex (ns2 from the start,
	// ns3 when it moves in); another namespace is bound by no Tenant.
	for _, tn := range []a2av1.Tenant{
		tenant("acme", "acme", 0, func(s *a2av1.TenantSpec) { s.Namespaces = []string{"ns0", "ns1"} }),
		tenant("globex", "globex", 1, func(s *a2av1.TenantSpec) {
			s.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "globex"}}
		}),
	} {
		if err := f.reader.Create(ctx, &tn); err != nil {
			t.Fatal(err)
		}
	}
	f.label("ns2", "globex")
	return f
}

func (f *limitsFleet) label(ns, team string) {
	var n corev1.Namespace
	if err := f.reader.Get(context.Background(), client.ObjectKey{Name: ns}, &n); err != nil {
		f.t.Fatal(err)
	}
	n.Labels = map[string]string{"team": team}
	if err := f.reader.Update(context.Background(), &n); err != nil {
		f.t.Fatal(err)
	}
}

func (f *limitsFleet) setLimit(tenantName string, maxAgents int32) {
	var tn a2av1.Tenant
	if err := f.reader.Get(context.Background(), client.ObjectKey{Name: tenantName}, &tn); err != nil {
		f.t.Fatal(err)
	}
	tn.Spec.Limits = &a2av1.TenantLimits{MaxAgents: &maxAgents}
	if err := f.reader.Update(context.Background(), &tn); err != nil {
		f.t.Fatal(err)
	}
}

// newAgent is a new Agent: creation times have one-second resolution and names are drawn at
// random, so that many Agents share a second and the name decides their order.
func (f *limitsFleet) newAgent(ns, name string) *a2av1.Agent {
	f.seq++
	return &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID(fmt.Sprintf("uid-%d", f.seq)),
		CreationTimestamp: metav1.NewTime(time.Unix(1_700_000_000+int64(f.seq/4+f.rnd.IntN(3)), 0))},
		Spec: a2av1.AgentSpec{OrgID: "org", UnitID: "u", AgentID: name}}
}

func (f *limitsFleet) create() {
	ns := limitsNamespaces[f.rnd.IntN(len(limitsNamespaces))]
	name := fmt.Sprintf("a%03d", f.rnd.IntN(1000))
	for _, a := range f.agents {
		if a.Namespace == ns && a.Name == name {
			return
		}
	}
	a := f.newAgent(ns, name)
	if err := f.reader.Create(context.Background(), a.DeepCopy()); err != nil {
		f.t.Fatal(err)
	}
	f.agents[a.UID] = a
	f.counts.OnAdd(a, false)
}

func (f *limitsFleet) pick() *a2av1.Agent {
	if len(f.agents) == 0 {
		return nil
	}
	uids := make([]types.UID, 0, len(f.agents))
	for uid := range f.agents {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return f.agents[uids[f.rnd.IntN(len(uids))]]
}

func (f *limitsFleet) remove(a *a2av1.Agent) {
	if err := f.reader.Delete(context.Background(), a.DeepCopy()); err != nil {
		f.t.Fatal(err)
	}
	delete(f.agents, a.UID)
}

func (f *limitsFleet) step() {
	switch r := f.rnd.IntN(20); {
	case r < 10:
		f.create()
	case r < 15:
		if a := f.pick(); a != nil {
			f.remove(a)
			if r == 14 {
				f.counts.OnDelete(toolscache.DeletedFinalStateUnknown{Key: a.Namespace + "/" + a.Name, Obj: a})
			} else {
				f.counts.OnDelete(a)
			}
		}
	case r < 16:
		// Deleted and created again under the same name while the watch was down: the relist
		// reports an update with another UID and creation time.
		if a := f.pick(); a != nil {
			f.remove(a)
			again := f.newAgent(a.Namespace, a.Name)
			if err := f.reader.Create(context.Background(), again.DeepCopy()); err != nil {
				f.t.Fatal(err)
			}
			f.agents[again.UID] = again
			f.counts.OnUpdate(a, again)
		}
	case r < 19:
		f.setLimit([]string{"acme", "globex"}[f.rnd.IntN(2)], int32(1+f.rnd.IntN(len(f.agents)/2+2)))
	default:
		f.label("ns3", []string{"globex", "none"}[f.rnd.IntN(2)])
	}
}

// The limit's decision from the ordered counts is the decision of the exact ranking (every Agent
// of the scope listed and sorted), for every Agent after every step of random histories of
// creates (many in one second), deletes, re-creates seen by a relist, limit changes and a
// namespace moving between a Tenant and none; and AgentStanding's place is the Agent's index in
// the exact ranking.
func TestAgentLimitFromCountsMatchesExactRanking(t *testing.T) {
	ctx := context.Background()
	decided, beyond := 0, 0
	for seed := range uint64(6) {
		f := newLimitsFleet(t, seed)
		for range 150 {
			f.step()
			ranked, err := (&Authorizer{Reader: WithAgentCounts(f.reader, f.counts)}).View(ctx)
			if err != nil {
				t.Fatal(err)
			}
			exact, err := (&Authorizer{Reader: f.reader}).View(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range f.agents {
				gotIn, gotWhy, err := ranked.withinAgentLimit(ctx, a)
				if err != nil {
					t.Fatal(err)
				}
				wantIn, wantWhy, err := exact.withinAgentLimit(ctx, a)
				if err != nil {
					t.Fatal(err)
				}
				if gotIn != wantIn || gotWhy != wantWhy {
					t.Fatalf("seed %d: %s/%s: from the counts (%v, %q), exactly (%v, %q)", seed, a.Namespace, a.Name, gotIn, gotWhy, wantIn, wantWhy)
				}
				decided++
				if !wantIn {
					beyond++
				}
				key := "namespace/" + a.Namespace
				if tn := ranked.bindings.TenantFor(mustNamespace(t, ranked, a.Namespace)); tn != nil {
					key = "tenant/" + tn.Name
				}
				scope, _ := ranked.scopes.get(key)
				before, total, ok := f.counts.AgentStanding(a, scope.namespaces)
				order := exactRanking(f.agents, scope.namespaces)
				if i := slices.Index(order, a); !ok || before != i || total != len(order) {
					t.Fatalf("seed %d: %s/%s: AgentStanding = %d of %d (ok %v), the exact ranking places it %d of %d",
						seed, a.Namespace, a.Name, before, total, ok, i, len(order))
				}
			}
		}
	}
	// The histories must reach the limit often, or they prove little.
	if beyond < decided/10 {
		t.Fatalf("only %d of %d decisions were beyond the limit", beyond, decided)
	}
	t.Logf("%d decisions, %d beyond the limit", decided, beyond)
}

func mustNamespace(t *testing.T, v *View, name string) *corev1.Namespace {
	t.Helper()
	ns, err := v.Namespace(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// While the counts cannot place an Agent (not synced yet, or a fresh create whose event has not
// reached them: the handler trails the cache by the events it has not handled), the limit is
// decided exactly from the cache, never from a partial index that would let both fresh Agents in.
func TestAgentLimitFallsBackToTheCacheWhenCountsCannotTell(t *testing.T) {
	ctx := context.Background()
	f := newLimitsFleet(t, 99)
	f.setLimit("acme", 2)
	var fleet []*a2av1.Agent
	for i := range 4 {
		a := f.newAgent("ns0", fmt.Sprintf("b%d", i))
		a.CreationTimestamp = metav1.NewTime(time.Unix(1_700_000_000+int64(i), 0))
		if err := f.reader.Create(ctx, a.DeepCopy()); err != nil {
			t.Fatal(err)
		}
		fleet = append(fleet, a)
	}
	// The handler has seen the two oldest only: counted alone, b2 and b3 would fit (2 of 2).
	f.counts.OnAdd(fleet[0], false)
	f.counts.OnAdd(fleet[1], false)
	if _, _, ok := f.counts.AgentStanding(fleet[3], []string{"ns0", "ns1"}); ok {
		t.Fatal("the counts placed an Agent they have not seen")
	}
	// A handler registered on a running informer is first handed the cache's Agents in no order:
	// until it has them all, it may hold the newest without the oldest.
	unsynced := NewAgentCounts(nil)
	unsynced.synced = func() bool { return false }
	unsynced.OnAdd(fleet[3], true)
	unsynced.OnAdd(fleet[2], true)
	if _, _, ok := unsynced.AgentStanding(fleet[3], []string{"ns0"}); ok {
		t.Fatal("counts that have not synced placed an Agent")
	}
	for _, counts := range []*AgentCounts{f.counts, unsynced} {
		v, err := (&Authorizer{Reader: WithAgentCounts(f.reader, counts)}).View(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range fleet {
			in, _, err := v.withinAgentLimit(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			if want := i < 2; in != want {
				t.Errorf("%s: within the limit %v, want %v", a.Name, in, want)
			}
		}
	}
}

// The counts are read while the informer's handler changes them (run with -race), and end as the
// exact ranking.
func TestAgentCountsReadWhileTheyChange(t *testing.T) {
	f := newLimitsFleet(t, 5)
	for range 200 {
		f.create()
	}
	present := make([]*a2av1.Agent, 0, len(f.agents))
	for _, a := range f.agents {
		present = append(present, a)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i, a := range present {
			if i%2 == 0 {
				f.counts.OnDelete(a)
			}
		}
	})
	for range 4 {
		wg.Go(func() {
			for _, a := range present {
				before, total, ok := f.counts.AgentStanding(a, limitsNamespaces)
				if ok && (before >= total || total > len(present)) {
					t.Errorf("%s: placed %d of %d", a.Name, before, total)
				}
			}
		})
	}
	wg.Wait()
	for i, a := range present {
		if i%2 == 0 {
			delete(f.agents, a.UID)
		}
	}
	order := exactRanking(f.agents, limitsNamespaces)
	for i, a := range order {
		if before, total, ok := f.counts.AgentStanding(a, limitsNamespaces); !ok || before != i || total != len(order) {
			t.Fatalf("%s/%s: placed %d of %d (ok %v), exactly %d of %d", a.Namespace, a.Name, before, total, ok, i, len(order))
		}
	}
}

// The operator wraps its reader with both indexes, the caller graph's and the counts'
// (controllers.Setup, the Registrar's reader), in either order: a View over it must still read
// an Agent's place from the counts, never list the Tenant's Agents, and still find the graph.
func TestAgentLimitReadsTheIndexThroughEitherWrapper(t *testing.T) {
	ctx := context.Background()
	f := newLimitsFleet(t, 3)
	for range 60 {
		f.step()
	}
	listed := 0
	counted := interceptor.NewClient(f.reader.(client.WithWatch), interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*a2av1.AgentList); ok {
				listed++
			}
			return c.List(ctx, list, opts...)
		},
	})
	graph := NewCallerGraph()
	for name, reader := range map[string]client.Client{
		"graph outside":  WithCallerGraph(WithAgentCounts(counted, f.counts), graph),
		"counts outside": WithAgentCounts(WithCallerGraph(counted, graph), f.counts),
	} {
		if gr, ok := reader.(CallerGraphReader); !ok || gr.CallerGraph() != graph {
			t.Fatalf("%s: the reader lost its caller graph", name)
		}
		listed = 0
		v, err := (&Authorizer{Reader: reader}).View(ctx)
		if err != nil {
			t.Fatal(err)
		}
		beyond := 0
		for _, a := range f.agents {
			in, _, err := v.withinAgentLimit(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			if !in {
				beyond++
			}
		}
		if beyond == 0 {
			t.Fatalf("%s: no Agent of %d beyond its limit: the fleet proves nothing", name, len(f.agents))
		}
		if listed != 0 {
			t.Fatalf("%s: the View listed Agents %d times for %d decisions (%d beyond the limit) instead of reading the counts", name, listed, len(f.agents), beyond)
		}
	}
}
