package controllers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/policy"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// AgentFinalizer guards the broker-side state of an Agent (client, role, retained card): the
// Agent is only gone once that state is.
const AgentFinalizer = "a2a.fleet.dev/agent-cleanup"

// maxOverlappingPolicies matches the MaxItems of status.overlappingPolicies.
const maxOverlappingPolicies = 10

// sharedPendingRecheck is how soon an Agent whose shared ACLs are pending looks again, in case a
// notification was lost (the shared reconcile normally wakes it).
const sharedPendingRecheck = 5 * time.Second

// Event reasons emitted on Agents.
const (
	EventPolicyApplied       = "PolicyApplied"
	EventPolicyRemoved       = "PolicyRemoved"
	EventIdentityConflict    = "IdentityConflict"
	EventIdentityNotAllowed  = "IdentityNotPermitted"
	EventRegistered          = "Registered"
	EventRegistrationFail    = "RegistrationFailed"
	EventUnregistered        = "Unregistered"
	EventReady               = "Ready"
	EventNotReady            = "NotReady"
	EventCredentialsRotated  = "CredentialsRotated"
	EventCredentialsRecreate = "CredentialsRecreated"
	EventCredentialsRevoked  = "CredentialsRevoked"
	EventCallersNotGranted   = "CallersNotGranted"
)

// Registrar makes the broker side of Agents match their specs: credentials, ACLs and retained
// agent cards (internal/registration implements it). Without one the operator still resolves
// identities, tenancy, topics and policies and reports the Agents as not registered.
type Registrar interface {
	// Register creates or updates everything the Agent needs on the broker. It must be
	// idempotent. creds.PasswordChanged says that the broker must be given creds.Password. It may
	// record what it published in agent.Status (the controller writes status afterwards).
	Register(ctx context.Context, agent *a2av1.Agent, creds registration.Credentials) error
	// Unregister removes everything Register created. Missing pieces are not an error.
	Unregister(ctx context.Context, agent *a2av1.Agent) error
	// ApplyShared makes a shared object (unit, org, gates) hold exactly the members' entries.
	ApplyShared(ctx context.Context, key registration.SharedKey, members []registration.Member) error
}

// AgentReconciler reconciles Agents.
type AgentReconciler struct {
	client.Client
	// APIReader reads around the cache where a stale read would repeat a broker write, and for
	// objects the cache does not hold (Secrets and Deployments without our label).
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Registrar is nil when the operator runs without a broker.
	Registrar Registrar
	// Shared tracks which Agents the shared broker objects include (nil without a broker).
	Shared *SharedTracker
	// Resyncs, when set, enqueues the Agents the broker lost (broker state loss).
	Resyncs *brokerResyncs
	// Resync is the period of the broker drift check for registered Agents.
	Resync time.Duration
	// WorkloadBrokerURL is the broker address injected into workloads (A2A_BROKER).
	WorkloadBrokerURL string
	// Workloads bounds what spec.workload may ask for.
	Workloads *WorkloadPolicy
	// MaxConcurrent is the number of Agents reconciled in parallel.
	MaxConcurrent int
	// Gating puts the conversation service in front of every Agent a ConversationPolicy governs.
	Gating bool
	// Presence, when set, says whether each Agent's process is connected (the Connected
	// condition); PresenceEvents enqueues the Agents whose presence changed.
	Presence       PresenceReader
	PresenceEvents <-chan event.TypedGenericEvent[client.Object]
	// PoolsUnsupported, when set, says why the broker cannot serve an Agent's pool (Ready=False).
	PoolsUnsupported string

	metrics     *metrics
	deployments appliedDeployments
}

// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=agents,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=agents/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=agents/finalizers,verbs=update
// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=conversationpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=tenants,verbs=get;list;watch
// +kubebuilder:rbac:groups=a2a.fleet.dev,resources=agentgrants,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete

// Reconcile resolves an Agent's identity, tenancy, topics and conversation policy, registers it
// on the broker when one is configured and it may hold its identity, runs its workload, and
// reports the outcome in status. Status is written once, on every return path, and only when it
// changed.
func (r *AgentReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
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
	var holder *a2av1.Agent
	defer func() {
		if err := r.writeStatus(ctx, before, agent, holder); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()

	if err := r.observe(ctx, agent); err != nil {
		return ctrl.Result{}, err
	}
	view, err := (&tenancy.Authorizer{Reader: r.Client}).View(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	decision, err := view.Permit(ctx, agent)
	if err != nil {
		return ctrl.Result{}, err
	}
	agent.Status.Tenant = decision.Tenant
	if decision.LimitExceeded {
		// The oldest Agents of the Tenant keep their place. An Agent's deletion (agentsOverTheLimit)
		// or a Tenant change re-reconciles this one: no requeue.
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionIdentityPermitted, metav1.ConditionFalse, a2av1.ReasonAgentLimitExceeded, decision.Message)
		return ctrl.Result{}, r.refuseIdentity(ctx, view, before, agent, a2av1.ReasonAgentLimitExceeded, decision.Message)
	}
	if !decision.Permitted {
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionIdentityPermitted, metav1.ConditionFalse, a2av1.ReasonIdentityNotPermitted, decision.Message)
		// A Tenant change re-reconciles the Agent: no requeue.
		return ctrl.Result{}, r.refuseIdentity(ctx, view, before, agent, a2av1.ReasonIdentityNotPermitted, decision.Message)
	}
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionIdentityPermitted, metav1.ConditionTrue, a2av1.ReasonIdentityPermitted, decision.Message)

	if holder, err = view.Holder(ctx, agent); err != nil {
		return ctrl.Result{}, err
	}
	if holder.UID != agent.UID {
		// Registering would hand this Agent the other's broker identity; the older Agent keeps it,
		// and this one holds no credentials for it, and shows no client ID or topics.
		msg := fmt.Sprintf("client ID %s already belongs to Agent %s/%s", agent.Status.ClientID, holder.Namespace, holder.Name)
		withoutIdentity(agent)
		r.setBrokerConditions(agent, metav1.ConditionFalse, a2av1.ReasonIdentityConflict, msg)
		if err := r.revokeCredentials(ctx, agent, "the identity belongs to Agent "+holder.Namespace+"/"+holder.Name); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.reconcileWorkload(ctx, view, agent, "")
	}

	if err := validateCallers(agent); err != nil {
		// Only a spec change can fix it, and a spec change reconciles: no retry.
		r.setBrokerConditions(agent, metav1.ConditionFalse, a2av1.ReasonInvalidCallers, err.Error())
		return ctrl.Result{}, reconcile.TerminalError(err)
	}

	if since, lost := r.Resyncs.takeLost(agent); lost && r.Registrar != nil {
		// Say it first (its own status write), then repair in this same reconcile: the deferred
		// write compares with what the first one wrote. (Repairing in a later reconcile would
		// compare with a cache that may not hold the first write yet, and skip the second.)
		r.setBrokerConditions(agent, metav1.ConditionFalse, ReasonBrokerStateLost, fmt.Sprintf(
			"the broker lost this agent's client, role and shared grants (state loss found at %s); registering it again", since.UTC().Format(time.RFC3339)))
		if err := r.writeStatus(ctx, before, agent, holder); err != nil {
			return ctrl.Result{}, err
		}
		before = agent.DeepCopy()
	}

	pending, err := r.prepareCredentials(ctx, agent)
	if err != nil {
		var conflict *credentialsConflictError
		if errors.As(err, &conflict) {
			r.setBrokerConditions(agent, metav1.ConditionFalse, a2av1.ReasonCredentialsConflict, err.Error())
			// The cache does not hold foreign Secrets, so their removal triggers nothing: look again
			// after a while instead of retrying hot.
			return ctrl.Result{RequeueAfter: time.Minute}, nil
		}
		return ctrl.Result{}, err
	}

	result, regErr := r.registerOnBroker(ctx, view, agent, pending)
	if err := r.reconcileWorkload(ctx, view, agent, pending.checksum()); err != nil {
		return ctrl.Result{}, errors.Join(regErr, err)
	}
	if regErr != nil {
		// Returning the error requeues with the controller's exponential backoff.
		return ctrl.Result{}, fmt.Errorf("register agent: %w", regErr)
	}
	logf.FromContext(ctx).V(1).Info("reconciled agent", "clientID", agent.Status.ClientID, "policy", agent.Status.ConversationPolicy)
	return pending.requeue(result), nil
}

// observe resolves what the Agent's identity implies: client ID, topics, governing policy.
func (r *AgentReconciler) observe(ctx context.Context, agent *a2av1.Agent) error {
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
		return err
	}
	if r.Gating && agent.Status.ConversationPolicy != "" {
		agent.Status.Topics.Delivery = identity.DeliveryTopic(id)
	}
	return nil
}

// writeStatus derives Ready, patches status when (and only when) it changed, and records Events
// for the transitions.
func (r *AgentReconciler) writeStatus(ctx context.Context, before, agent *a2av1.Agent, holder *a2av1.Agent) error {
	r.setReady(agent)
	r.setConnected(agent, holder)
	agent.Status.ObservedGeneration = agent.Generation
	patched, err := patchStatus(ctx, r.Client, before, agent, func(a *a2av1.Agent) any { return a.Status })
	if patched {
		r.emitTransitions(before, agent, holder)
	}
	return err
}

// jitter returns d ±20 %.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

// validateCallers checks that every callers.from selector can be evaluated.
func validateCallers(agent *a2av1.Agent) error {
	for i, from := range agent.Spec.Callers.From {
		if _, err := metav1.LabelSelectorAsSelector(&from.AgentSelector); err != nil {
			return fmt.Errorf("callers.from[%d].agentSelector: %w", i, err)
		}
		if from.NamespaceSelector != nil {
			if _, err := metav1.LabelSelectorAsSelector(from.NamespaceSelector); err != nil {
				return fmt.Errorf("callers.from[%d].namespaceSelector: %w", i, err)
			}
		}
	}
	return nil
}

// ownsBrokerState reports whether the broker objects named after agent's identity are agent's to
// remove: it holds the identity, or nobody may hold it now and agent is the one that registered
// it (its status says so). The loser of an identity conflict never owns them.
func ownsBrokerState(ctx context.Context, view *tenancy.View, agent, recorded *a2av1.Agent) (bool, error) {
	holder, err := view.Holder(ctx, agent)
	if err != nil {
		return false, err
	}
	if holder != nil {
		return holder.UID == agent.UID, nil
	}
	return meta.IsStatusConditionTrue(recorded.Status.Conditions, a2av1.ConditionRegistered) || recorded.Status.PublishedCardDigest != "", nil
}

func (r *AgentReconciler) finalize(ctx context.Context, agent *a2av1.Agent) error {
	if !controllerutil.ContainsFinalizer(agent, AgentFinalizer) {
		return nil
	}
	if r.Registrar != nil {
		view, err := (&tenancy.Authorizer{Reader: r.Client}).View(ctx)
		if err != nil {
			return err
		}
		owns, err := ownsBrokerState(ctx, view, agent, agent)
		if err != nil {
			return err
		}
		if owns {
			if err := r.Registrar.Unregister(ctx, agent); err != nil {
				r.Recorder.Eventf(agent, nil, corev1.EventTypeWarning, EventRegistrationFail, "Unregister",
					"removing broker state failed, will retry: %v", err)
				return fmt.Errorf("unregister agent: %w", err)
			}
			r.Recorder.Eventf(agent, nil, corev1.EventTypeNormal, EventUnregistered, "Unregister",
				"removed client %s from the broker", identity.Of(agent).ClientID())
		}
		r.Shared.Poke(ctx, registration.KeysOf(identity.Of(agent), r.Gating)...)
	}
	controllerutil.RemoveFinalizer(agent, AgentFinalizer)
	if err := r.Update(ctx, agent); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	return nil
}

// refuseIdentity handles an Agent whose namespace may not claim its identity: nothing may stay on
// the broker in its name (if it registered the identity before a Tenant changed, its broker state
// is removed), no credentials, no workload.
func (r *AgentReconciler) refuseIdentity(ctx context.Context, view *tenancy.View, before, agent *a2av1.Agent, reason, why string) error {
	withoutIdentity(agent)
	r.setBrokerConditions(agent, metav1.ConditionFalse, reason, why)
	if r.Registrar != nil {
		owns, err := ownsBrokerState(ctx, view, agent, before)
		if err != nil {
			return err
		}
		if owns {
			if err := r.Registrar.Unregister(ctx, agent); err != nil {
				r.setBrokerConditions(agent, metav1.ConditionFalse, a2av1.ReasonBrokerUnavailable,
					"the identity is not permitted and removing its broker state failed: "+err.Error())
				return fmt.Errorf("unregister agent: %w", err)
			}
			agent.Status.PublishedCardDigest = ""
			r.Recorder.Eventf(agent, nil, corev1.EventTypeWarning, EventUnregistered, "Unregister",
				"removed client %s from the broker: %s", identity.Of(agent).ClientID(), why)
		}
		r.Shared.Poke(ctx, registration.KeysOf(identity.Of(agent), r.Gating)...)
	}
	if err := r.revokeCredentials(ctx, agent, why); err != nil {
		return err
	}
	return r.reconcileWorkload(ctx, view, agent, "")
}

// withoutIdentity clears what status says of an identity the Agent does not hold (refused, or
// the loser of a conflict): its client ID and topics belong to the holder, if anyone, and
// nothing downstream (the conversation service, tools) may take them for this Agent's.
func withoutIdentity(agent *a2av1.Agent) {
	agent.Status.ClientID, agent.Status.Topics = "", nil
}

// resolvePolicy records in status the ConversationPolicy that governs the Agent and the ones it
// outranks.
func (r *AgentReconciler) resolvePolicy(ctx context.Context, agent *a2av1.Agent) error {
	var policies a2av1.ConversationPolicyList
	// Read-only use of the cache's objects: no deep copies.
	if err := r.List(ctx, &policies, client.InNamespace(agent.Namespace), client.UnsafeDisableDeepCopy); err != nil {
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

// registerOnBroker runs the Registrar, persists new credentials once the broker has them, and
// records ACLsSynced and Registered (ACLsSynced only once the shared objects include the Agent).
func (r *AgentReconciler) registerOnBroker(ctx context.Context, view *tenancy.View, agent *a2av1.Agent, pending *pendingCredentials) (ctrl.Result, error) {
	if r.Registrar == nil {
		r.setBrokerConditions(agent, metav1.ConditionUnknown, a2av1.ReasonBrokerNotConfigured,
			"the operator runs without an MQTT broker; identity and topics are resolved but nothing is registered")
		// The Secret still exists for workloads; there is no broker to hand its password to.
		return ctrl.Result{}, pending.persist(ctx, r, agent)
	}
	err := r.Registrar.Register(ctx, agent, pending.creds)
	var stage *registration.StageError
	if err == nil || (errors.As(err, &stage) && stage.Stage == registration.StageCard) {
		// The broker has the password now: only then does the Secret get it.
		if perr := pending.persist(ctx, r, agent); perr != nil {
			err = errors.Join(err, &registration.StageError{Stage: registration.StageCredentials, Err: perr})
		}
	}
	var tooLarge *registration.CardTooLargeError
	switch {
	case err == nil:
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionRegistered, metav1.ConditionTrue, a2av1.ReasonRegistered,
			"broker client "+identity.BrokerUsername(agent)+" exists and the agent card is published")
	case errors.As(err, &tooLarge):
		// Terminal until the card or the Tenant's limit changes (each reconciles): no retry, and
		// nothing oversized ever reaches the broker.
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionRegistered, metav1.ConditionFalse, a2av1.ReasonCardTooLarge,
			"broker client "+identity.BrokerUsername(agent)+" exists, but "+tooLarge.Error())
		return r.aclsSynced(ctx, view, agent), nil
	case errors.As(err, &stage) && stage.Stage != registration.StageACLs:
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionRegistered, metav1.ConditionFalse, a2av1.ReasonBrokerUnavailable, err.Error())
	default:
		r.setBrokerConditions(agent, metav1.ConditionFalse, a2av1.ReasonBrokerUnavailable, err.Error())
		return ctrl.Result{}, err
	}
	return r.aclsSynced(ctx, view, agent), err
}

// aclsSynced sets ACLsSynced once the Agent's own objects are applied: True when the shared unit,
// org and gates roles hold exactly its entries too (as the shared reconcile last applied them),
// False while they do not (the shared reconcile is woken and wakes the Agent in turn) or while
// its pool or callers need consent it does not have.
func (r *AgentReconciler) aclsSynced(ctx context.Context, view *tenancy.View, agent *a2av1.Agent) ctrl.Result {
	resync := ctrl.Result{RequeueAfter: jitter(r.Resync)}
	self, live, err := registration.MemberOf(ctx, view, agent)
	if err != nil || !live {
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionACLsSynced, metav1.ConditionFalse, a2av1.ReasonSharedACLsPending,
			fmt.Sprintf("cannot tell whether the shared ACLs include this agent: %v", err))
		return ctrl.Result{RequeueAfter: sharedPendingRecheck}
	}
	var waiting []string
	for _, key := range registration.KeysOf(self.Agent, r.Gating) {
		switch r.Shared.Includes(key, agent.UID, registration.Contribution(key, self)) {
		case inclusionNo:
			waiting = append(waiting, key.String())
		case inclusionUnknown:
			// Not applied since the operator started: trust a True condition of this generation
			// (the shared reconcile runs for every key at start and wakes us if it differs), so a
			// restart does not flip a fleet's status twice.
			c := meta.FindStatusCondition(agent.Status.Conditions, a2av1.ConditionACLsSynced)
			if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != agent.Generation {
				waiting = append(waiting, key.String())
			}
		}
	}
	if len(waiting) > 0 {
		r.Shared.Poke(ctx, registration.KeysOf(self.Agent, r.Gating)...)
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionACLsSynced, metav1.ConditionFalse, a2av1.ReasonSharedACLsPending,
			"the agent's own ACLs are applied; waiting for the shared "+strings.Join(waiting, ", ")+" ACLs to include it")
		return ctrl.Result{RequeueAfter: sharedPendingRecheck}
	}
	if agent.Spec.PoolID != "" && self.Pool == "" {
		owner, _ := view.PoolOwner(ctx, agent)
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionACLsSynced, metav1.ConditionFalse, a2av1.ReasonPoolNotGranted,
			fmt.Sprintf("pool %s belongs to namespace %s (its oldest member), which grants namespace %s no AgentGrant of kind Pools: the agent is registered but not a pool member",
				agent.Spec.PoolID, owner, agent.Namespace))
		return resync
	}
	msg := "the broker grants exactly the topics this agent and its callers need"
	if hasNamespaceSelectors(agent) {
		if _, ungranted, err := registration.SelectedCallers(ctx, view, agent); err == nil && len(ungranted) > 0 {
			msg += fmt.Sprintf("; agents selected in namespaces %s are not admitted: no AgentGrant of kind Callers there consents", strings.Join(ungranted, ", "))
			if c := meta.FindStatusCondition(agent.Status.Conditions, a2av1.ConditionACLsSynced); c == nil || c.Message != msg {
				r.Recorder.Eventf(agent, nil, corev1.EventTypeWarning, EventCallersNotGranted, "Register",
					"agents selected by callers.from in namespaces %s are not admitted: no AgentGrant there consents", strings.Join(ungranted, ", "))
			}
		}
	}
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionACLsSynced, metav1.ConditionTrue, a2av1.ReasonACLsApplied, msg)
	return resync
}

func hasNamespaceSelectors(agent *a2av1.Agent) bool {
	return slices.ContainsFunc(agent.Spec.Callers.From, func(f a2av1.CallerSelector) bool { return f.NamespaceSelector != nil })
}

// setBrokerConditions sets ACLsSynced and Registered alike.
func (r *AgentReconciler) setBrokerConditions(agent *a2av1.Agent, status metav1.ConditionStatus, reason, message string) {
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionACLsSynced, status, reason, message)
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionRegistered, status, reason, message)
}

// setReady derives Ready from the other conditions: the first that is not True explains why.
func (r *AgentReconciler) setReady(agent *a2av1.Agent) {
	for _, t := range []string{a2av1.ConditionIdentityPermitted, a2av1.ConditionRegistered, a2av1.ConditionACLsSynced, a2av1.ConditionWorkloadAvailable} {
		c := meta.FindStatusCondition(agent.Status.Conditions, t)
		if c == nil {
			continue // WorkloadAvailable exists only with a workload
		}
		if c.Status != metav1.ConditionTrue {
			setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionReady, metav1.ConditionFalse, c.Reason, c.Message)
			return
		}
	}
	if agent.Spec.PoolID != "" && r.PoolsUnsupported != "" {
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonPoolUnsupportedByBroker,
			fmt.Sprintf("the agent is registered and may connect as %s, but its pool %s cannot be served on this broker: %s; remove spec.poolID or use a broker that delivers shared subscriptions on $-topics",
				agent.Status.ClientID, agent.Spec.PoolID, r.PoolsUnsupported))
		return
	}
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled,
		"the agent is registered and may connect as "+agent.Status.ClientID)
}

// wasNotReady reports whether a Ready condition said the Agent was not Ready for a reason worth an
// Event (not merely waiting for its shared ACLs on the way to Ready).
func wasNotReady(c *metav1.Condition) bool {
	return c != nil && c.Status != metav1.ConditionTrue && c.Reason != a2av1.ReasonSharedACLsPending
}

func removeCondition(agent *a2av1.Agent, condType string) {
	meta.RemoveStatusCondition(&agent.Status.Conditions, condType)
}

// emitTransitions records an Event for each change a human would want to see in kubectl describe.
func (r *AgentReconciler) emitTransitions(before, after *a2av1.Agent, holder *a2av1.Agent) {
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
	if nowReady == nil || (wasReady != nil && wasReady.Status == nowReady.Status && wasReady.Reason == nowReady.Reason) {
		return
	}
	switch {
	case nowReady.Status == metav1.ConditionTrue && !wasNotReady(wasReady):
		// A new Agent becoming Ready is what applying it means, and status says so: an Event per
		// Agent of a fleet rollout would only load the API server. Recovering is news.
	case nowReady.Status == metav1.ConditionTrue:
		r.Recorder.Eventf(after, nil, corev1.EventTypeNormal, EventReady, "Reconcile", "%s", nowReady.Message)
	case nowReady.Reason == a2av1.ReasonIdentityNotPermitted, nowReady.Reason == a2av1.ReasonAgentLimitExceeded:
		r.Recorder.Eventf(after, nil, corev1.EventTypeWarning, EventIdentityNotAllowed, "Reconcile", "%s", nowReady.Message)
	case nowReady.Reason == a2av1.ReasonIdentityConflict && holder != nil:
		r.Recorder.Eventf(after, nil, corev1.EventTypeWarning, EventIdentityConflict, "Reconcile",
			"client ID %s already belongs to Agent %s/%s", identity.Of(after).ClientID(), holder.Namespace, holder.Name)
	case nowReady.Reason == a2av1.ReasonSharedACLsPending:
		// A step on the way to Ready, not news.
	case nowReady.Reason == a2av1.ReasonPoolUnsupportedByBroker:
		r.Recorder.Eventf(after, nil, corev1.EventTypeWarning, a2av1.ReasonPoolUnsupportedByBroker, "Reconcile", "%s", nowReady.Message)
	default:
		r.Recorder.Eventf(after, nil, corev1.EventTypeNormal, EventNotReady, "Reconcile", "%s: %s", nowReady.Reason, nowReady.Message)
	}
}
