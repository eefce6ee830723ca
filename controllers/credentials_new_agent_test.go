package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// TestNewAgentWithItsSecretNameTaken: a foreign Secret that already has the name of a new
// Agent's credentials Secret is never overwritten, the Agent reports CredentialsConflict, and
// the broker keeps nothing for it. (A new Agent's first reconcile does not ask the API server
// for the Secret; the conflict is found when the Secret's create fails, after the broker was
// given the identity, which is then taken back.)
func TestNewAgentWithItsSecretNameTaken(t *testing.T) {
	ctx := context.Background()
	ns := brokeredNamespace
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "preempted-mqtt-credentials"},
		Data: map[string][]byte{"password": []byte("someone else's")}}
	if err := k8s.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), foreign) })
	if err := applyYAML(ns, agentManifest("preempted", "acme", "keys", nil, "")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = k8s.Delete(context.Background(), &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "preempted"}})
	})
	eventually(t, "CredentialsConflict, nothing left on the broker", func() error {
		a := getAgent(t, ns, "preempted")
		if err := conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionRegistered, metav1.ConditionFalse, a2av1.ReasonCredentialsConflict); err != nil {
			return err
		}
		if c := findCondition(a, a2av1.ConditionReady); !strings.Contains(c.Message, "Secret preempted-mqtt-credentials exists and is not owned by this Agent") {
			return fmt.Errorf("Ready message %q", c.Message)
		}
		if a.Status.PublishedCardDigest != "" {
			return fmt.Errorf("publishedCardDigest %q: a card is recorded as published", a.Status.PublishedCardDigest)
		}
		if registered, unregistered := registrar.counts(a.Status.ClientID); registered > unregistered {
			return fmt.Errorf("broker: %d registrations, %d removals: the identity stayed registered", registered, unregistered)
		}
		return nil
	})
	reg, unreg := registrar.counts(getAgent(t, ns, "preempted").Status.ClientID)
	t.Logf("broker: %d registrations, %d removals", reg, unreg)
	got := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(foreign), got); err != nil {
		t.Fatal(err)
	}
	if string(got.Data["password"]) != "someone else's" || len(got.OwnerReferences) > 0 {
		t.Fatalf("the foreign Secret was changed: data %q, owners %v", got.Data, got.OwnerReferences)
	}
}
