package controllers

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// Event reasons emitted on Tenants.
const (
	EventTenantConflict = "TenantConflict"
)

// TenantReconciler reports what each Tenant binds: whether it is in effect (no older Tenant owns
// its org), the namespaces it binds, and those it loses to older Tenants.
type TenantReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
}

// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=tenants,verbs=get;list;watch
// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=tenants/status,verbs=get;update;patch

// Reconcile recomputes one Tenant's status.
func (r *TenantReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	t := &a2av1.Tenant{}
	if err := r.Client.Get(ctx, req.NamespacedName, t); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var tenants a2av1.TenantList
	if err := r.Client.List(ctx, &tenants); err != nil {
		return ctrl.Result{}, fmt.Errorf("list tenants: %w", err)
	}
	var namespaces corev1.NamespaceList
	if err := r.Client.List(ctx, &namespaces); err != nil {
		return ctrl.Result{}, fmt.Errorf("list namespaces: %w", err)
	}
	b := tenancy.NewBindings(tenants.Items)
	rep := b.ReportFor(t, namespaces.Items)

	before := t.DeepCopy()
	t.Status.ObservedGeneration = t.Generation
	t.Status.BoundNamespaces = int32(len(rep.Bound))
	t.Status.Namespaces = truncate(rep.Bound)
	t.Status.ConflictingNamespaces = truncate(rep.Conflicting)
	set := func(condType string, status metav1.ConditionStatus, reason, msg string) {
		setCondition(&t.Status.Conditions, t.Generation, condType, status, reason, msg)
	}
	switch {
	case !rep.Effective:
		set(a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonOrgConflict,
			fmt.Sprintf("org %s belongs to the older Tenant %s; this Tenant binds nothing", t.Spec.OrgID, rep.OrgHolder))
		set(a2av1.ConditionConflicted, metav1.ConditionTrue, a2av1.ReasonOrgConflict,
			fmt.Sprintf("Tenant %s claims org %s too and is older", rep.OrgHolder, t.Spec.OrgID))
	case b.SelectorError(t) != nil:
		set(a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonInvalidNamespaceSelector,
			fmt.Sprintf("namespaceSelector selects nothing: %v; the %d listed namespaces are bound", b.SelectorError(t), len(rep.Bound)))
	default:
		set(a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonTenantBound,
			fmt.Sprintf("binds %d namespaces to org %s", len(rep.Bound), t.Spec.OrgID))
	}
	if rep.Effective {
		if len(rep.Conflicting) > 0 {
			set(a2av1.ConditionConflicted, metav1.ConditionTrue, a2av1.ReasonNamespaceConflict,
				fmt.Sprintf("namespaces %s are bound by the older Tenants %s", strings.Join(truncate(rep.Conflicting), ", "), strings.Join(rep.ConflictsWith, ", ")))
		} else {
			set(a2av1.ConditionConflicted, metav1.ConditionFalse, a2av1.ReasonNoOverlap, "no older Tenant claims its org or namespaces")
		}
	}
	patched, err := patchStatus(ctx, r.Client, before, t, func(t *a2av1.Tenant) any { return t.Status })
	if !patched {
		return ctrl.Result{}, err
	}
	was := meta.FindStatusCondition(before.Status.Conditions, a2av1.ConditionConflicted)
	now := meta.FindStatusCondition(t.Status.Conditions, a2av1.ConditionConflicted)
	if now.Status == metav1.ConditionTrue && (was == nil || was.Message != now.Message) {
		r.Recorder.Eventf(t, nil, corev1.EventTypeWarning, EventTenantConflict, "Resolve", "%s", now.Message)
	}
	return ctrl.Result{}, nil
}

// SetupWithManager registers the controller: every Tenant is re-evaluated when any Tenant or any
// namespace's labels change (conflicts involve neighbours; there are few Tenants).
func (r *TenantReconciler) SetupWithManager(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var tenants a2av1.TenantList
		if err := r.Client.List(ctx, &tenants); err != nil {
			logf.FromContext(ctx).Error(err, "list tenants")
			return nil
		}
		out := make([]reconcile.Request, 0, len(tenants.Items))
		for _, t := range tenants.Items {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: t.Name}})
		}
		return out
	})
	return ctrl.NewControllerManagedBy(mgr).
		For(&a2av1.Tenant{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&a2av1.Tenant{}, all, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, createOrDeletePredicate()))).
		Watches(&corev1.Namespace{}, all, builder.WithPredicates(predicate.Or[client.Object](predicate.LabelChangedPredicate{}, createOrDeletePredicate()))).
		Named("tenant").
		Complete(r)
}
