package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
)

// TestForeignSecretKeepsWhatWasLearned: a Secret with the credentials' name that is not the
// Agent's leaves a precise condition, and the status keeps what earlier reconciles learned
// (publishedCardDigest), so a later reconcile does not republish the card over a connected agent's.
func TestForeignSecretKeepsWhatWasLearned(t *testing.T) {
	ctx := context.Background()
	ns := brokeredNamespace
	if err := applyYAML(ns, agentManifest("squatted", "acme", "keys", nil, "")); err != nil {
		t.Fatal(err)
	}
	var digest string
	eventually(t, "registered with a card digest", func() error {
		a := getAgent(t, ns, "squatted")
		digest = a.Status.PublishedCardDigest
		if digest == "" {
			return fmt.Errorf("no card digest yet")
		}
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled)
	})
	// Someone takes the credentials Secret over: same name, no longer the Agent's. One update, not
	// delete+create: between those two the operator may recreate its own Secret first.
	secret := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "squatted-mqtt-credentials"}, secret); err != nil {
		t.Fatal(err)
	}
	secret.OwnerReferences, secret.Labels, secret.Annotations = nil, nil, nil
	secret.Data = map[string][]byte{"password": []byte("mine")}
	if err := k8s.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	eventually(t, "precise condition", func() error {
		a := getAgent(t, ns, "squatted")
		if err := conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionRegistered, metav1.ConditionFalse, a2av1.ReasonCredentialsConflict); err != nil {
			return err
		}
		if c := findCondition(a, a2av1.ConditionReady); !strings.Contains(c.Message, "Secret squatted-mqtt-credentials exists and is not owned by this Agent") {
			return fmt.Errorf("Ready message %q", c.Message)
		}
		if a.Status.PublishedCardDigest != digest {
			return fmt.Errorf("publishedCardDigest lost: %q, want %q", a.Status.PublishedCardDigest, digest)
		}
		return nil
	})
}

func findCondition(a *a2av1.Agent, t string) metav1.Condition {
	for _, c := range a.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return metav1.Condition{}
}

// metric reads a counter of the controller-runtime registry.
func metric(name string, labels map[string]string) float64 {
	families, _ := ctrlmetrics.Registry.Gather()
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if matches(m, labels) {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func matches(m *dto.Metric, labels map[string]string) bool {
	for k, v := range labels {
		found := false
		for _, l := range m.GetLabel() {
			found = found || (l.GetName() == k && l.GetValue() == v)
		}
		if !found {
			return false
		}
	}
	return true
}

// TestInvalidCallersIsTerminal: a selector that cannot be evaluated (admission refuses bad
// operators and values; a bad label key passes it) is reported as InvalidCallers and not retried
// until the spec changes.
func TestInvalidCallersIsTerminal(t *testing.T) {
	ns := brokeredNamespace
	terminalBefore := metric("controller_runtime_terminal_reconcile_errors_total", map[string]string{"controller": "agent"})
	spec := "  callers:\n    from:\n    - agentSelector: {matchExpressions: [{key: 'not a label key!', operator: Exists}]}\n"
	if err := applyYAML(ns, agentManifest("picky", "acme", "keys", nil, spec)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "InvalidCallers", func() error {
		a := getAgent(t, ns, "picky")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonInvalidCallers)
	})
	// Every reconcile of the Agent starts by reading it: count those reads.
	time.Sleep(time.Second)
	readsBefore := writes.count("get Agent " + ns + "/picky")
	time.Sleep(3 * time.Second) // a hot retry would run several times in this window
	if d := writes.count("get Agent "+ns+"/picky") - readsBefore; d > 0 {
		t.Errorf("the Agent was reconciled %d more times after a terminal InvalidCallers", d)
	}
	if d := metric("controller_runtime_terminal_reconcile_errors_total", map[string]string{"controller": "agent"}) - terminalBefore; d < 1 || d > 2 {
		t.Errorf("terminal errors: %v, want 1 (2 if a second event raced)", d)
	}
	if reg, _ := registrar.counts("acme/keys/picky"); reg != 0 {
		t.Errorf("an Agent with invalid callers was registered %d times", reg)
	}
	updateAgent(t, ns, "picky", func(a *a2av1.Agent) { a.Spec.Callers.From = nil })
	eventually(t, "fixed by a spec change", func() error {
		a := getAgent(t, ns, "picky")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled)
	})
}

// TestWorkloadWritesAndCredentialRolls: the workload Deployment is server-side applied once; a
// reconcile with no spec change (here: the Deployment becoming available) sends no Deployment
// write; a rotation and a re-created Secret change the pod template's credentials checksum (the
// Deployment rolls) and each credential change is an Event.
func TestWorkloadWritesAndCredentialRolls(t *testing.T) {
	ctx := context.Background()
	ns := brokeredNamespace
	workload := "  workload:\n    template:\n      spec:\n        containers:\n        - {name: agent, image: example/agent:1}\n"
	if err := applyYAML(ns, agentManifest("roller", "acme", "ops", nil, workload)); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: ns, Name: "roller-agent"}
	deploy := &appsv1.Deployment{}
	eventually(t, "deployment applied", func() error { return k8s.Get(ctx, key, deploy) })
	checksum := deploy.Spec.Template.Annotations[controllers.AnnotationCredentialsChecksum]
	if checksum == "" {
		t.Fatal("no credentials checksum in the pod template")
	}
	deploymentWrites := func() int {
		n := 0
		for _, verb := range []string{"create", "update", "patch", "apply", "delete"} {
			n += writes.count(verb + " Deployment " + ns + "/roller-agent")
		}
		return n
	}
	// The baseline is taken once the status says what the apply left (registered, ACLs
	// synced, only the workload progressing): counted earlier, that status write would land
	// inside the window below (seen: 2 writes counted for one change).
	eventually(t, "status written after the apply", func() error {
		a := getAgent(t, ns, "roller")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionFalse, controllers.ReasonWorkloadProgressing)
	})
	applies := deploymentWrites()
	statusWrites := writes.count("Agent/status " + ns + "/roller")

	// envtest runs no deployment controller: play its part. The Agent reconciles (its status
	// changes) but the Deployment is not written again.
	deploy.Status = appsv1.DeploymentStatus{Replicas: 1, AvailableReplicas: 1, ReadyReplicas: 1,
		Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue,
			LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "MinimumReplicasAvailable"}}}
	if err := k8s.Status().Update(ctx, deploy); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready once available", func() error {
		a := getAgent(t, ns, "roller")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled)
	})
	if n := deploymentWrites(); n != applies {
		t.Errorf("a reconcile without a spec change wrote the Deployment %d times", n-applies)
	}
	if n := writes.count("Agent/status " + ns + "/roller"); n != statusWrites+1 {
		t.Errorf("status writes for one availability change: %d, want 1", n-statusWrites)
	}

	rolled := func(what string) {
		t.Helper()
		eventually(t, what, func() error {
			d := &appsv1.Deployment{}
			if err := k8s.Get(ctx, key, d); err != nil {
				return err
			}
			now := d.Spec.Template.Annotations[controllers.AnnotationCredentialsChecksum]
			if now == checksum {
				return fmt.Errorf("checksum unchanged")
			}
			checksum = now
			return nil
		})
	}
	updateAgent(t, ns, "roller", func(a *a2av1.Agent) {
		a.Annotations = map[string]string{controllers.AnnotationRotateCredentials: "r1"}
	})
	rolled("rotation rolls the Deployment")
	eventually(t, "CredentialsRotated event", func() error { return expectEvent(ns, "roller", controllers.EventCredentialsRotated) })

	if err := k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "roller-mqtt-credentials"}}); err != nil {
		t.Fatal(err)
	}
	rolled("a re-created Secret rolls the Deployment")
	eventually(t, "CredentialsRecreated event", func() error { return expectEvent(ns, "roller", controllers.EventCredentialsRecreate) })
}

// TestWritesPerAgent counts the API writes of one Agent from creation to Ready with a broker:
// the finalizer, the credentials Secret (written once, after the broker has the password) and
// the status (once, when nothing is pending).
func TestWritesPerAgent(t *testing.T) {
	ns := brokeredNamespace
	if err := applyYAML(ns, agentManifest("counted", "acme", "count", nil, "")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready", func() error {
		a := getAgent(t, ns, "counted")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled)
	})
	time.Sleep(2 * time.Second) // let any trailing reconcile write
	finalizer := writes.count("update Agent " + ns + "/counted")
	secret := 0
	for _, verb := range []string{"create", "update", "patch", "apply", "delete"} {
		secret += writes.count(verb + " Secret " + ns + "/counted-mqtt-credentials")
	}
	status := writes.count("Agent/status " + ns + "/counted")
	// A new Agent's first credentials and first Ready are what applying it means: no Event (an
	// Event per Agent of a fleet rollout is an API write each). Events are sent asynchronously,
	// so give them the time the other writes had.
	var evs eventsv1.EventList
	if err := k8s.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, e := range evs.Items {
		if e.Regarding.Name == "counted" {
			events = append(events, e.Reason+": "+e.Note)
		}
	}
	t.Logf("API writes for one Agent, created to Ready: finalizer %d, Secret %d, status %d, Events %d", finalizer, secret, status, len(events))
	if finalizer != 1 || secret != 1 || status < 1 || status > 2 {
		t.Errorf("writes: finalizer %d (want 1), Secret %d (want 1), status %d (want 1, 2 if the shared ACLs were pending)", finalizer, secret, status)
	}
	if len(events) > 0 {
		t.Errorf("a new Agent that became Ready without trouble has Events: %q", events)
	}
}
