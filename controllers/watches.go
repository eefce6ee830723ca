package controllers

import (
	"context"
	"maps"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

type workqueueOf = workqueue.TypedRateLimitingInterface[reconcile.Request]

// agentEvents maps the events of the objects an Agent's outcome depends on to exactly the Agents
// whose outcome they can change. It only reads the cache.
type agentEvents struct {
	reader client.Reader
}

// SetupWithManager registers the Agent controller and its watches. Every watch maps an event to
// exactly the Agents whose outcome it can change.
func (r *AgentReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.buildUnits()
	e := &agentEvents{reader: r.Client}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&a2av1.Agent{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		// A policy change can move Agents in or out of its selector.
		Watches(&a2av1.ConversationPolicy{}, handler.EnqueueRequestsFromMapFunc(e.agentsForPolicy)).
		// Claimants of one client ID: a newcomer may outrank an Agent (same-second creation); once
		// the holder is gone, or stops being permitted, or has removed its broker state, the next
		// Agent in line takes over.
		Watches(&a2av1.Agent{}, handler.EnqueueRequestsFromMapFunc(e.agentsSharingIdentity),
			builder.WithPredicates(identityHolderChangePredicate())).
		// Pool ownership follows the oldest member: members appearing or leaving move it.
		Watches(&a2av1.Agent{}, handler.EnqueueRequestsFromMapFunc(e.poolMembers), builder.WithPredicates(createOrDeletePredicate())).
		// Tenancy: which namespace may claim which org, unit and pool.
		Watches(&a2av1.Tenant{}, e.tenantHandler()).
		// Consent to join pools (consent to be selected as callers is the caller graph's).
		Watches(&a2av1.AgentGrant{}, e.grantHandler()).
		// Namespace labels drive Tenant selectors and Pod Security levels (caller namespace
		// selectors: the caller graph).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(e.agentsForNamespace), builder.WithPredicates(
			predicate.Or[client.Object](predicate.LabelChangedPredicate{}, createOrDeletePredicate()))).
		// Only a deletion or a change of the data of a credentials Secret concerns the Agent (not
		// the operator's own writes of it, which it made knowingly).
		Owns(&corev1.Secret{}, builder.WithPredicates(secretChangePredicate())).
		// Only availability changes (and edits by others) of a workload Deployment.
		Owns(&appsv1.Deployment{}, builder.WithPredicates(deploymentChangePredicate())).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.MaxConcurrent}).
		Named("agent")
	if r.Graph != nil {
		// Caller rules, namespace labels and consent tie Agents together: a rule's owner and the
		// Agents it selects both change. The graph says which, once it has applied the change (so
		// their reconciles read it).
		b = b.WatchesRawSource(callerGraphSource(r.Graph))
	}
	// A deleted Agent frees a place under its Tenant's maxAgents: the Agents waiting for one look
	// again at once, once the limit's decision can see the place free (the counts it ranks by
	// have applied the deletion).
	if r.Counts != nil {
		b = b.WatchesRawSource(agentLimitSource(r.Counts, e))
	} else {
		b = b.Watches(&a2av1.Agent{}, handler.EnqueueRequestsFromMapFunc(e.agentsOverTheLimit), builder.WithPredicates(deletedPredicate()))
	}
	if r.Shared != nil {
		b = b.WatchesRawSource(r.Shared.agentWakeups())
	}
	if r.Resyncs != nil {
		b = b.WatchesRawSource(r.Resyncs.source())
	}
	if r.PresenceEvents != nil {
		b = b.WatchesRawSource(presenceSource(r.PresenceEvents))
	}
	return b.Complete(r)
}

// deletedPredicate passes the deletion of an object (its removal from the cache).
func deletedPredicate() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// agentsOverTheLimit are the Agents refused for their Tenant's maxAgents (usually none).
func (e *agentEvents) agentsOverTheLimit(ctx context.Context, _ client.Object) []reconcile.Request {
	var over a2av1.AgentList
	if err := e.reader.List(ctx, &over, client.MatchingFields{indexAgentOverLimit: "true"}, client.UnsafeDisableDeepCopy); err != nil {
		logf.FromContext(ctx).Error(err, "list agents over the agent limit")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(over.Items))
	for i := range over.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&over.Items[i])})
	}
	return reqs
}

// identityHolderChangePredicate passes what can hand an identity from one claimant to another:
// creation, deletion (start and end), and a change of whether the Agent is permitted or
// registered.
func identityHolderChangePredicate() predicate.Funcs {
	p := createOrDeletePredicate()
	p.UpdateFunc = func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*a2av1.Agent)
		n, ok2 := e.ObjectNew.(*a2av1.Agent)
		if !ok1 || !ok2 {
			return false
		}
		for _, t := range []string{a2av1.ConditionIdentityPermitted, a2av1.ConditionRegistered} {
			if meta.IsStatusConditionTrue(o.Status.Conditions, t) != meta.IsStatusConditionTrue(n.Status.Conditions, t) {
				return true
			}
		}
		return !o.DeletionTimestamp.Equal(n.DeletionTimestamp)
	}
	return p
}

func secretChangePredicate() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*corev1.Secret)
			n, ok2 := e.ObjectNew.(*corev1.Secret)
			return ok1 && ok2 && !maps.EqualFunc(o.Data, n.Data, func(a, b []byte) bool { return string(a) == string(b) })
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// deploymentChangePredicate passes a change of availability (condition or replica counts), of the
// rollout's progress (observed generation, updated replicas), and a new generation (the spec was changed, possibly by someone else: the operator re-applies its
// fields), and deletions.
func deploymentChangePredicate() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*appsv1.Deployment)
			n, ok2 := e.ObjectNew.(*appsv1.Deployment)
			if !ok1 || !ok2 {
				return false
			}
			return o.Generation != n.Generation || available(o) != available(n) ||
				o.Status.AvailableReplicas != n.Status.AvailableReplicas ||
				// A staged credential rotation waits for the new template's first pod (rolledOut).
				o.Status.UpdatedReplicas != n.Status.UpdatedReplicas || o.Status.ObservedGeneration != n.Status.ObservedGeneration
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

func available(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// requests collects deduplicated reconcile requests.
type requests struct {
	seen map[types.NamespacedName]bool
	out  []reconcile.Request
}

func (q *requests) add(ns, name string) {
	key := types.NamespacedName{Namespace: ns, Name: name}
	if q.seen == nil {
		q.seen = map[types.NamespacedName]bool{}
	}
	if !q.seen[key] {
		q.seen[key] = true
		q.out = append(q.out, reconcile.Request{NamespacedName: key})
	}
}

func (q *requests) addAll(items []a2av1.Agent) {
	for i := range items {
		q.add(items[i].Namespace, items[i].Name)
	}
}

// agentsForPolicy maps a policy event to the Agents it selects now and those it governed before.
func (e *agentEvents) agentsForPolicy(ctx context.Context, obj client.Object) []reconcile.Request {
	p, ok := obj.(*a2av1.ConversationPolicy)
	if !ok {
		return nil
	}
	log := logf.FromContext(ctx)
	var q requests
	var governed a2av1.AgentList
	if err := e.reader.List(ctx, &governed, client.InNamespace(p.Namespace),
		client.MatchingFields{identity.IndexAgentPolicy: p.Name}); err != nil {
		log.Error(err, "list agents governed by policy", "policy", p.Name)
	}
	q.addAll(governed.Items)
	if sel, err := metav1.LabelSelectorAsSelector(&p.Spec.AgentSelector); err == nil {
		var selected a2av1.AgentList
		if err := e.reader.List(ctx, &selected, client.InNamespace(p.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			log.Error(err, "list agents selected by policy", "policy", p.Name)
		}
		q.addAll(selected.Items)
	}
	return q.out
}

func (e *agentEvents) agentsSharingIdentity(ctx context.Context, obj client.Object) []reconcile.Request {
	a, ok := obj.(*a2av1.Agent)
	if !ok {
		return nil
	}
	var same a2av1.AgentList
	if err := e.reader.List(ctx, &same, client.MatchingFields{identity.IndexAgentClientID: identity.Of(a).ClientID()}, client.UnsafeDisableDeepCopy); err != nil {
		logf.FromContext(ctx).Error(err, "list agents sharing a client ID")
		return nil
	}
	var q requests
	for _, o := range same.Items {
		if o.UID != a.UID {
			q.add(o.Namespace, o.Name)
		}
	}
	return q.out
}

// poolMembers maps a pool member's appearance or disappearance to the other members: the owner
// of the pool (its oldest member's namespace) may change.
func (e *agentEvents) poolMembers(ctx context.Context, obj client.Object) []reconcile.Request {
	a, ok := obj.(*a2av1.Agent)
	if !ok || a.Spec.PoolID == "" {
		return nil
	}
	var members a2av1.AgentList
	if err := e.reader.List(ctx, &members, client.MatchingFields{identity.IndexAgentPool: tenancy.PoolKey(a)}, client.UnsafeDisableDeepCopy); err != nil {
		logf.FromContext(ctx).Error(err, "list pool members")
		return nil
	}
	var q requests
	for _, m := range members.Items {
		if m.UID != a.UID {
			q.add(m.Namespace, m.Name)
		}
	}
	return q.out
}

// callerGraphSource enqueues the Agents whose caller relations a change touches, as the caller
// graph reports them after applying it: for an Agent (tenancy.CallerGraph.Upsert), the rules'
// owners that start or stop admitting it and the Agents its rules start or stop covering; for a
// Namespace's labels or an AgentGrant, the owners and callers of every relation it changed.
func callerGraphSource(g *tenancy.CallerGraph) source.Source {
	return source.Func(func(_ context.Context, q workqueueOf) error {
		g.Subscribe(func(keys []types.NamespacedName) {
			for _, k := range keys {
				q.Add(reconcile.Request{NamespacedName: k})
			}
		})
		return nil
	})
}

// agentLimitSource enqueues the Agents refused for their Tenant's maxAgents after each deletion
// counts have applied.
func agentLimitSource(counts *tenancy.AgentCounts, e *agentEvents) source.Source {
	return source.Func(func(ctx context.Context, q workqueueOf) error {
		counts.SubscribeDeletions(func(string) {
			for _, req := range e.agentsOverTheLimit(ctx, nil) {
				q.Add(req)
			}
		})
		return nil
	})
}

// tenantHandler maps a Tenant event to the Agents of every namespace whose binding it can change:
// the namespaces the old or new Tenant selects, those named like its org (the zero-config rule),
// and those of other Tenants of the same org (precedence).
func (e *agentEvents) tenantHandler() handler.TypedEventHandler[client.Object, reconcile.Request] {
	return specChangeHandler(func(ctx context.Context, objs []client.Object) []reconcile.Request {
		var tenants []a2av1.Tenant
		for _, o := range objs {
			if t, ok := o.(*a2av1.Tenant); ok {
				tenants = append(tenants, *t)
			}
		}
		return e.agentsForTenants(ctx, tenants)
	})
}

// specChangeHandler maps creations, deletions and spec changes (old and new object) of a kind to
// requests.
func specChangeHandler(mapper func(ctx context.Context, objs []client.Object) []reconcile.Request) handler.TypedEventHandler[client.Object, reconcile.Request] {
	enqueue := func(ctx context.Context, q workqueueOf, objs ...client.Object) {
		for _, req := range mapper(ctx, objs) {
			q.Add(req)
		}
	}
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[client.Object], q workqueueOf) {
			enqueue(ctx, q, e.Object)
		},
		UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueueOf) {
			if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() {
				enqueue(ctx, q, e.ObjectOld, e.ObjectNew)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[client.Object], q workqueueOf) {
			enqueue(ctx, q, e.Object)
		},
	}
}

func (e *agentEvents) agentsForTenants(ctx context.Context, changed []a2av1.Tenant) []reconcile.Request {
	log := logf.FromContext(ctx)
	var all a2av1.TenantList
	if err := e.reader.List(ctx, &all); err != nil {
		log.Error(err, "list tenants")
		return nil
	}
	orgs := map[string]bool{}
	for _, t := range changed {
		orgs[t.Spec.OrgID] = true
	}
	involved := slices.Clone(changed)
	for _, t := range all.Items {
		if orgs[t.Spec.OrgID] {
			involved = append(involved, t)
		}
	}
	b := tenancy.NewBindings(involved)
	var namespaces corev1.NamespaceList
	if err := e.reader.List(ctx, &namespaces); err != nil {
		log.Error(err, "list namespaces")
		return nil
	}
	var q requests
	for i := range namespaces.Items {
		ns := &namespaces.Items[i]
		hit := orgs[ns.Name]
		for j := range involved {
			hit = hit || b.Selects(&involved[j], ns)
		}
		if !hit {
			continue
		}
		q.addAll(e.agentsIn(ctx, ns.Name))
	}
	return q.out
}

// grantHandler maps an AgentGrant event (old and new spec) to the Agents whose ACLs depend on it.
func (e *agentEvents) grantHandler() handler.TypedEventHandler[client.Object, reconcile.Request] {
	return specChangeHandler(func(ctx context.Context, objs []client.Object) []reconcile.Request {
		var q requests
		for _, o := range objs {
			if g, ok := o.(*a2av1.AgentGrant); ok {
				e.agentsForGrant(ctx, g, &q)
			}
		}
		return q.out
	})
}

// agentsForGrant: for Pools, the from namespaces' pool members. Callers consent is the caller
// graph's: it reports the Agents whose callers or callees a grant changes (callerGraphSource).
func (e *agentEvents) agentsForGrant(ctx context.Context, g *a2av1.AgentGrant, q *requests) {
	if !slices.ContainsFunc(g.Spec.To, func(to a2av1.AgentGrantTo) bool { return to.Kind == a2av1.AgentGrantPools }) {
		return
	}
	for _, f := range g.Spec.From {
		for _, a := range e.agentsIn(ctx, f.Namespace) {
			if a.Spec.PoolID != "" {
				q.add(a.Namespace, a.Name)
			}
		}
	}
}

// agentsForNamespace maps a namespace's creation, deletion or relabelling to its own Agents
// (Tenant selectors, Pod Security level). The Agents whose caller namespace selectors start or
// stop covering its Agents are the caller graph's to report (callerGraphSource).
func (e *agentEvents) agentsForNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	var q requests
	q.addAll(e.agentsIn(ctx, obj.GetName()))
	// A namespace leaving a Tenant frees places under the Tenant's maxAgents.
	for _, r := range e.agentsOverTheLimit(ctx, obj) {
		q.add(r.Namespace, r.Name)
	}
	return q.out
}

// agentsIn lists the Agents of a namespace for an event mapping. A namespace the cache does not
// cover (an operator scoped to some namespaces) has none the operator manages.
func (e *agentEvents) agentsIn(ctx context.Context, ns string) []a2av1.Agent {
	var agents a2av1.AgentList
	if err := e.reader.List(ctx, &agents, client.InNamespace(ns)); err != nil {
		logf.FromContext(ctx).V(1).Info("cannot list agents for an event", "namespace", ns, "error", err.Error())
		return nil
	}
	return agents.Items
}
