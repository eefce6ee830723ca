package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// setDeploymentStatus plays the Deployment controller (envtest runs none) for one step of a
// rollout.
func setDeploymentStatus(t *testing.T, key client.ObjectKey, observed bool, replicas, updated, available int32) {
	t.Helper()
	eventually(t, "deployment status written", func() error {
		d := &appsv1.Deployment{}
		if err := k8s.Get(context.Background(), key, d); err != nil {
			return err
		}
		st := corev1.ConditionFalse
		if available > 0 {
			st = corev1.ConditionTrue
		}
		d.Status = appsv1.DeploymentStatus{Replicas: replicas, UpdatedReplicas: updated, ReadyReplicas: available, AvailableReplicas: available,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: st,
				LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "MinimumReplicasAvailable"}}}
		if observed {
			d.Status.ObservedGeneration = d.Generation
		}
		return k8s.Status().Update(context.Background(), d)
	})
}

// A rotation of an Agent whose workload runs is staged: the new password goes into the Secret
// (not yet synced) and the Deployment (Recreate) rolls to it, while the broker keeps the old
// password for the old pod to finish its work; only once the new ReplicaSet has its pod (all
// old pods gone) does the broker get the new password, once, with an Event.
func TestStagedRotationWaitsForTheOldPods(t *testing.T) {
	ctx := context.Background()
	ns := brokeredNamespace
	workload := "  workload:\n    template:\n      spec:\n        containers:\n        - {name: agent, image: example/agent:1}\n"
	if err := applyYAML(ns, agentManifest("stager", "acme", "ops", nil, workload)); err != nil {
		t.Fatal(err)
	}
	const clientID = "acme/ops/stager"
	key := client.ObjectKey{Namespace: ns, Name: "stager-agent"}
	deploy := &appsv1.Deployment{}
	eventually(t, "deployment applied with the credentials pushed", func() error {
		if err := k8s.Get(ctx, key, deploy); err != nil {
			return err
		}
		if pw := registrar.passwords(clientID); len(pw) != 1 {
			return fmt.Errorf("broker got %d passwords", len(pw))
		}
		return nil
	})
	if deploy.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || deploy.Spec.Strategy.RollingUpdate != nil {
		t.Fatalf("workload strategy %+v, want Recreate (the pods share one client ID)", deploy.Spec.Strategy)
	}
	setDeploymentStatus(t, key, true, 1, 1, 1)
	old := registrar.passwords(clientID)[0]
	oldChecksum := deploy.Spec.Template.Annotations[controllers.AnnotationCredentialsChecksum]

	updateAgent(t, ns, "stager", func(a *a2av1.Agent) {
		a.Annotations = map[string]string{controllers.AnnotationRotateCredentials: "staged-1"}
	})
	var staged string
	eventually(t, "new password staged in the Secret, the Deployment rolled to it", func() error {
		s, err := getSecret(ns, "stager-mqtt-credentials")
		if err != nil {
			return err
		}
		if staged = string(s.Data[identity.SecretKeyPassword]); staged == old {
			return fmt.Errorf("password unchanged")
		}
		if s.Annotations["a2a.fleet.dev/password-synced"] != "false" || s.Annotations["a2a.fleet.dev/password-staged"] == "" {
			return fmt.Errorf("secret not marked staged: %v", s.Annotations)
		}
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, key, d); err != nil {
			return err
		}
		if d.Spec.Template.Annotations[controllers.AnnotationCredentialsChecksum] == oldChecksum {
			return fmt.Errorf("deployment not rolled")
		}
		return expectEvent(ns, "stager", controllers.EventCredentialsRotated)
	})
	// The rollout has not started, then the old pod is terminating (the new ReplicaSet has no
	// pod yet): the broker keeps the old password all along.
	stillOld := func(phase string) {
		t.Helper()
		for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if pw := registrar.passwords(clientID); len(pw) != 1 {
				t.Fatalf("%s: the broker got the new password while the old pod may still run (pushes %d)", phase, len(pw))
			}
		}
	}
	stillOld("rollout not observed yet")
	setDeploymentStatus(t, key, true, 0, 0, 0)
	stillOld("old pod terminating")

	setDeploymentStatus(t, key, true, 1, 1, 0) // the new pod exists: every old one is gone
	eventually(t, "the broker gets the new password once the old pod is gone", func() error {
		pw := registrar.passwords(clientID)
		if len(pw) != 2 || pw[1] != staged {
			return fmt.Errorf("broker passwords: %d pushes", len(pw))
		}
		s, err := getSecret(ns, "stager-mqtt-credentials")
		if err != nil {
			return err
		}
		if s.Annotations["a2a.fleet.dev/password-synced"] != "true" || s.Annotations["a2a.fleet.dev/password-staged"] != "" {
			return fmt.Errorf("secret still marked staged: %v", s.Annotations)
		}
		return expectEvent(ns, "stager", controllers.EventCredentialsActivated)
	})
	if s, _ := getSecret(ns, "stager-mqtt-credentials"); string(s.Data[identity.SecretKeyPassword]) != staged {
		t.Fatal("the Secret's password changed again")
	}
}

// An Agent without a workload (or whose workload is not running) rotates at once: broker first,
// then the Secret (TestCredentialsSecretAndRotation); a Deployment applied by an older version
// (RollingUpdate, the API server's default) is moved to Recreate.
func TestWorkloadMovedToRecreate(t *testing.T) {
	ctx := context.Background()
	ns := brokeredNamespace
	workload := "  workload:\n    template:\n      spec:\n        containers:\n        - {name: agent, image: example/agent:1}\n"
	if err := applyYAML(ns, agentManifest("legacy", "acme", "ops", nil, workload)); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: ns, Name: "legacy-agent"}
	eventually(t, "deployment applied", func() error { return k8s.Get(ctx, key, &appsv1.Deployment{}) })
	// What an older version left: no strategy of its own, so the API server's RollingUpdate.
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}}
	if err := k8s.Patch(ctx, d, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"strategy":{"type":"RollingUpdate"}}}`))); err != nil {
		t.Fatal(err)
	}
	if d.Spec.Strategy.RollingUpdate == nil {
		t.Fatalf("the API server did not default rollingUpdate: %+v", d.Spec.Strategy)
	}
	eventually(t, "moved back to Recreate", func() error {
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, key, d); err != nil {
			return err
		}
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate != nil {
			return fmt.Errorf("strategy %+v", d.Spec.Strategy)
		}
		return nil
	})
}
