package controllers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

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
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
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

// AgentReconciler reconciles Agents. It orchestrates four units, each with its own narrow
// dependencies, that talk through the Agent's conditions:
//
//   - identity (agentIdentity): client ID, topics, governing policy, IdentityPermitted, the holder
//     of a contested identity;
//   - credentials (agentCredentials): the credentials Secret, rotations and their staging;
//   - registration (agentRegistration): the broker side, Registered and ACLsSynced;
//   - workload (agentWorkload): the Deployment, WorkloadAvailable.
//
// agentStatus derives Ready and Connected from their conditions, and agentEvents maps watch
// events to the Agents they concern.
type AgentReconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
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
	// WorkloadBrokerCAFile, when set, is the broker CA every credentials Secret carries (ca.crt)
	// and the workloads verify the broker with (A2A_TLS_CA).
	WorkloadBrokerCAFile string
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
	// Graph is the caller graph Client carries (tenancy.WithCallerGraph): after each Agent change
	// it applies, it wakes the Agents whose caller relations the change can touch.
	Graph *tenancy.CallerGraph
	// Counts are the Agent counts and order Client carries (tenancy.WithAgentCounts): after each
	// deletion they apply, the Agents refused for their Tenant's maxAgents look again (nil: at
	// the deletion's event).
	Counts *tenancy.AgentCounts

	metrics *metrics

	// The units, built by SetupWithManager from the fields above.
	identity     *agentIdentity
	credentials  *agentCredentials
	registration *agentRegistration
	workload     *agentWorkload
	status       *agentStatus
}

// buildUnits gives every unit exactly what it uses.
func (r *AgentReconciler) buildUnits() {
	r.identity = &agentIdentity{reader: r.Client, gating: r.Gating}
	r.credentials = &agentCredentials{client: r.Client, apiReader: r.APIReader, recorder: r.Recorder, metrics: r.metrics, withBroker: r.Registrar != nil,
		ca: newWorkloadCA(r.WorkloadBrokerCAFile)}
	r.registration = &agentRegistration{registrar: r.Registrar, shared: r.Shared, resyncs: r.Resyncs, recorder: r.Recorder, resync: r.Resync, gating: r.Gating}
	r.workload = &agentWorkload{client: r.Client, apiReader: r.APIReader, policy: r.Workloads, brokerURL: r.WorkloadBrokerURL,
		withCA: r.WorkloadBrokerCAFile != ""}
	r.status = &agentStatus{presence: r.Presence, poolsUnsupported: r.PoolsUnsupported, recorder: r.Recorder}
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
	if err := r.Client.Get(ctx, req.NamespacedName, agent); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !agent.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, agent)
	}
	// Nothing the operator writes for an Agent comes before its finalizer. The installs add it at
	// admission (a MutatingAdmissionPolicy, config/default and the chart), which saves the API
	// server this update per Agent; without the policy the operator adds it here.
	if controllerutil.AddFinalizer(agent, AgentFinalizer) {
		if err := r.Client.Update(ctx, agent); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}

	s := &agentReconcile{before: agent.DeepCopy(), agent: agent, first: isFirstReconcile(agent)}
	defer func() {
		if err := r.writeStatus(ctx, s); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()

	if err := r.identity.observe(ctx, agent); err != nil {
		return ctrl.Result{}, err
	}
	view, err := r.identity.view(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	s.view = view
	refused, err := r.identity.permit(ctx, view, agent)
	if err != nil {
		return ctrl.Result{}, err
	}
	if refused != nil {
		// A Tenant change, or an Agent's deletion (agentsOverTheLimit), re-reconciles: no requeue.
		return ctrl.Result{}, r.refuseIdentity(ctx, s, refused.reason, refused.message)
	}
	if s.holder, err = view.Holder(ctx, agent); err != nil {
		return ctrl.Result{}, err
	}
	if s.holder.UID != agent.UID {
		return ctrl.Result{}, r.loseIdentity(ctx, s)
	}
	return r.reconcileHeld(ctx, s)
}

// agentReconcile is one reconcile's state: the Agent as read, as it becomes, the view it is
// decided on, and the holder of its identity (nil until known).
type agentReconcile struct {
	before, agent *a2av1.Agent
	view          *tenancy.View
	holder        *a2av1.Agent
	// first: the operator has written nothing for the Agent yet, credentials included (see
	// isFirstReconcile).
	first bool
}

// isFirstReconcile says the operator has not written the Agent's status yet, so it has written
// nothing else for it either: status is dropped at create (the status subresource), and every
// reconcile past the finalizer writes status.observedGeneration (writeStatus), before or with
// anything it wrote. Whether the finalizer came from admission or from this reconcile does not
// matter. A reconcile that reads a cache which has not seen its predecessor's status write yet
// takes the Agent for new too; the only consequence is that a missing Secret is not looked up
// on the API server, and the Secret's create then finds it (createTaken).
func isFirstReconcile(agent *a2av1.Agent) bool {
	return agent.Status.ObservedGeneration == 0
}

// reconcileHeld runs the credentials, the broker registration and the workload of an Agent that
// holds its identity.
func (r *AgentReconciler) reconcileHeld(ctx context.Context, s *agentReconcile) (ctrl.Result, error) {
	agent := s.agent
	if err := validateCallers(agent); err != nil {
		// Only a spec change can fix it, and a spec change reconciles: no retry.
		setBrokerConditions(agent, metav1.ConditionFalse, a2av1.ReasonInvalidCallers, err.Error())
		return ctrl.Result{}, reconcile.TerminalError(err)
	}
	if r.registration.takeLost(agent) {
		// Say it first (its own status write), then repair in this same reconcile: the deferred
		// write compares with what the first one wrote. (Repairing in a later reconcile would
		// compare with a cache that may not hold the first write yet, and skip the second.)
		if err := r.writeStatus(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
		s.before = agent.DeepCopy()
	}

	pending, err := r.credentials.prepare(ctx, agent, s.first)
	if err != nil {
		if conflict := credentialsConflict(agent, err); conflict != nil {
			return *conflict, nil
		}
		return ctrl.Result{}, err
	}

	persist := func(ctx context.Context) error { return r.credentials.persist(ctx, agent, pending) }
	result, regErr := r.registration.register(ctx, s.view, agent, pending.creds, persist)
	if conflict := credentialsConflict(agent, regErr); conflict != nil {
		// A new Agent's Secret name was taken by a foreign Secret, found when creating it
		// (prepare does not ask the API server for a new Agent): take back what the broker was
		// just given, as if the Secret had been found first.
		if err := r.registration.retract(ctx, agent); err != nil {
			return ctrl.Result{}, err
		}
		return *conflict, nil
	}
	if err := r.workload.reconcile(ctx, s.view, agent, pending.checksum()); err != nil {
		return ctrl.Result{}, errors.Join(regErr, err)
	}
	if regErr != nil {
		// Returning the error requeues with the controller's exponential backoff.
		return ctrl.Result{}, fmt.Errorf("register agent: %w", regErr)
	}
	logf.FromContext(ctx).V(1).Info("reconciled agent", "clientID", agent.Status.ClientID, "policy", agent.Status.ConversationPolicy)
	return pending.requeue(result), nil
}

// credentialsConflict, when err says the Agent's credentials Secret name belongs to a foreign
// Secret, sets the broker conditions and returns the result to end the reconcile with.
func credentialsConflict(agent *a2av1.Agent, err error) *ctrl.Result {
	var conflict *credentialsConflictError
	if !errors.As(err, &conflict) {
		return nil
	}
	setBrokerConditions(agent, metav1.ConditionFalse, a2av1.ReasonCredentialsConflict, conflict.Error())
	// The cache does not hold foreign Secrets, so their removal triggers nothing: look again after
	// a while instead of retrying hot.
	return &ctrl.Result{RequeueAfter: time.Minute}
}

// loseIdentity handles the loser of an identity conflict: registering would hand this Agent the
// other's broker identity; the older Agent keeps it, and this one holds no credentials for it,
// and shows no client ID or topics.
func (r *AgentReconciler) loseIdentity(ctx context.Context, s *agentReconcile) error {
	agent, holder := s.agent, s.holder
	msg := fmt.Sprintf("client ID %s already belongs to Agent %s/%s", agent.Status.ClientID, holder.Namespace, holder.Name)
	withoutIdentity(agent)
	setBrokerConditions(agent, metav1.ConditionFalse, a2av1.ReasonIdentityConflict, msg)
	if err := r.credentials.revoke(ctx, agent, "the identity belongs to Agent "+holder.Namespace+"/"+holder.Name); err != nil {
		return err
	}
	return r.workload.reconcile(ctx, s.view, agent, "")
}

// writeStatus derives Ready, patches status when (and only when) it changed, and records Events
// for the transitions.
func (r *AgentReconciler) writeStatus(ctx context.Context, s *agentReconcile) error {
	r.status.derive(s.agent, s.holder)
	s.agent.Status.ObservedGeneration = s.agent.Generation
	patched, err := patchStatus(ctx, r.Client, s.before, s.agent, func(a *a2av1.Agent) any { return a.Status })
	if patched {
		r.status.emitTransitions(s.before, s.agent, s.holder)
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

func (r *AgentReconciler) finalize(ctx context.Context, agent *a2av1.Agent) error {
	if !controllerutil.ContainsFinalizer(agent, AgentFinalizer) {
		return nil
	}
	if r.Registrar != nil {
		view, err := r.identity.view(ctx)
		if err != nil {
			return err
		}
		if err := r.registration.finalize(ctx, view, agent); err != nil {
			return err
		}
	}
	controllerutil.RemoveFinalizer(agent, AgentFinalizer)
	if err := r.Client.Update(ctx, agent); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	return nil
}

// refuseIdentity handles an Agent whose namespace may not claim its identity: nothing may stay on
// the broker in its name (if it registered the identity before a Tenant changed, its broker state
// is removed), no credentials, no workload.
func (r *AgentReconciler) refuseIdentity(ctx context.Context, s *agentReconcile, reason, why string) error {
	agent := s.agent
	withoutIdentity(agent)
	setBrokerConditions(agent, metav1.ConditionFalse, reason, why)
	if err := r.registration.withdraw(ctx, s.view, s.before, agent, why); err != nil {
		return err
	}
	if err := r.credentials.revoke(ctx, agent, why); err != nil {
		return err
	}
	return r.workload.reconcile(ctx, s.view, agent, "")
}

// withoutIdentity clears what status says of an identity the Agent does not hold (refused, or
// the loser of a conflict): its client ID and topics belong to the holder, if anyone, and
// nothing downstream (the conversation service, tools) may take them for this Agent's.
func withoutIdentity(agent *a2av1.Agent) {
	agent.Status.ClientID, agent.Status.Topics = "", nil
}

// setBrokerConditions sets ACLsSynced and Registered alike.
func setBrokerConditions(agent *a2av1.Agent, status metav1.ConditionStatus, reason, message string) {
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionACLsSynced, status, reason, message)
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionRegistered, status, reason, message)
}

func removeCondition(agent *a2av1.Agent, condType string) {
	meta.RemoveStatusCondition(&agent.Status.Conditions, condType)
}
