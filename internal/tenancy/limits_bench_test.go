package tenancy

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/hostload"
)

// storeReader reads client-go informer stores (toolscache.Indexer, namespace-indexed, one per
// kind) the way controller-runtime's cache reader does: a namespace's objects from the
// namespace index, the stored objects themselves under UnsafeDisableDeepCopy (deep copies
// otherwise), set into the list by apimeta.SetList. It is the manager's cache without an API
// server, for a benchmark of what a reconcile's reads cost.
type storeReader struct {
	stores map[string]toolscache.Indexer // by list kind: "AgentList", "NamespaceList", "TenantList"
}

func newStoreReader() *storeReader {
	r := &storeReader{stores: map[string]toolscache.Indexer{}}
	for _, kind := range []string{"AgentList", "NamespaceList", "TenantList"} {
		r.stores[kind] = toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc})
	}
	return r
}

func (r *storeReader) add(kind string, obj client.Object) {
	if err := r.stores[kind].Add(obj); err != nil {
		panic(err)
	}
}

func (r *storeReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return fmt.Errorf("storeReader gets Namespaces only, not %T", obj)
	}
	item, exists, err := r.stores["NamespaceList"].GetByKey(key.Name)
	if err != nil {
		return err
	}
	if !exists {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, key.Name)
	}
	item.(*corev1.Namespace).DeepCopyInto(ns)
	return nil
}

func (r *storeReader) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	var o client.ListOptions
	o.ApplyOptions(opts)
	kind := fmt.Sprintf("%T", list)[strings.LastIndex(fmt.Sprintf("%T", list), ".")+1:]
	store, ok := r.stores[kind]
	if !ok || o.FieldSelector != nil || o.LabelSelector != nil {
		return fmt.Errorf("storeReader cannot list %s with %+v", kind, o)
	}
	var items []any
	if o.Namespace != "" {
		var err error
		if items, err = store.ByIndex(toolscache.NamespaceIndex, o.Namespace); err != nil {
			return err
		}
	} else {
		items = store.List()
	}
	objs := make([]runtime.Object, 0, len(items))
	for _, item := range items {
		obj := item.(runtime.Object)
		if o.UnsafeDisableDeepCopy == nil || !*o.UnsafeDisableDeepCopy {
			obj = obj.DeepCopyObject()
		}
		objs = append(objs, obj)
	}
	return apimeta.SetList(list, objs)
}

// withoutRanking hides the counts' AgentRanker: a reader with the counts alone decides the limit
// as the operator did before the ordered index (counted while clear of the limit, listed and
// sorted near it).
type withoutRanking struct {
	client.Reader
	AgentCounter
}

// limitFleet is a Tenant of n Agents over two namespaces with maxAgents n (a platform team that
// sets the limit to what it runs), in a store and in counts fed as the informer would.
func limitFleet(n int) (*storeReader, *AgentCounts, []*a2av1.Agent) {
	r := newStoreReader()
	counts := syncedCounts()
	for _, ns := range []string{"team-a", "team-b", "other"} {
		r.add("NamespaceList", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	maxAgents := int32(n)
	r.add("TenantList", &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "acme"}, Spec: a2av1.TenantSpec{OrgID: "acme",
		Namespaces: []string{"team-a", "team-b"}, Limits: &a2av1.TenantLimits{MaxAgents: &maxAgents}}})
	agents := make([]*a2av1.Agent, 0, n)
	for i := range n {
		a := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("agent-%05d", i), Namespace: []string{"team-a", "team-b"}[i%2],
			UID: types.UID(fmt.Sprintf("uid-%d", i)), CreationTimestamp: metav1.NewTime(time.Unix(1_700_000_000+int64(i/50), 0))},
			Spec: a2av1.AgentSpec{OrgID: "acme", UnitID: "u", AgentID: fmt.Sprintf("agent-%05d", i)}}
		r.add("AgentList", a)
		counts.OnAdd(a, true)
		agents = append(agents, a)
	}
	return r, counts, agents
}

// BenchmarkAgentLimitPerReconcile is what the Tenant limit costs one Agent reconcile (a View, and
// Permit: the claim and the place among the Tenant's Agents) in a Tenant of 1 000 and 10 000
// Agents whose maxAgents is its Agent count, deciding each Agent in turn as a rollout does, from
// the same kind of store as the manager's cache. "ranked" is the operator's reader (the counts
// place the Agent), "listed" the same reader without the ordered index (the Tenant's Agents
// listed and sorted, as before it). The ranked cost at 10 000 must stay within 1.5× that at
// 1 000; the listed ratio is reported beside it. The figures are the process's CPU per reconcile
// (the collector's included), which a busy machine does not inflate as it does the wall clock.
//
//	go test ./internal/tenancy -run '^$' -bench AgentLimitPerReconcile
func BenchmarkAgentLimitPerReconcile(b *testing.B) {
	ctx := context.Background()
	sizes := []int{1000, 10000}
	// Every fleet lives through every measurement: the Go heap (and so the collector's work per
	// allocated byte) is the same for each, and only the Tenant's size differs.
	type fleet struct {
		store  *storeReader
		counts *AgentCounts
		agents []*a2av1.Agent
	}
	fleets := map[int]fleet{}
	for _, n := range sizes {
		store, counts, agents := limitFleet(n)
		fleets[n] = fleet{store, counts, agents}
	}
	for _, path := range []string{"ranked", "listed"} {
		perReconcile := map[int]float64{}
		for _, n := range sizes {
			b.Run(fmt.Sprintf("%s/%d", path, n), func(b *testing.B) {
				store, counts, agents := fleets[n].store, fleets[n].counts, fleets[n].agents
				// As WithAgentCounts wraps the manager's client.
				var reader client.Reader = struct {
					client.Reader
					*AgentCounts
				}{store, counts}
				if path == "listed" {
					reader = withoutRanking{Reader: store, AgentCounter: counts}
				}
				decide := func(a *a2av1.Agent) Decision {
					v, err := (&Authorizer{Reader: reader}).View(ctx)
					if err != nil {
						b.Fatal(err)
					}
					d, err := v.Permit(ctx, a)
					if err != nil {
						b.Fatal(err)
					}
					return d
				}
				// At the limit, every Agent is within it; one more is not.
				newest := agents[n-1].DeepCopy()
				newest.Name, newest.UID, newest.CreationTimestamp = "newest", "uid-newest", metav1.NewTime(time.Unix(1_800_000_000, 0))
				store.add("AgentList", newest) // the same object again on a second path: a no-op
				counts.OnAdd(newest, false)
				if d := decide(agents[0]); !d.Permitted {
					b.Fatalf("the oldest Agent refused: %+v", d)
				}
				if d := decide(newest); d.Permitted || !d.LimitExceeded {
					b.Fatalf("the Agent beyond the limit: %+v", d)
				}
				// The process's CPU, not the wall clock: on a shared machine the wall clock
				// measures the other processes too. It includes the collector's work.
				i, cpu0 := 0, processCPU(b)
				for b.Loop() {
					decide(agents[i%n])
					i++
				}
				perReconcile[n] = float64(processCPU(b)-cpu0) / float64(b.N) / 1e3
				b.ReportMetric(perReconcile[n], "cpu-µs/reconcile")
				lo, hi := sizes[0], sizes[len(sizes)-1]
				if n != hi || perReconcile[lo] <= 0 {
					return
				}
				ratio := perReconcile[n] / perReconcile[lo]
				b.ReportMetric(ratio, "ratio-to-smallest")
				b.Logf("%s: %.2f µs of CPU per reconcile at %d Agents, %.2f µs at %d: ratio %.2f; %s", path, perReconcile[lo], lo, perReconcile[n], n, ratio, hostload.Label())
				if path == "ranked" && ratio > 1.5 {
					b.Errorf("the Tenant limit costs a reconcile %.2f× more at %d Agents than at %d (want ≤ 1.5×)", ratio, n, lo)
				}
			})
		}
	}
}

// BenchmarkAgentCountsEvents is what the ordered index costs the informer's event handler: per
// op, the oldest Agent of a namespace of n is deleted (the worst place: every pointer after it
// moves) and a new newest one added (appended), as a rolling replacement does.
func BenchmarkAgentCountsEvents(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			counts := syncedCounts()
			at := func(i int) *a2av1.Agent {
				return &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("agent-%07d", i), Namespace: "team-a",
					UID: types.UID(fmt.Sprint(i)), CreationTimestamp: metav1.NewTime(time.Unix(1_700_000_000+int64(i/50), 0))}}
			}
			live := make([]*a2av1.Agent, 0, n)
			for i := range n {
				live = append(live, at(i))
				counts.OnAdd(live[i], true)
			}
			next := n
			for b.Loop() {
				counts.OnDelete(live[0])
				live = append(live[1:], at(next))
				counts.OnAdd(live[len(live)-1], false)
				next++
			}
			if got, _ := counts.AgentCount("team-a"); got != n {
				b.Fatalf("%d Agents counted, want %d", got, n)
			}
		})
	}
}

// processCPU is the CPU time this process has used (user and system), in ns.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
