package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// agentRegistration makes the broker side of an Agent that holds its identity match its spec
// (through the Registrar) and reports it in Registered and ACLsSynced; it removes the broker side
// of an Agent that is deleted or refused. Without a Registrar it says so in both conditions.
type agentRegistration struct {
	registrar Registrar
	shared    *SharedTracker
	resyncs   *brokerResyncs
	recorder  events.EventRecorder
	resync    time.Duration
	gating    bool
}

// takeLost reports whether the broker lost the Agent's state since it was last registered, and
// says so in its broker conditions.
func (u *agentRegistration) takeLost(agent *a2av1.Agent) bool {
	since, lost := u.resyncs.takeLost(agent)
	if !lost || u.registrar == nil {
		return false
	}
	setBrokerConditions(agent, metav1.ConditionFalse, ReasonBrokerStateLost, fmt.Sprintf(
		"the broker lost this agent's client, role and shared grants (state loss found at %s); registering it again", since.UTC().Format(time.RFC3339)))
	return true
}

// register runs the Registrar, persists new credentials (persist) once the broker has them, and
// records ACLsSynced and Registered (ACLsSynced only once the shared objects include the Agent).
func (u *agentRegistration) register(ctx context.Context, view *tenancy.View, agent *a2av1.Agent, creds registration.Credentials, persist func(context.Context) error) (ctrl.Result, error) {
	if u.registrar == nil {
		setBrokerConditions(agent, metav1.ConditionUnknown, a2av1.ReasonBrokerNotConfigured,
			"the operator runs without an MQTT broker; identity and topics are resolved but nothing is registered")
		// The Secret still exists for workloads; there is no broker to hand its password to.
		return ctrl.Result{}, persist(ctx)
	}
	err := u.registrar.Register(ctx, agent, creds)
	var stage *registration.StageError
	if err == nil || (errors.As(err, &stage) && stage.Stage == registration.StageCard) {
		// The broker has the password now: only then does the Secret get it.
		if perr := persist(ctx); perr != nil {
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
		return u.aclsSynced(ctx, view, agent), nil
	case errors.As(err, &stage) && stage.Stage != registration.StageACLs:
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionRegistered, metav1.ConditionFalse, a2av1.ReasonBrokerUnavailable, err.Error())
	default:
		setBrokerConditions(agent, metav1.ConditionFalse, a2av1.ReasonBrokerUnavailable, err.Error())
		return ctrl.Result{}, err
	}
	return u.aclsSynced(ctx, view, agent), err
}

// aclsSynced sets ACLsSynced once the Agent's own objects are applied: True when the shared unit,
// org and gates roles hold exactly its entries too (as the shared reconcile last applied them),
// False while they do not (the shared reconcile is woken and wakes the Agent in turn) or while
// its pool or callers need consent it does not have.
func (u *agentRegistration) aclsSynced(ctx context.Context, view *tenancy.View, agent *a2av1.Agent) ctrl.Result {
	self, live, err := registration.MemberOf(ctx, view, agent)
	if err != nil || !live {
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionACLsSynced, metav1.ConditionFalse, a2av1.ReasonSharedACLsPending,
			fmt.Sprintf("cannot tell whether the shared ACLs include this agent: %v", err))
		return ctrl.Result{RequeueAfter: sharedPendingRecheck}
	}
	if waiting := u.sharedWaiting(agent, self); len(waiting) > 0 {
		u.shared.Poke(ctx, registration.KeysOf(self.Agent, u.gating)...)
		setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionACLsSynced, metav1.ConditionFalse, a2av1.ReasonSharedACLsPending,
			"the agent's own ACLs are applied; waiting for the shared "+strings.Join(waiting, ", ")+" ACLs to include it")
		return ctrl.Result{RequeueAfter: sharedPendingRecheck}
	}
	resync := ctrl.Result{RequeueAfter: jitter(u.resync)}
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
				u.recorder.Eventf(agent, nil, corev1.EventTypeWarning, EventCallersNotGranted, "Register",
					"agents selected by callers.from in namespaces %s are not admitted: no AgentGrant there consents", strings.Join(ungranted, ", "))
			}
		}
	}
	setCondition(&agent.Status.Conditions, agent.Generation, a2av1.ConditionACLsSynced, metav1.ConditionTrue, a2av1.ReasonACLsApplied, msg)
	return resync
}

// sharedWaiting lists the shared objects that do not include the Agent's entries yet.
func (u *agentRegistration) sharedWaiting(agent *a2av1.Agent, self registration.Member) []string {
	var waiting []string
	for _, key := range registration.KeysOf(self.Agent, u.gating) {
		switch u.shared.Includes(key, agent.UID, registration.Contribution(key, self)) {
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
	return waiting
}

// finalize removes a deleted Agent's broker state when it is the Agent's, and wakes the shared
// objects it was in.
func (u *agentRegistration) finalize(ctx context.Context, view *tenancy.View, agent *a2av1.Agent) error {
	if u.registrar == nil {
		return nil
	}
	owns, err := ownsBrokerState(ctx, view, agent, agent)
	if err != nil {
		return err
	}
	if owns {
		if err := u.registrar.Unregister(ctx, agent); err != nil {
			u.recorder.Eventf(agent, nil, corev1.EventTypeWarning, EventRegistrationFail, "Unregister",
				"removing broker state failed, will retry: %v", err)
			return fmt.Errorf("unregister agent: %w", err)
		}
		u.recorder.Eventf(agent, nil, corev1.EventTypeNormal, EventUnregistered, "Unregister",
			"removed client %s from the broker", identity.Of(agent).ClientID())
	}
	u.shared.Poke(ctx, registration.KeysOf(identity.Of(agent), u.gating)...)
	return nil
}

// retract removes the broker state Register just created for an Agent that turns out not to
// get its credentials Secret (credentialsConflictError), and wakes the shared objects it was in.
func (u *agentRegistration) retract(ctx context.Context, agent *a2av1.Agent) error {
	if u.registrar == nil {
		return nil
	}
	if err := u.registrar.Unregister(ctx, agent); err != nil {
		return fmt.Errorf("unregister agent: %w", err)
	}
	agent.Status.PublishedCardDigest = ""
	u.shared.Poke(ctx, registration.KeysOf(identity.Of(agent), u.gating)...)
	return nil
}

// withdraw removes the broker state of an Agent that may no longer hold its identity, if it
// registered it (recorded is its status as read), and wakes the shared objects it was in.
func (u *agentRegistration) withdraw(ctx context.Context, view *tenancy.View, recorded, agent *a2av1.Agent, why string) error {
	if u.registrar == nil {
		return nil
	}
	owns, err := ownsBrokerState(ctx, view, agent, recorded)
	if err != nil {
		return err
	}
	if owns {
		if err := u.registrar.Unregister(ctx, agent); err != nil {
			setBrokerConditions(agent, metav1.ConditionFalse, a2av1.ReasonBrokerUnavailable,
				"the identity is not permitted and removing its broker state failed: "+err.Error())
			return fmt.Errorf("unregister agent: %w", err)
		}
		agent.Status.PublishedCardDigest = ""
		u.recorder.Eventf(agent, nil, corev1.EventTypeWarning, EventUnregistered, "Unregister",
			"removed client %s from the broker: %s", identity.Of(agent).ClientID(), why)
	}
	u.shared.Poke(ctx, registration.KeysOf(identity.Of(agent), u.gating)...)
	return nil
}

func hasNamespaceSelectors(agent *a2av1.Agent) bool {
	return slices.ContainsFunc(agent.Spec.Callers.From, func(f a2av1.CallerSelector) bool { return f.NamespaceSelector != nil })
}
