package controllers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/policy"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// MaxStatusListItems bounds the lists in ConversationPolicy status so that a policy selecting a
// large fleet never produces an object near etcd's size limit; the counts stay exact.
const MaxStatusListItems = 50

// Event reasons emitted on ConversationPolicies.
const (
	EventPolicyConflict = "PolicyConflict"
	EventPolicyResolved = "PolicyResolved"
	EventInvalidPolicy  = "InvalidSelector"
)

// ConversationPolicyReconciler reconciles ConversationPolicies: which Agents each selects, and
// where two policies select the same Agent.
type ConversationPolicyReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
}

// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=conversationpolicies,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=conversationpolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=agents,verbs=get;list;watch

// Reconcile recomputes a policy's selection and conflicts and writes them to status.
func (r *ConversationPolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	p := &a2av1.ConversationPolicy{}
	if err := r.Client.Get(ctx, req.NamespacedName, p); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !p.DeletionTimestamp.IsZero() {
		// Nothing outside the API server to clean up; Agents re-resolve through their own watch.
		return ctrl.Result{}, nil
	}
	before := p.DeepCopy()
	p.Status.ObservedGeneration = p.Generation
	defer func() {
		// Status once, at the end, only when it changed; Events for the transitions it made.
		patched, err := patchStatus(ctx, r.Client, before, p, func(p *a2av1.ConversationPolicy) any { return p.Status })
		if patched {
			r.emitTransitions(before, p)
		}
		retErr = errors.Join(retErr, err)
	}()

	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.AgentSelector)
	if err != nil {
		p.Status.MatchedAgents, p.Status.AppliedAgents = 0, 0
		p.Status.MatchedAgentNames, p.Status.Conflicts = nil, nil
		setCondition(&p.Status.Conditions, p.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonInvalidSelector,
			fmt.Sprintf("agentSelector is invalid: %v", err))
		meta.RemoveStatusCondition(&p.Status.Conditions, a2av1.ConditionConflicted)
		r.Recorder.Eventf(p, nil, corev1.EventTypeWarning, EventInvalidPolicy, "Resolve", "agentSelector is invalid: %v", err)
		// A spec change fixes this, and a spec change triggers a reconcile: no requeue.
		return ctrl.Result{}, nil
	}

	var agents a2av1.AgentList
	if err := r.Client.List(ctx, &agents, client.InNamespace(p.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list selected agents: %w", err)
	}
	var policies a2av1.ConversationPolicyList
	if err := r.Client.List(ctx, &policies, client.InNamespace(p.Namespace)); err != nil {
		return ctrl.Result{}, fmt.Errorf("list conversation policies: %w", err)
	}

	summary := summarize(p, agents.Items, policies.Items)
	p.Status.MatchedAgents = int32(len(summary.matched))
	p.Status.AppliedAgents = summary.applied
	p.Status.MatchedAgentNames = truncate(summary.matched)
	p.Status.Conflicts = summary.conflicts
	if len(p.Status.Conflicts) > MaxStatusListItems {
		p.Status.Conflicts = p.Status.Conflicts[:MaxStatusListItems]
	}
	if len(summary.matched) == 0 {
		// Valid, but it governs nothing: almost always a label typo. Ready=False makes it show in
		// `kubectl get cpol`, and emitTransitions adds a Warning event.
		setCondition(&p.Status.Conditions, p.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonNoAgentsSelected,
			fmt.Sprintf("agentSelector %s matches no Agent in namespace %s: this policy governs nothing", selectorText(sel), p.Namespace))
	} else {
		setCondition(&p.Status.Conditions, p.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonSelectorResolved,
			fmt.Sprintf("selects %d Agents and applies to %d", len(summary.matched), summary.applied))
	}
	if n := len(summary.conflicts); n > 0 {
		setCondition(&p.Status.Conditions, p.Generation, a2av1.ConditionConflicted, metav1.ConditionTrue, a2av1.ReasonOverlappingPolicies,
			fmt.Sprintf("%d selected Agents are also selected by %v; precedence: highest priority, then oldest, then name",
				n, summary.others))
	} else {
		setCondition(&p.Status.Conditions, p.Generation, a2av1.ConditionConflicted, metav1.ConditionFalse, a2av1.ReasonNoOverlap,
			"no other policy selects these Agents")
	}

	if err := r.withinLimits(ctx, p); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// withinLimits sets WithinLimits: whether the policy asks for no more than its Tenant's ceilings
// (limits.conversationPolicy, or the defaults). The conversation service applies the ceilings
// either way (conversation.Policy.Within, the same function): this condition says so.
func (r *ConversationPolicyReconciler) withinLimits(ctx context.Context, p *a2av1.ConversationPolicy) error {
	pol, err := conversation.NewPolicy(&p.Spec)
	if err != nil {
		// Admission refuses such a spec; the service runs it on the defaults.
		setCondition(&p.Status.Conditions, p.Generation, a2av1.ConditionWithinLimits, metav1.ConditionFalse, a2av1.ReasonTenantLimitExceeded, err.Error())
		return nil
	}
	view, err := (&tenancy.Authorizer{Reader: r.Client}).View(ctx)
	if err != nil {
		return err
	}
	limits, tenant, err := view.LimitsFor(ctx, p.Namespace)
	if err != nil {
		return err
	}
	who := "the default ceilings (no Tenant binds the namespace)"
	if tenant != nil {
		who = "Tenant " + tenant.Name + "'s ceilings (limits.conversationPolicy)"
	}
	if _, over := pol.Within(limits.ConversationPolicy); len(over) > 0 {
		setCondition(&p.Status.Conditions, p.Generation, a2av1.ConditionWithinLimits, metav1.ConditionFalse, a2av1.ReasonTenantLimitExceeded,
			fmt.Sprintf("%s; the ceilings apply instead (%s)", strings.Join(over, "; "), who))
		return nil
	}
	setCondition(&p.Status.Conditions, p.Generation, a2av1.ConditionWithinLimits, metav1.ConditionTrue, a2av1.ReasonWithinLimits,
		"within "+who+"; limits left unlimited take the ceilings")
	return nil
}

type selectionSummary struct {
	matched   []string
	applied   int32
	conflicts []a2av1.PolicyConflict
	// others are the other policies involved in conflicts, sorted.
	others []string
}

// summarize works out, for each Agent that p selects, whether p applies and which policies compete.
func summarize(p *a2av1.ConversationPolicy, selected []a2av1.Agent, policies []a2av1.ConversationPolicy) selectionSummary {
	var s selectionSummary
	others := map[string]bool{}
	for i := range selected {
		agent := &selected[i]
		s.matched = append(s.matched, agent.Name)
		matching := policy.Matching(policies, agent.Labels)
		if len(matching) > 0 && matching[0].Name == p.Name {
			s.applied++
		}
		if len(matching) > 1 {
			names := policy.Names(matching)
			s.conflicts = append(s.conflicts, a2av1.PolicyConflict{Agent: agent.Name, Policies: names, AppliedPolicy: names[0]})
			for _, n := range names {
				if n != p.Name {
					others[n] = true
				}
			}
		}
	}
	sort.Strings(s.matched)
	sort.Slice(s.conflicts, func(i, j int) bool { return s.conflicts[i].Agent < s.conflicts[j].Agent })
	for n := range others {
		s.others = append(s.others, n)
	}
	sort.Strings(s.others)
	return s
}

func truncate(names []string) []string {
	if len(names) > MaxStatusListItems {
		return names[:MaxStatusListItems]
	}
	return names
}

// selectorText shows a selector as kubectl does; the empty one selects everything.
func selectorText(sel labels.Selector) string {
	if sel.Empty() {
		return "{} (every Agent)"
	}
	return "'" + sel.String() + "'"
}

func (r *ConversationPolicyReconciler) emitTransitions(before, after *a2av1.ConversationPolicy) {
	wasReady := meta.FindStatusCondition(before.Status.Conditions, a2av1.ConditionReady)
	nowReady := meta.FindStatusCondition(after.Status.Conditions, a2av1.ConditionReady)
	if nowReady != nil && nowReady.Reason == a2av1.ReasonNoAgentsSelected &&
		(wasReady == nil || wasReady.Reason != nowReady.Reason || wasReady.Message != nowReady.Message) {
		r.Recorder.Eventf(after, nil, corev1.EventTypeWarning, a2av1.ReasonNoAgentsSelected, "Resolve", "%s", nowReady.Message)
	}
	was := meta.FindStatusCondition(before.Status.Conditions, a2av1.ConditionConflicted)
	now := meta.FindStatusCondition(after.Status.Conditions, a2av1.ConditionConflicted)
	if now != nil && now.Status == metav1.ConditionTrue && (was == nil || was.Status != metav1.ConditionTrue || was.Message != now.Message) {
		r.Recorder.Eventf(after, nil, corev1.EventTypeWarning, EventPolicyConflict, "Resolve", "%s", now.Message)
	}
	if now != nil && now.Status == metav1.ConditionFalse && was != nil && was.Status == metav1.ConditionTrue {
		r.Recorder.Eventf(after, nil, corev1.EventTypeNormal, EventPolicyResolved, "Resolve", "%s", now.Message)
	}
}

// SetupWithManager registers the controller and its watches.
func (r *ConversationPolicyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&a2av1.ConversationPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Conflicts involve every policy of a namespace: any policy change re-evaluates its neighbours.
		Watches(&a2av1.ConversationPolicy{}, handler.EnqueueRequestsFromMapFunc(r.policiesInNamespace),
			builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, createOrDeletePredicate()))).
		// An Agent appearing, vanishing or changing labels can change any policy's selection.
		Watches(&a2av1.Agent{}, handler.EnqueueRequestsFromMapFunc(r.policiesInNamespace),
			builder.WithPredicates(predicate.LabelChangedPredicate{})).
		// Ceilings come from the Tenant that binds the namespace (which its labels may decide).
		Watches(&a2av1.Tenant{}, handler.EnqueueRequestsFromMapFunc(r.allPolicies),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.policiesInThisNamespace),
			builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Named("conversationpolicy").
		Complete(r)
}

// createOrDeletePredicate passes only the appearance and disappearance of objects.
func createOrDeletePredicate() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return true },
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

func (r *ConversationPolicyReconciler) policiesInNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.policiesIn(ctx, client.InNamespace(obj.GetNamespace()))
}

// policiesInThisNamespace maps a Namespace to its policies.
func (r *ConversationPolicyReconciler) policiesInThisNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.policiesIn(ctx, client.InNamespace(obj.GetName()))
}

// allPolicies maps a Tenant to every policy (Tenants change rarely, and may bind any namespace).
func (r *ConversationPolicyReconciler) allPolicies(ctx context.Context, _ client.Object) []reconcile.Request {
	return r.policiesIn(ctx)
}

func (r *ConversationPolicyReconciler) policiesIn(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	var policies a2av1.ConversationPolicyList
	if err := r.Client.List(ctx, &policies, opts...); err != nil {
		logf.FromContext(ctx).Error(err, "list conversation policies")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(policies.Items))
	for _, p := range policies.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
	}
	return reqs
}
