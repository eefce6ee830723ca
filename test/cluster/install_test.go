package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// operatorDeployment and operatorPods name the installed operator (both installs).
const (
	operatorDeployment = "a2a-fleet-controller-manager"
	operatorPods       = "app.kubernetes.io/component=operator"
)

// connectConsole dials the installed broker from this machine as the console Agent (an Agent the
// suite's samples create, with no workload of its own), with its password or another one.
func (b *bus) connectConsole(t *testing.T, password string) (*brokertest.Client, error) {
	t.Helper()
	username, err := os.ReadFile(filepath.Join(b.console, "username"))
	if err != nil {
		t.Fatal(err)
	}
	if password == "" {
		data, err := os.ReadFile(filepath.Join(b.console, "password"))
		if err != nil {
			t.Fatal(err)
		}
		password = string(data)
	}
	return brokertest.Dial(t, strings.TrimPrefix(b.broker, "mqtt://"), brokertest.Options{ClientID: "acme/demo/console", Username: string(username), Password: password})
}

// operatorScaledToZero scales the operator to 0 and checks that the broker decides alone, from
// the table it holds: an existing Agent still connects and reads what its ACL grants, is still
// refused what it does not grant, a wrong password is still refused, and a request reaches an
// agent and is answered; then the operator comes back and every Agent is Ready again.
func (b *bus) operatorScaledToZero(ctx context.Context, t *testing.T) {
	d, err := env.Clientset.AppsV1().Deployments(Namespace).Get(ctx, operatorDeployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	replicas := ptrOr(d.Spec.Replicas, 1)
	if err := env.Scale(ctx, Namespace, operatorDeployment, 0); err != nil {
		t.Fatal(err)
	}
	// Scaled back whatever happens, so that the later subtests find the install as it was.
	scaledBack := false
	t.Cleanup(func() {
		if !scaledBack {
			_ = env.Scale(context.Background(), Namespace, operatorDeployment, replicas)
		}
	})
	start := time.Now()
	err = Poll(ctx, 2*time.Minute, "no operator pod left", func(ctx context.Context) (bool, string, error) {
		pods, err := env.Clientset.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: operatorPods})
		if err != nil {
			return false, "", err
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d pods", len(pods.Items)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("operator scaled from %d to 0, its pods gone %.1fs later", replicas, time.Since(start).Seconds())

	c, err := b.connectConsole(t, "")
	if err != nil {
		t.Fatalf("the console's CONNECT with the operator down: %v", err)
	}
	defer c.Close()
	// What its ACL grants: the retained cards of the agents it may call.
	if rc := c.Subscribe("$a2a/v1/discovery/acme/demo/confirm"); rc > 2 {
		t.Fatalf("subscribe to confirm's card with the operator down: reason 0x%02x", rc)
	}
	if m, err := c.Next(10 * time.Second); err != nil || !m.Retain {
		t.Fatalf("no retained card of confirm with the operator down: %v", err)
	}
	// What it does not grant: another agent's request inbox (only that agent subscribes to it).
	if rc := c.Subscribe("$a2a/v1/request/acme/demo/echo"); rc < 0x80 {
		t.Fatalf("the console subscribed to echo's request topic with the operator down: reason 0x%02x, want a refusal", rc)
	} else {
		t.Logf("echo's request topic refused to the console with the operator down: reason 0x%02x", rc)
	}
	if _, err := b.connectConsole(t, "not-the-password"); err == nil {
		t.Fatal("the broker accepts a wrong password with the operator down")
	} else if re := (*brokertest.RefusedError)(nil); !errors.As(err, &re) {
		t.Fatalf("connect with a wrong password: want a refusal, got %v", err)
	}
	_, _, state, out := b.send(ctx, t, time.Minute, "acme/demo/echo", "with the operator down")
	if state != "completed" || !strings.Contains(out, "with the operator down") {
		t.Fatalf("echo does not answer with the operator down (%s):\n%s", state, out)
	}
	t.Logf("with the operator down: CONNECT, granted and refused SUBSCRIBE, wrong password refused, echo answered")

	if err := env.Scale(ctx, Namespace, operatorDeployment, replicas); err != nil {
		t.Fatal(err)
	}
	scaledBack = true
	if err := env.WaitDeployments(ctx, Namespace, 3*time.Minute, operatorDeployment); err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, samplesNamespace, 2*time.Minute, true, sampleAgents...); err != nil {
		t.Fatal(err)
	}
	t.Logf("operator back to %d replicas and every Agent Ready and connected %.1fs after the scale-down", replicas, time.Since(start).Seconds())
}

// brokerStateOnVolume checks that the broker's identities live on its PersistentVolumeClaim (the
// volume mounted at /mosquitto/data): the table plugin's bbolt file, or dynsec's JSON file.
func brokerStateOnVolume(ctx context.Context, t *testing.T, file string) {
	t.Helper()
	pods, err := env.Pods(ctx, Namespace, "app.kubernetes.io/name=mosquitto")
	if err != nil || len(pods) != 1 {
		t.Fatalf("want 1 ready broker pod, got %d (%v)", len(pods), err)
	}
	claim := ""
	for _, v := range pods[0].Spec.Volumes {
		if v.Name == "data" && v.PersistentVolumeClaim != nil {
			claim = v.PersistentVolumeClaim.ClaimName
		}
	}
	if claim == "" {
		t.Fatalf("the broker's data volume is no PersistentVolumeClaim: %+v", pods[0].Spec.Volumes)
	}
	out, err := env.Exec(ctx, Namespace, pods[0].Name, "mosquitto", "ls", "-l", "/mosquitto/data/"+file)
	if err != nil {
		t.Fatalf("the broker's state /mosquitto/data/%s: %v", file, err)
	}
	t.Logf("broker state on the claim %s: %s", claim, strings.TrimSpace(out))
}

// connectedCondition waits until the Agent's Connected condition has status and reason and
// returns it.
func connectedCondition(ctx context.Context, t *testing.T, name string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	err := Poll(ctx, time.Minute, fmt.Sprintf("%s Connected=%s (%s)", name, status, reason), func(ctx context.Context) (bool, string, error) {
		a := &a2av1.Agent{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: name}, a); err != nil {
			return false, "", err
		}
		c = meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionConnected)
		if c == nil {
			return false, "no Connected condition", nil
		}
		return c.Status == status && c.Reason == reason, fmt.Sprintf("%s (%s): %s", c.Status, c.Reason, c.Message), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// neverConnected creates an Agent without a workload (as the console sample, which the suite's
// a2actl has connected as by then) and checks that it is Connected=False (NotConnected) on the
// shipped broker: the decision-table plugin reports every connection, so the operator knows
// that none is this client ID's (on dynsec it would be Unknown). The Agent is deleted after.
func neverConnected(ctx context.Context, t *testing.T) {
	a := &a2av1.Agent{
		ObjectMeta: metav1.ObjectMeta{Namespace: samplesNamespace, Name: "never-connected", Labels: map[string]string{"a2a.fleet.dev/team": "demo"}},
		Spec: a2av1.AgentSpec{OrgID: "acme", UnitID: "demo", Callers: a2av1.CallersSpec{Scope: a2av1.CallerScopeNone},
			Card: a2av1.AgentCardSpec{Name: "Never connected", Description: "An identity no process uses."}},
	}
	if err := env.Client.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), a); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %s: %v", a.Name, err)
		}
	})
	c := connectedCondition(ctx, t, a.Name, metav1.ConditionFalse, a2av1.ReasonNotConnected)
	t.Logf("%s: Connected=False (NotConnected): %s", a.Name, c.Message)
}

// connectedSince checks that the Agent is Connected=True and that the broker's last connect of its
// client ID is no earlier than after (a second's truncation allowed): its current process's
// connection, not an older one.
func connectedSince(ctx context.Context, t *testing.T, name string, after time.Time) {
	c := connectedCondition(ctx, t, name, metav1.ConditionTrue, a2av1.ReasonConnected)
	a := &a2av1.Agent{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: name}, a); err != nil {
		t.Fatal(err)
	}
	if p := a.Status.Presence; p == nil || p.LastConnectTime == nil || p.LastConnectTime.Time.Before(after.Truncate(time.Second)) {
		t.Fatalf("%s: status.presence %+v: want a connect after %s (%s)", name, p, after.UTC().Format(time.RFC3339), c.Message)
	}
	t.Logf("%s: Connected=True: %s", name, c.Message)
}
