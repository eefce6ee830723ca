package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

func getSecret(ns, name string) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	return s, k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, s)
}

func TestCredentialsSecretAndRotation(t *testing.T) {
	ns := brokeredNamespace
	if err := applyYAML(ns, agentManifest("keyholder", "acme", "keys", nil, "")); err != nil {
		t.Fatalf("create agent: %v", err)
	}
	var first string
	eventually(t, "credentials issued and pushed to the broker", func() error {
		a := getAgent(t, ns, "keyholder")
		if a.Status.CredentialsSecret != "keyholder-mqtt-credentials" {
			return fmt.Errorf("status.credentialsSecret = %q", a.Status.CredentialsSecret)
		}
		s, err := getSecret(ns, a.Status.CredentialsSecret)
		if err != nil {
			return err
		}
		if !metav1.IsControlledBy(s, a) {
			return fmt.Errorf("secret not controlled by the agent: %v", s.OwnerReferences)
		}
		if got := string(s.Data[identity.SecretKeyClientID]); got != "acme/keys/keyholder" || string(s.Data[identity.SecretKeyUsername]) != "a2a:"+got {
			return fmt.Errorf("secret username/clientID = %q/%q", s.Data[identity.SecretKeyUsername], got)
		}
		first = string(s.Data[identity.SecretKeyPassword])
		if len(first) < 40 {
			return fmt.Errorf("password of %d chars is too weak", len(first))
		}
		if pw := registrar.passwords("acme/keys/keyholder"); len(pw) != 1 || pw[0] != first {
			return fmt.Errorf("broker got passwords %d times", len(pw))
		}
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled)
	})

	// Reconciles without a rotation request must not touch the password.
	updateAgent(t, ns, "keyholder", func(a *a2av1.Agent) { a.Spec.Card.Description = "holds keys" })
	eventually(t, "spec change reconciled", func() error {
		a := getAgent(t, ns, "keyholder")
		if a.Status.ObservedGeneration != a.Generation {
			return fmt.Errorf("not reconciled yet")
		}
		return nil
	})
	if pw := registrar.passwords("acme/keys/keyholder"); len(pw) != 1 {
		t.Fatalf("password pushed %d times without rotation", len(pw))
	}

	updateAgent(t, ns, "keyholder", func(a *a2av1.Agent) {
		if a.Annotations == nil {
			a.Annotations = map[string]string{}
		}
		a.Annotations[controllers.AnnotationRotateCredentials] = "2026-11-30T12:00:00Z"
	})
	eventually(t, "password rotated in the Secret and on the broker", func() error {
		s, err := getSecret(ns, "keyholder-mqtt-credentials")
		if err != nil {
			return err
		}
		now := string(s.Data[identity.SecretKeyPassword])
		if now == first {
			return fmt.Errorf("password unchanged")
		}
		// The broker gets the new password first and exactly once (decided on the API server's
		// copy of the Secret, never on a stale cache), then the Secret.
		pw := registrar.passwords("acme/keys/keyholder")
		if len(pw) != 2 || pw[1] != now {
			return fmt.Errorf("broker did not get exactly the new password once (pushes: %d)", len(pw))
		}
		return expectEvent(ns, "keyholder", controllers.EventCredentialsRotated)
	})
}

func TestCredentialsNotIssuedOnIdentityConflict(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	if err := applyYAML(nsA, agentManifest("dup", "acme", "c", nil, "")); err != nil {
		t.Fatalf("create agent: %v", err)
	}
	eventually(t, "holder has credentials", func() error {
		_, err := getSecret(nsA, "dup-mqtt-credentials")
		return err
	})
	time.Sleep(1100 * time.Millisecond) // creationTimestamp has one-second resolution
	if err := applyYAML(nsB, agentManifest("dup", "acme", "c", nil, "")); err != nil {
		t.Fatalf("create agent: %v", err)
	}
	eventually(t, "conflict reported", func() error {
		a := getAgent(t, nsB, "dup")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonIdentityConflict)
	})
	if _, err := getSecret(nsB, "dup-mqtt-credentials"); !apierrors.IsNotFound(err) {
		t.Fatalf("the conflicting Agent got a credentials Secret (err=%v)", err)
	}
}
