package controllers_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

func TestWorkloadDeployment(t *testing.T) {
	ctx := context.Background()
	ns := brokeredNamespace
	workload := `  poolID: workers
  workload:
    replicas: 1
    template:
      spec:
        containers:
        - name: agent
          image: example/agent:1
          env:
          - {name: A2A_AGENT, value: spoofed}
          - {name: LOG_LEVEL, value: debug}
`
	if err := applyYAML(ns, agentManifest("runner", "acme", "ops", nil, workload)); err != nil {
		t.Fatalf("create agent: %v", err)
	}
	key := client.ObjectKey{Namespace: ns, Name: "runner-agent"}
	deploy := &appsv1.Deployment{}
	eventually(t, "deployment created", func() error { return k8s.Get(ctx, key, deploy) })
	a := getAgent(t, ns, "runner")
	if !metav1.IsControlledBy(deploy, a) || *deploy.Spec.Replicas != 1 {
		t.Fatalf("deployment not owned or wrong replicas: %+v", deploy.ObjectMeta.OwnerReferences)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range deploy.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	if env["A2A_AGENT"].Value != "runner" || env["A2A_CLIENT_ID"].Value != "acme/ops/runner" || env["A2A_POOLS"].Value != "workers" {
		t.Fatalf("identity env not injected or not authoritative: %+v", env)
	}
	if env["LOG_LEVEL"].Value != "debug" {
		t.Fatal("the template's own env was dropped")
	}
	// The manifest's card, for the process to publish: the card on the broker stays the manifest's.
	t.Setenv(a2amqtt.EnvAgentCard, env[a2amqtt.EnvAgentCard].Value)
	if card, err := a2amqtt.AgentCardFromEnv(); err != nil || card == nil || card.Name != a.Spec.Card.Name || card.Description != a.Spec.Card.Description {
		t.Fatalf("%s is not the manifest's card (%q, %q): %v %+v", a2amqtt.EnvAgentCard, a.Spec.Card.Name, a.Spec.Card.Description, err, card)
	}
	if ref := env["A2A_PASSWORD"].ValueFrom; ref == nil || ref.SecretKeyRef.Name != "runner-mqtt-credentials" || env["A2A_PASSWORD"].Value != "" {
		t.Fatalf("password must come from the Secret by reference: %+v", env["A2A_PASSWORD"])
	}
	// The Secret is also a credentials folder the SDK re-reads at every CONNECT.
	spec := deploy.Spec.Template.Spec
	mounts := spec.Containers[0].VolumeMounts
	if env[a2amqtt.EnvCredentialsDir].Value != controllers.CredentialsMountPath || len(mounts) != 1 ||
		mounts[0].Name != controllers.CredentialsVolume || mounts[0].MountPath != controllers.CredentialsMountPath || !mounts[0].ReadOnly ||
		len(spec.Volumes) != 1 || spec.Volumes[0].Secret == nil || spec.Volumes[0].Secret.SecretName != "runner-mqtt-credentials" {
		t.Fatalf("credentials folder not mounted: env %q, mounts %+v, volumes %+v", env[a2amqtt.EnvCredentialsDir].Value, mounts, spec.Volumes)
	}
	eventually(t, "not ready until the workload is available", func() error {
		a := getAgent(t, ns, "runner")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionFalse, controllers.ReasonWorkloadProgressing)
	})

	// envtest runs no deployment controller: play its part.
	deploy.Status = appsv1.DeploymentStatus{Replicas: 1, AvailableReplicas: 1, ReadyReplicas: 1,
		Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue,
			LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "MinimumReplicasAvailable"}}}
	if err := k8s.Status().Update(ctx, deploy); err != nil {
		t.Fatalf("update deployment status: %v", err)
	}
	eventually(t, "ready once available", func() error {
		a := getAgent(t, ns, "runner")
		if err := conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionWorkloadAvailable, metav1.ConditionTrue, controllers.ReasonWorkloadAvailable); err != nil {
			return err
		}
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled)
	})

	updateAgent(t, ns, "runner", func(a *a2av1.Agent) { a.Spec.Workload = nil })
	eventually(t, "deployment removed with the workload", func() error {
		if err := k8s.Get(ctx, key, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("deployment still there (err=%v)", err)
		}
		a := getAgent(t, ns, "runner")
		for _, c := range a.Status.Conditions {
			if c.Type == a2av1.ConditionWorkloadAvailable {
				return fmt.Errorf("WorkloadAvailable still reported")
			}
		}
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled)
	})
}

// TestWorkloadSecurityFloorFlag: a level that is not a Pod Security level is refused when the
// flags are parsed (with the usage), not later at setup; no flag means baseline.
func TestWorkloadSecurityFloorFlag(t *testing.T) {
	parse := func(args ...string) (controllers.Options, error) {
		var o controllers.Options
		fs := flag.NewFlagSet("manager", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.BindFlags(fs)
		return o, fs.Parse(args)
	}
	if o, err := parse(); err != nil || o.WorkloadSecurityFloor != "baseline" {
		t.Errorf("no flag: floor %q, error %v; want baseline", o.WorkloadSecurityFloor, err)
	}
	if o, err := parse("--workload-security-floor=restricted"); err != nil || o.WorkloadSecurityFloor != "restricted" {
		t.Errorf("restricted: floor %q, error %v", o.WorkloadSecurityFloor, err)
	}
	if _, err := parse("--workload-security-floor=strict"); err == nil || !strings.Contains(err.Error(), "not a Pod Security level") {
		t.Errorf("strict: error %v, want a refusal naming the levels", err)
	}
}
