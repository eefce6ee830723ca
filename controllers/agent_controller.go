package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/policy"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// AgentFinalizer guards the broker-side state of an Agent (client, roles, retained card, Secret):
// the Agent is only gone once that state is.
const AgentFinalizer = "a2a.fleet.dev/agent-cleanup"

// maxOverlappingPolicies matches the MaxItems of status.overlappingPolicies.
const maxOverlappingPolicies = 10

// Event reasons emitted on Agents.
const (
	EventPolicyApplied      = "PolicyApplied"
	EventPolicyRemoved      = "PolicyRemoved"
	EventIdentityConflict   = "IdentityConflict"
	EventRegistered         = "Registered"
	EventRegistrationFail   = "RegistrationFailed"
	EventUnregistered       = "Unregistered"
	EventReady              = "Ready"
	EventNotReady           = "NotReady"
	EventCredentialsRotated = "CredentialsRotated"
)

// Registrar makes the broker side of an Agent match its spec: credentials, ACLs and the retained
// agent card. The broker issue provides the implementation; without one the operator still
// resolves identities, topics and policies and reports the Agent as not registered.
type Registrar interface {
	// Register creates or updates everything the Agent needs on the broker. It must be idempotent.
	// creds.PasswordChanged says that the broker must be given creds.Password. It may record what
	// it published in agent.Status (the controller writes status afterwards).
	Register(ctx context.Context, agent *a2av1.Agent, creds registration.Credentials) error
	// Unregister removes everything Register created. Missing pieces are not an error.
	Unregister(ctx context.Context, agent *a2av1.Agent) error
}

// AgentReconciler reconciles Agents.
type AgentReconciler struct {
	client.Client
	// APIReader reads around the cache where a stale read would repeat a broker write.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Registrar is nil when the operator runs without a broker.
	Registrar Registrar
	// Resync is the period of the broker drift check for registered Agents.
	Resync time.Duration
	// WorkloadBrokerURL is the broker address injected into workloads (A2A_BROKER).
	WorkloadBrokerURL string
	// MaxConcurrent is the number of Agents reconciled in parallel.
	MaxConcurrent int
	// Gating puts the conversation service in front of every Agent a ConversationPolicy governs.
	Gating bool
}

// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=agents,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=agents/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=agents/finalizers,verbs=update
// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=conversationpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete

// Reconcile resolves an Agent's identity, topics and conversation policy, registers it on the broker
// when one is configured, and reports the outcome in status.
func (r *AgentReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)

	agent := &a2av1.Agent{}
	if err := r.Get(ctx, req.NamespacedName, agent); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	if !agent.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, agent)
	}

	if controllerutil.AddFinalizer(agent, AgentFinalizer) {
		if err := r.Update(ctx, agent); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}

	before := agent.DeepCopy()
	id := identity.Of(agent)
	agent.Status.AgentID = id.Agent
	agent.Status.ClientID = id.ClientID()
	agent.Status.Topics = &a2av1.AgentTopics{
		Request:     id.RequestTopic(),
		ReplyPrefix: id.Topic(a2amqtt.MethodReply),
		Discovery:   id.DiscoveryTopic(),
		Event:       id.EventTopic(),
	}
	if agent.Spec.PoolID != "" {
		agent.Status.Topics.Pool = a2amqtt.PoolRef{Org: id.Org, Unit: id.Unit, Pool: agent.Spec.PoolID}.RequestTopic()
	}

	if err := r.resolvePolicy(ctx, agent); err != nil {
		return ctrl.Result{}, err
	}
	if r.Gating && agent.Status.ConversationPolicy != "" {
		agent.Status.Topics.Delivery = identity.DeliveryTopic(id)
	}

	holder, err := r.identityHolder(ctx, agent)
	if err != nil {
		return ctrl.Result{}, err
	}
	var creds registration.Credentials
	if holder == nil {
		// The Secret is only issued to the holder of the identity: a conflicting Agent must not get
		// a password for a client ID it does not own.
		if creds, err = r.ensureCredentials(ctx, agent); err != nil {
			return ctrl.Result{}, err
		}
		agent.Status.CredentialsSecret = identity.CredentialsSecretName(agent)
	}

	regErr := r.registerOnBroker(ctx, agent, creds, holder)
	if err := r.reconcileWorkload(ctx, agent); err != nil {
		return ctrl.Result{}, err
	}
	r.setReady(agent)
	agent.Status.ObservedGeneration = agent.Generation

	if err := r.Status().Patch(ctx, agent, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, fmt.Errorf("update status: %w", err)
	}
	r.emitTransitions(before, agent, holder)
	if regErr != nil {
		// Returning the error requeues with the controller's exponential backoff.
		return ctrl.Result{}, fmt.Errorf("register agent: %w", regErr)
	}
	log.V(1).Info("reconciled agent", "clientID", agent.Status.ClientID, "policy", agent.Status.ConversationPolicy)
	if r.Registrar != nil && holder == nil {
		// The broker can change behind our back (a role deleted by hand, a broker restored from an
		// old backup): look again periodically, jittered so a fleet does not resync in lockstep.
		return ctrl.Result{RequeueAfter: jitter(r.Resync)}, nil
	}
	return ctrl.Result{}, nil
}

// jitter returns d ±20 %.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

func (r *AgentReconciler) finalize(ctx context.Context, agent *a2av1.Agent) error {
	if !controllerutil.ContainsFinalizer(agent, AgentFinalizer) {
		return nil
	}
	if r.Registrar != nil {
		if err := r.Registrar.Unregister(ctx, agent); err != nil {
			r.Recorder.Eventf(agent, nil, corev1.EventTypeWarning, EventRegistrationFail, "Unregister",
				"removing broker state failed, will retry: %v", err)
			return fmt.Errorf("unregister agent: %w", err)
		}
		r.Recorder.Eventf(agent, nil, corev1.EventTypeNormal, EventUnregistered, "Unregister",
			"removed client %s from the broker", agent.Status.ClientID)
	}
	controllerutil.RemoveFinalizer(agent, AgentFinalizer)
	if err := r.Update(ctx, agent); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	return nil
}

// resolvePolicy records in status the ConversationPolicy that governs the Agent and the ones it
// outranks.
func (r *AgentReconciler) resolvePolicy(ctx context.Context, agent *a2av1.Agent) error {
	var policies a2av1.ConversationPolicyList
	if err := r.List(ctx, &policies, client.InNamespace(agent.Namespace)); err != nil {
		return fmt.Errorf("list conversation policies: %w", err)
	}
	names := policy.Names(policy.Matching(policies.Items, agent.Labels))
	agent.Status.ConversationPolicy, agent.Status.OverlappingPolicies = "", nil
	if len(names) > 0 {
		agent.Status.ConversationPolicy = names[0]
	}
	if len(names) > 1 {
		agent.Status.OverlappingPolicies = names[1:min(len(names), maxOverlappingPolicies+1)]
	}
	return nil
}

// identityHolder returns the Agent that owns this Agent's client ID when that is another Agent:
// the oldest one wins, then the lexically first namespace/name.
func (r *AgentReconciler) identityHolder(ctx context.Context, agent *a2av1.Agent) (*types.NamespacedName, error) {
	var same a2av1.AgentList
	if err := r.List(ctx, &same, client.MatchingFields{identity.IndexAgentClientID: agent.Status.ClientID}); err != nil {
		return nil, fmt.Errorf("list agents with client ID %s: %w", agent.Status.ClientID, err)
	}
	var holder *a2av1.Agent
	for i := range same.Items {
		other := &same.Items[i]
		// An Agent being deleted still holds its identity until its finalizer has removed the
		// broker state; handing the identity over earlier would let that cleanup delete the
		// newcomer's client.
		if other.UID == agent.UID {
			continue
		}
		if agentPrecedes(other, agent) && (holder == nil || agentPrecedes(other, holder)) {
			holder = other
		}
	}
	if holder == nil {
		return nil, nil
	}
	return &types.NamespacedName{Namespace: holder.Namespace, Name: holder.Name}, nil
}

func agentPrecedes(a, b *a2av1.Agent) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	return a.Name < b.Name
}

// registerOnBroker runs the Registrar and records ACLsSynced and Registered.
func (r *AgentReconciler) registerOnBroker(ctx context.Context, agent *a2av1.Agent, creds registration.Credentials, holder *types.NamespacedName) error {
	both := func(status metav1.ConditionStatus, reason, message string) {
		r.setCondition(agent, a2av1.ConditionACLsSynced, status, reason, message)
		r.setCondition(agent, a2av1.ConditionRegistered, status, reason, message)
	}
	switch {
	case holder != nil:
		// Registering would hand this Agent the other's broker identity; the older Agent keeps it.
		both(metav1.ConditionFalse, a2av1.ReasonIdentityConflict,
			fmt.Sprintf("client ID %s already belongs to Agent %s", agent.Status.ClientID, holder))
		return nil
	case r.Registrar == nil:
		both(metav1.ConditionUnknown, a2av1.ReasonBrokerNotConfigured,
			"the operator runs without an MQTT broker; identity and topics are resolved but nothing is registered")
		return nil
	}
	err := r.Registrar.Register(ctx, agent, creds)
	if err == nil && creds.PasswordChanged {
		if markErr := r.markPasswordSynced(ctx, agent); markErr != nil {
			err = &registration.StageError{Stage: registration.StageCredentials, Err: markErr}
		}
	}
	var stage *registration.StageError
	switch {
	case err == nil:
		r.setCondition(agent, a2av1.ConditionACLsSynced, metav1.ConditionTrue, a2av1.ReasonACLsApplied,
			"the broker grants exactly the topics this agent and its callers need")
		r.setCondition(agent, a2av1.ConditionRegistered, metav1.ConditionTrue, a2av1.ReasonRegistered,
			"broker client "+identity.BrokerUsername(agent)+" exists and the agent card is published")
	case errors.As(err, &stage) && stage.Stage != registration.StageACLs:
		r.setCondition(agent, a2av1.ConditionACLsSynced, metav1.ConditionTrue, a2av1.ReasonACLsApplied,
			"the broker grants exactly the topics this agent and its callers need")
		r.setCondition(agent, a2av1.ConditionRegistered, metav1.ConditionFalse, a2av1.ReasonBrokerUnavailable, err.Error())
	default:
		both(metav1.ConditionFalse, a2av1.ReasonBrokerUnavailable, err.Error())
	}
	return err
}

// setReady derives Ready from the other conditions: the first that is not True explains why.
func (r *AgentReconciler) setReady(agent *a2av1.Agent) {
	for _, t := range []string{a2av1.ConditionACLsSynced, a2av1.ConditionRegistered, a2av1.ConditionWorkloadAvailable} {
		c := meta.FindStatusCondition(agent.Status.Conditions, t)
		if c == nil {
			continue // WorkloadAvailable exists only with a workload
		}
		if c.Status != metav1.ConditionTrue {
			r.setCondition(agent, a2av1.ConditionReady, metav1.ConditionFalse, c.Reason, c.Message)
			return
		}
	}
	r.setCondition(agent, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled,
		"the agent is registered and may connect as "+agent.Status.ClientID)
}

func removeCondition(agent *a2av1.Agent, condType string) {
	meta.RemoveStatusCondition(&agent.Status.Conditions, condType)
}

func (r *AgentReconciler) setCondition(agent *a2av1.Agent, condType string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&agent.Status.Conditions, metav1.Condition{
		Type: condType, Status: status, Reason: reason, Message: message, ObservedGeneration: agent.Generation,
	})
}

// emitTransitions records an Event for each change a human would want to see in kubectl describe.
func (r *AgentReconciler) emitTransitions(before, after *a2av1.Agent, holder *types.NamespacedName) {
	if b, a := before.Status.ConversationPolicy, after.Status.ConversationPolicy; b != a {
		if a == "" {
			r.Recorder.Eventf(after, nil, corev1.EventTypeNormal, EventPolicyRemoved, "ResolvePolicy",
				"no ConversationPolicy selects this Agent any more (was %s)", b)
		} else {
			r.Recorder.Eventf(after, nil, corev1.EventTypeNormal, EventPolicyApplied, "ResolvePolicy",
				"ConversationPolicy %s applies", a)
		}
	}
	if o := after.Status.OverlappingPolicies; len(o) > 0 && !slices.Equal(o, before.Status.OverlappingPolicies) {
		r.Recorder.Eventf(after, nil, corev1.EventTypeWarning, a2av1.ReasonOverlappingPolicies, "ResolvePolicy",
			"ConversationPolicy %s applies; %v select this Agent too but lose on precedence (highest priority, then oldest, then name)",
			after.Status.ConversationPolicy, o)
	}
	wasReady := meta.FindStatusCondition(before.Status.Conditions, a2av1.ConditionReady)
	nowReady := meta.FindStatusCondition(after.Status.Conditions, a2av1.ConditionReady)
	if wasReady != nil && wasReady.Status == nowReady.Status && wasReady.Reason == nowReady.Reason {
		return
	}
	switch {
	case nowReady.Status == metav1.ConditionTrue:
		r.Recorder.Eventf(after, nil, corev1.EventTypeNormal, EventReady, "Reconcile", "%s", nowReady.Message)
	case holder != nil:
		r.Recorder.Eventf(after, nil, corev1.EventTypeWarning, EventIdentityConflict, "Reconcile",
			"client ID %s already belongs to Agent %s", after.Status.ClientID, holder)
	default:
		r.Recorder.Eventf(after, nil, corev1.EventTypeNormal, EventNotReady, "Reconcile", "%s: %s", nowReady.Reason, nowReady.Message)
	}
}

// SetupWithManager registers the controller and its watches.
func (r *AgentReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&a2av1.Agent{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		// A policy change can move Agents in or out of its selector.
		Watches(&a2av1.ConversationPolicy{}, handler.EnqueueRequestsFromMapFunc(r.agentsForPolicy)).
		// A newcomer with the same client ID may outrank an Agent (same-second creation); once the
		// holder of a client ID is gone, the next Agent in line takes it.
		Watches(&a2av1.Agent{}, handler.EnqueueRequestsFromMapFunc(r.agentsSharingIdentity),
			builder.WithPredicates(createOrDeletePredicate())).
		// Caller rules tie Agents together: a rule's owner and the Agents it selects both change.
		Watches(&a2av1.Agent{}, r.callerRulesHandler()).
		Owns(&corev1.Secret{}).
		Owns(&appsv1.Deployment{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.MaxConcurrent}).
		Named("agent").
		Complete(r)
}

// agentsForPolicy maps a policy event to the Agents it selects now and those it governed before.
func (r *AgentReconciler) agentsForPolicy(ctx context.Context, obj client.Object) []reconcile.Request {
	p, ok := obj.(*a2av1.ConversationPolicy)
	if !ok {
		return nil
	}
	log := logf.FromContext(ctx)
	seen := map[types.NamespacedName]bool{}
	var reqs []reconcile.Request
	add := func(items []a2av1.Agent) {
		for _, a := range items {
			key := types.NamespacedName{Namespace: a.Namespace, Name: a.Name}
			if !seen[key] {
				seen[key] = true
				reqs = append(reqs, reconcile.Request{NamespacedName: key})
			}
		}
	}
	var governed a2av1.AgentList
	if err := r.List(ctx, &governed, client.InNamespace(p.Namespace),
		client.MatchingFields{identity.IndexAgentPolicy: p.Name}); err != nil {
		log.Error(err, "list agents governed by policy", "policy", p.Name)
	}
	add(governed.Items)
	if sel, err := metav1.LabelSelectorAsSelector(&p.Spec.AgentSelector); err == nil {
		var selected a2av1.AgentList
		if err := r.List(ctx, &selected, client.InNamespace(p.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			log.Error(err, "list agents selected by policy", "policy", p.Name)
		}
		add(selected.Items)
	}
	return reqs
}

// callerRulesHandler maps Agent events to the Agents whose broker ACLs may change with them: the
// Agents whose caller selectors match the changed Agent's labels, before or after the change
// (they start or stop admitting it), and, when the changed Agent has selectors, every Agent
// they can reach (they may join or leave its callers group). Matching here keeps a fleet-wide
// rollout from re-reconciling every rule owner for every Agent.
func (r *AgentReconciler) callerRulesHandler() handler.TypedEventHandler[client.Object, reconcile.Request] {
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.enqueueCallerRuleChanges(ctx, q, nil, e.Object)
		},
		UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.enqueueCallerRuleChanges(ctx, q, e.ObjectOld, e.ObjectNew)
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.enqueueCallerRuleChanges(ctx, q, nil, e.Object)
		},
	}
}

func (r *AgentReconciler) enqueueCallerRuleChanges(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], oldObj, newObj client.Object) {
	a, ok := newObj.(*a2av1.Agent)
	if !ok {
		return
	}
	old, _ := oldObj.(*a2av1.Agent)
	if old != nil && old.Generation == a.Generation && maps.Equal(old.Labels, a.Labels) {
		return
	}
	log := logf.FromContext(ctx)
	add := func(o *a2av1.Agent) {
		if o.UID != a.UID {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.Namespace, Name: o.Name}})
		}
	}
	var callees a2av1.AgentList
	if err := r.List(ctx, &callees, client.MatchingFields{identity.IndexAgentHasCallerSelectors: "true"}); err != nil {
		log.Error(err, "list agents with caller selectors")
	}
	for i := range callees.Items {
		callee := &callees.Items[i]
		if selectsByLabels(callee, a) || (old != nil && selectsByLabels(callee, old)) {
			add(callee)
		}
	}
	if len(a.Spec.Callers.From) == 0 && (old == nil || len(old.Spec.Callers.From) == 0) {
		return
	}
	if old != nil && old.Generation == a.Generation {
		return // only its labels changed: the Agents it reaches are unaffected
	}
	opts := []client.ListOption{client.InNamespace(a.Namespace)}
	for _, f := range append(slices.Clone(a.Spec.Callers.From), callersFrom(old)...) {
		if f.NamespaceSelector != nil {
			opts = nil // a namespace selector can reach any namespace
		}
	}
	var reachable a2av1.AgentList
	if err := r.List(ctx, &reachable, opts...); err != nil {
		log.Error(err, "list agents reachable by caller selectors")
	}
	for i := range reachable.Items {
		add(&reachable.Items[i])
	}
}

// selectsByLabels reports whether one of callee's caller selectors could select agent. Namespace
// selectors are not evaluated here (that needs the Namespace): they count as a possible match.
func selectsByLabels(callee, agent *a2av1.Agent) bool {
	for _, f := range callee.Spec.Callers.From {
		if f.NamespaceSelector == nil && callee.Namespace != agent.Namespace {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&f.AgentSelector)
		if err == nil && sel.Matches(labels.Set(agent.Labels)) {
			return true
		}
	}
	return false
}

func callersFrom(a *a2av1.Agent) []a2av1.CallerSelector {
	if a == nil {
		return nil
	}
	return a.Spec.Callers.From
}

func (r *AgentReconciler) agentsSharingIdentity(ctx context.Context, obj client.Object) []reconcile.Request {
	a, ok := obj.(*a2av1.Agent)
	if !ok {
		return nil
	}
	var same a2av1.AgentList
	if err := r.List(ctx, &same, client.MatchingFields{identity.IndexAgentClientID: identity.Of(a).ClientID()}); err != nil {
		logf.FromContext(ctx).Error(err, "list agents sharing a client ID")
		return nil
	}
	var reqs []reconcile.Request
	for _, o := range same.Items {
		if o.UID != a.UID {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.Namespace, Name: o.Name}})
		}
	}
	return reqs
}
