package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
)

func TestAgentLifecycleWithoutBroker(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	if err := applyYAML(ns, agentManifest("planner", "acme", "sales", nil, "  poolID: planners\n")); err != nil {
		t.Fatalf("create agent: %v", err)
	}

	eventually(t, "agent status resolved", func() error {
		a := getAgent(t, ns, "planner")
		if !controllerutil.ContainsFinalizer(a, controllers.AgentFinalizer) {
			return fmt.Errorf("finalizer missing: %v", a.Finalizers)
		}
		if a.Status.ObservedGeneration != a.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", a.Status.ObservedGeneration, a.Generation)
		}
		if err := conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionRegistered, metav1.ConditionUnknown, a2av1.ReasonBrokerNotConfigured); err != nil {
			return err
		}
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonBrokerNotConfigured)
	})

	a := getAgent(t, ns, "planner")
	wantTopics := a2av1.AgentTopics{
		Request:     "$a2a/v1/request/acme/sales/planner",
		ReplyPrefix: "$a2a/v1/reply/acme/sales/planner",
		Discovery:   "$a2a/v1/discovery/acme/sales/planner",
		Event:       "$a2a/v1/event/acme/sales/planner",
		Pool:        "$a2a/v1/request/acme/sales/pool/planners",
	}
	if a.Status.Topics == nil || *a.Status.Topics != wantTopics {
		t.Fatalf("topics = %+v, want %+v", a.Status.Topics, wantTopics)
	}
	if a.Status.AgentID != "planner" || a.Status.ClientID != "acme/sales/planner" {
		t.Fatalf("agentID %q clientID %q: agentID must default to metadata.name", a.Status.AgentID, a.Status.ClientID)
	}
	if a.Spec.Callers.Scope != a2av1.CallerScopeNone || a.Spec.Card.Version != "1.0.0" {
		t.Fatalf("defaults not applied: callers.scope=%q card.version=%q", a.Spec.Callers.Scope, a.Spec.Card.Version)
	}

	// A spec change bumps the generation; status and every condition must follow it.
	updateAgent(t, ns, "planner", func(a *a2av1.Agent) { a.Spec.Card.Description = "plans things" })
	eventually(t, "status follows the new generation", func() error {
		a := getAgent(t, ns, "planner")
		if a.Generation < 2 || a.Status.ObservedGeneration != a.Generation {
			return fmt.Errorf("generation %d observedGeneration %d", a.Generation, a.Status.ObservedGeneration)
		}
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonBrokerNotConfigured)
	})

	eventually(t, "NotReady event recorded", func() error {
		return expectEvent(ns, "planner", controllers.EventNotReady)
	})

	if err := k8s.Delete(ctx, getAgent(t, ns, "planner")); err != nil {
		t.Fatalf("delete agent: %v", err)
	}
	eventually(t, "agent deleted through its finalizer", func() error {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "planner"}, &a2av1.Agent{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("agent still present (err=%v)", err)
	})
}

func TestAgentRegistrationSeam(t *testing.T) {
	ctx := context.Background()
	ns := brokeredNamespace
	if err := applyYAML(ns, agentManifest("writer", "acme", "docs", nil, "  agentID: writer-1\n")); err != nil {
		t.Fatalf("create agent: %v", err)
	}
	t.Cleanup(func() { registrar.setFailing(false) })

	eventually(t, "registered and ready", func() error {
		a := getAgent(t, ns, "writer")
		if err := conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionRegistered, metav1.ConditionTrue, a2av1.ReasonRegistered); err != nil {
			return err
		}
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled)
	})
	if reg, _ := registrar.counts("acme/docs/writer-1"); reg == 0 {
		t.Fatal("Register was not called with the resolved client ID acme/docs/writer-1")
	}

	// Broker outage: the next reconcile reports it and keeps retrying; recovery clears it.
	registrar.setFailing(true)
	updateAgent(t, ns, "writer", func(a *a2av1.Agent) { a.Spec.Card.Description = "writes docs" })
	eventually(t, "outage reported", func() error {
		a := getAgent(t, ns, "writer")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonBrokerUnavailable)
	})
	registrar.setFailing(false)
	eventually(t, "recovered after the outage without a spec change", func() error {
		a := getAgent(t, ns, "writer")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled)
	})

	// Deletion waits for Unregister to succeed.
	registrar.setFailing(true)
	if err := k8s.Delete(ctx, getAgent(t, ns, "writer")); err != nil {
		t.Fatalf("delete agent: %v", err)
	}
	eventually(t, "unregister failure recorded as an event", func() error {
		return expectEvent(ns, "writer", controllers.EventRegistrationFail)
	})
	if a := getAgent(t, ns, "writer"); !controllerutil.ContainsFinalizer(a, controllers.AgentFinalizer) {
		t.Fatal("finalizer removed although Unregister failed")
	}
	registrar.setFailing(false)
	eventually(t, "agent gone after unregister", func() error {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "writer"}, &a2av1.Agent{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("agent still present (err=%v)", err)
		}
		if _, unreg := registrar.counts("acme/docs/writer-1"); unreg == 0 {
			return fmt.Errorf("Unregister not called")
		}
		return nil
	})
}

func TestAgentIdentityConflict(t *testing.T) {
	ctx := context.Background()
	nsA, nsB := newNamespace(t), newNamespace(t)
	if err := applyYAML(nsA, agentManifest("router", "acme", "ops", nil, "")); err != nil {
		t.Fatalf("create first agent: %v", err)
	}
	eventually(t, "first agent reconciled", func() error {
		a := getAgent(t, nsA, "router")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionRegistered, metav1.ConditionUnknown, a2av1.ReasonBrokerNotConfigured)
	})
	// creationTimestamp has one-second resolution: make the second Agent strictly younger.
	time.Sleep(1100 * time.Millisecond)
	// Same org/unit/agent in another namespace, spelled through agentID.
	if err := applyYAML(nsB, agentManifest("other-name", "acme", "ops", nil, "  agentID: router\n")); err != nil {
		t.Fatalf("create second agent: %v", err)
	}
	eventually(t, "second agent reports the conflict", func() error {
		a := getAgent(t, nsB, "other-name")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonIdentityConflict)
	})
	eventually(t, "conflict event", func() error { return expectEvent(nsB, "other-name", controllers.EventIdentityConflict) })
	if a := getAgent(t, nsA, "router"); conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionRegistered, metav1.ConditionUnknown, a2av1.ReasonBrokerNotConfigured) != nil {
		t.Fatalf("the older agent must keep its identity: %v", a.Status.Conditions)
	}

	if err := k8s.Delete(ctx, getAgent(t, nsA, "router")); err != nil {
		t.Fatalf("delete first agent: %v", err)
	}
	eventually(t, "second agent takes over the identity", func() error {
		a := getAgent(t, nsB, "other-name")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionRegistered, metav1.ConditionUnknown, a2av1.ReasonBrokerNotConfigured)
	})
}

// expectEvent finds an events.k8s.io Event with the given reason about the named object.
func expectEvent(ns, name, reason string) error {
	var evs eventsv1.EventList
	if err := k8s.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
		return err
	}
	var seen []string
	for _, e := range evs.Items {
		if e.Regarding.Name == name {
			if e.Reason == reason {
				return nil
			}
			seen = append(seen, e.Reason)
		}
	}
	return fmt.Errorf("no %s event for %s (saw %v)", reason, name, seen)
}
