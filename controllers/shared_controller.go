package controllers

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// indexAgentGated marks Agents whose status has a delivery topic (the conversation service stands
// in front of them), the members of the gates role.
const indexAgentGated = "a2a.fleet.dev/gated"

// inclusion is whether a shared object holds an Agent's entries.
type inclusion int

const (
	inclusionUnknown inclusion = iota // the object was not applied since the operator started
	inclusionYes
	inclusionNo
)

// SharedTracker connects the Agent controller and the shared-object controller: it records, per
// shared object, the entries of each Agent as last applied to the broker, lets an Agent ask
// whether its current entries are in (the honest ACLsSynced), and carries the wake-ups both ways
// (an Agent pokes its shared objects; a shared object wakes the Agents whose entries changed).
type SharedTracker struct {
	mu      sync.Mutex
	applied map[registration.SharedKey]map[types.UID]trackedEntry
	// pokes wakes shared objects, wake wakes Agents (controller-runtime channel sources).
	pokes chan event.GenericEvent
	wake  chan event.GenericEvent
}

type trackedEntry struct {
	digest          string
	namespace, name string
}

// NewSharedTracker returns an empty tracker.
func NewSharedTracker() *SharedTracker {
	return &SharedTracker{
		applied: map[registration.SharedKey]map[types.UID]trackedEntry{},
		pokes:   make(chan event.GenericEvent, 1024),
		wake:    make(chan event.GenericEvent, 1024),
	}
}

// entriesDigest identifies an Agent's entries in a shared object: their exact text (a few short
// topics), so that comparing two needs no encoding and cannot collide.
func entriesDigest(acls []acl.ACL) string {
	if len(acls) == 0 {
		return ""
	}
	var b strings.Builder
	for _, a := range acls {
		b.WriteString(string(a.Type))
		b.WriteByte(' ')
		b.WriteString(a.Topic)
		b.WriteByte(' ')
		b.WriteString(strconv.Itoa(a.Priority))
		b.WriteByte(' ')
		b.WriteString(strconv.FormatBool(a.Allow))
		b.WriteByte('\n')
	}
	return b.String()
}

// Includes reports whether shared object k, as last applied, holds exactly want for the Agent.
func (t *SharedTracker) Includes(k registration.SharedKey, uid types.UID, want []acl.ACL) inclusion {
	if t == nil {
		return inclusionYes
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	entries, applied := t.applied[k]
	d := entriesDigest(want)
	switch {
	case !applied && d == "" && k.Kind != registration.SharedOrg:
		// Nothing to wait for. An org's role is the exception: it also carries the org-wide
		// discovery grant every member reads cards with, so a member waits for its first apply
		// even when it puts nothing of its own into it.
		return inclusionYes
	case !applied:
		return inclusionUnknown
	case entries[uid].digest == d:
		return inclusionYes
	}
	return inclusionNo
}

// Poke wakes the shared objects keys (deduplicated by their workqueue).
func (t *SharedTracker) Poke(ctx context.Context, keys ...registration.SharedKey) {
	if t == nil {
		return
	}
	for _, k := range keys {
		obj := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: k.String()}}
		select {
		case t.pokes <- event.GenericEvent{Object: obj}:
		case <-ctx.Done():
			return
		}
	}
}

// record stores what was applied for k and returns the Agents whose entries changed.
func (t *SharedTracker) record(k registration.SharedKey, now map[types.UID]trackedEntry) []trackedEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	before, appliedBefore := t.applied[k]
	var changed []trackedEntry
	for uid, e := range now {
		// A first apply wakes every member: those with nothing of their own in it may be
		// waiting for the object's base content (see Includes).
		if !appliedBefore || before[uid].digest != e.digest {
			changed = append(changed, e)
		}
	}
	for uid, e := range before {
		if _, still := now[uid]; !still {
			changed = append(changed, e)
		}
	}
	t.applied[k] = now
	return changed
}

func (t *SharedTracker) wakeAgents(ctx context.Context, agents []trackedEntry) {
	for _, e := range agents {
		obj := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: e.name}}
		select {
		case t.wake <- event.GenericEvent{Object: obj}:
		case <-ctx.Done():
			return
		}
	}
}

// agentWakeups is the source that lets the shared objects wake Agents.
func (t *SharedTracker) agentWakeups() source.Source {
	return source.Channel(t.wake, &handler.EnqueueRequestForObject{})
}

// SharedReconciler keeps the shared broker objects (each unit's and org's role and group, the
// conversation service's gates role) equal to what the live Agents in them need, computed from
// the cache. Its workqueue deduplicates keys, and each key is applied at most once per
// sharedSpacing of its last apply, so a rollout of n Agents into one unit applies the unit's role
// a bounded number of times per second, not n times, whatever the size of the unit.
type SharedReconciler struct {
	Client    client.Client
	Registrar Registrar
	Tracker   *SharedTracker
	Gating    bool
	Resync    time.Duration

	paceMu sync.Mutex
	pace   map[registration.SharedKey]appliedPace
}

// appliedPace is when a shared object was last applied and how long that took.
type appliedPace struct {
	end  time.Time
	took time.Duration
}

// Pacing of shared applies: an apply is O(members) (the role's whole ACL list, sent by
// modifyRole: the only change that disconnects nobody), so applying once per Agent of a rollout
// would be quadratic. The next apply of a key waits sharedSpacingFactor times as long as the last
// one took (at most a ninth of the time goes to one key however large it grows), at least
// sharedMinSpacing and at most sharedMaxSpacing; changes that arrive meanwhile are folded into it.
// An Agent waits for its shared objects at most one spacing plus one apply (ACLsSynced says so
// meanwhile); a change after a quiet period is applied at once.
const (
	sharedSpacingFactor = 8
	sharedMinSpacing    = 250 * time.Millisecond
	sharedMaxSpacing    = 5 * time.Second
	// sharedRaceRetry is how soon a shared key is observed again after another writer created
	// its role under our createRole (acl.OnlyLostContent).
	sharedRaceRetry = 50 * time.Millisecond
)

// tooSoon says how long key must still wait before its next apply (0: apply now).
func (r *SharedReconciler) tooSoon(key registration.SharedKey, now time.Time) time.Duration {
	r.paceMu.Lock()
	defer r.paceMu.Unlock()
	p, ok := r.pace[key]
	if !ok {
		return 0
	}
	spacing := min(max(sharedSpacingFactor*p.took, sharedMinSpacing), sharedMaxSpacing)
	return max(p.end.Add(spacing).Sub(now), 0)
}

func (r *SharedReconciler) applied(key registration.SharedKey, start, end time.Time) {
	r.paceMu.Lock()
	defer r.paceMu.Unlock()
	if r.pace == nil {
		r.pace = map[registration.SharedKey]appliedPace{}
	}
	r.pace[key] = appliedPace{end: end, took: end.Sub(start)}
}

// Reconcile applies one shared object.
func (r *SharedReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	key, err := registration.ParseSharedKey(req.Name)
	if err != nil {
		return ctrl.Result{}, reconcile.TerminalError(err)
	}
	if key.Kind == registration.SharedGates && !r.Gating {
		return ctrl.Result{}, nil
	}
	start := time.Now()
	if wait := r.tooSoon(key, start); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	var candidates a2av1.AgentList
	var opts []client.ListOption
	switch key.Kind {
	case registration.SharedUnit:
		opts = append(opts, client.MatchingFields{identity.IndexAgentUnit: key.Org + "/" + key.Unit})
	case registration.SharedOrg:
		opts = append(opts, client.MatchingFields{identity.IndexAgentOrg: key.Org})
	default:
		opts = append(opts, client.MatchingFields{indexAgentGated: "true"})
	}
	// Read-only use of cached objects: no deep copies of the whole unit or org.
	opts = append(opts, client.UnsafeDisableDeepCopy)
	if err := r.Client.List(ctx, &candidates, opts...); err != nil {
		return ctrl.Result{}, fmt.Errorf("list agents of %s: %w", key, err)
	}
	view, err := (&tenancy.Authorizer{Reader: r.Client}).View(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	if key.Kind != registration.SharedGates {
		// Every claimant of a client ID {org}/{unit}/{agent} is in its unit and its org: the holders
		// of the whole unit or org are decided from this one list.
		view.PreloadClaimants(candidates.Items)
	}
	var members []registration.Member
	entries := map[types.UID]trackedEntry{}
	for i := range candidates.Items {
		a := &candidates.Items[i]
		m, live, err := registration.MemberOf(ctx, view, a)
		if err != nil {
			return ctrl.Result{}, err
		}
		if !live {
			continue
		}
		members = append(members, m)
		// An org's members are all tracked: its role's base content concerns each (see Includes).
		if d := entriesDigest(registration.Contribution(key, m)); d != "" || key.Kind == registration.SharedOrg {
			entries[a.UID] = trackedEntry{digest: d, namespace: a.Namespace, name: a.Name}
		}
	}
	if err := r.Registrar.ApplyShared(ctx, key, members); acl.OnlyLostContent(err) {
		// Another writer created the role between our observation and our createRole: the next
		// observation sees it and modifies it. Expected, so no error (and no ERROR log).
		logf.FromContext(ctx).V(1).Info("shared role created by another writer meanwhile; observing again", "key", key.String())
		return ctrl.Result{RequeueAfter: sharedRaceRetry}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	r.applied(key, start, time.Now())
	r.Tracker.wakeAgents(ctx, r.Tracker.record(key, entries))
	logf.FromContext(ctx).V(1).Info("applied shared ACLs", "key", key.String(), "members", len(members), "entries", len(entries))
	// Drift repair, like the Agents' own objects.
	return ctrl.Result{RequeueAfter: jitter(r.Resync)}, nil
}

// SetupWithManager registers the controller: woken by Agents (their pokes, and every create,
// delete, spec or gating change) and by the gates key at start.
func (r *SharedReconciler) SetupWithManager(mgr ctrl.Manager, maxConcurrent int) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("sharedacls").
		WatchesRawSource(source.Channel(r.Tracker.pokes, &handler.EnqueueRequestForObject{})).
		WatchesRawSource(source.Func(func(ctx context.Context, q workqueueOf) error {
			if r.Gating {
				q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: registration.GatesKey.String()}})
			}
			return nil
		})).
		Watches(&a2av1.Agent{}, handler.TypedFuncs[client.Object, reconcile.Request]{
			CreateFunc: func(_ context.Context, e event.TypedCreateEvent[client.Object], q workqueueOf) {
				r.enqueueKeys(q, nil, e.Object)
			},
			UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[client.Object], q workqueueOf) {
				r.enqueueKeys(q, e.ObjectOld, e.ObjectNew)
			},
			DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[client.Object], q workqueueOf) {
				r.enqueueKeys(q, nil, e.Object)
			},
		}).
		WithOptions(controller.Options{MaxConcurrentReconciles: maxConcurrent}).
		Complete(r)
}

// enqueueKeys wakes the shared objects an Agent event can change.
func (r *SharedReconciler) enqueueKeys(q workqueueOf, oldObj, newObj client.Object) {
	a, ok := newObj.(*a2av1.Agent)
	if !ok {
		return
	}
	if old, ok := oldObj.(*a2av1.Agent); ok {
		if old.Generation == a.Generation && old.DeletionTimestamp.Equal(a.DeletionTimestamp) && gated(old) == gated(a) {
			return
		}
	}
	for _, k := range registration.KeysOf(identity.Of(a), r.Gating) {
		if k.Kind == registration.SharedGates && !gated(a) && (oldObj == nil || !gated(oldObj.(*a2av1.Agent))) {
			continue
		}
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: k.String()}})
	}
}

func gated(a *a2av1.Agent) bool { return a.Status.Topics != nil && a.Status.Topics.Delivery != "" }
