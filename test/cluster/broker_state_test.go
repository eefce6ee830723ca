package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// brokerStateSurvivesItsPod deletes the broker's pod with the operator scaled to 0, so that
// nothing could register the identities again: the new pod, on the same claim, still knows the
// console's identity and password, still refuses a wrong one, and still enforces the console's
// ACL (another agent's request inbox refused). Then the operator comes back and every Agent is
// Ready and connected again.
func (b *bus) brokerStateSurvivesItsPod(ctx context.Context, t *testing.T) {
	d, err := env.Clientset.AppsV1().Deployments(Namespace).Get(ctx, operatorDeployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	replicas := ptrOr(d.Spec.Replicas, 1)
	if err := env.Scale(ctx, Namespace, operatorDeployment, 0); err != nil {
		t.Fatal(err)
	}
	scaledBack := false
	t.Cleanup(func() {
		if !scaledBack {
			_ = env.Scale(context.Background(), Namespace, operatorDeployment, replicas)
		}
	})
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
	const selector = "app.kubernetes.io/name=mosquitto"
	old, err := env.Pods(ctx, Namespace, selector)
	if err != nil || len(old) != 1 {
		t.Fatalf("want 1 ready broker pod, got %d (%v)", len(old), err)
	}
	start := time.Now()
	// A graceful delete, as a drain or a reschedule does.
	if err := env.Clientset.CoreV1().Pods(Namespace).Delete(ctx, old[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = Poll(ctx, 3*time.Minute, "a new ready broker pod", func(ctx context.Context) (bool, string, error) {
		pods, err := env.Pods(ctx, Namespace, selector)
		if err != nil {
			return false, "", err
		}
		return len(pods) == 1 && pods[0].UID != old[0].UID, fmt.Sprintf("%d ready pods", len(pods)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("broker pod %s deleted with the operator at 0; a new pod ready %.1fs later", old[0].Name, time.Since(start).Seconds())

	var c *brokertest.Client
	err = Poll(ctx, time.Minute, "the console connects to the new broker pod with its password", func(ctx context.Context) (bool, string, error) {
		var err error
		if c, err = b.connectConsole(t, ""); err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if rc := c.Subscribe("$a2a/v1/request/acme/demo/memory-agent"); rc < 0x80 {
		t.Fatalf("the new broker pod let the console subscribe to memory-agent's request topic: reason 0x%02x, want a refusal", rc)
	}
	if _, err := b.connectConsole(t, "not-the-password"); err == nil {
		t.Fatal("the new broker pod accepts a wrong password")
	} else if re := (*brokertest.RefusedError)(nil); !errors.As(err, &re) {
		t.Fatalf("connect with a wrong password: want a refusal, got %v", err)
	}
	t.Logf("the new broker pod, with no operator to register anyone, knows the console's password, refuses a wrong one and enforces its ACL")

	if err := env.Scale(ctx, Namespace, operatorDeployment, replicas); err != nil {
		t.Fatal(err)
	}
	scaledBack = true
	if err := env.WaitDeployments(ctx, Namespace, 3*time.Minute, operatorDeployment, "a2a-fleet-mosquitto"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, samplesNamespace, 3*time.Minute, true, "confirm", "memory"); err != nil {
		t.Fatal(err)
	}
	t.Logf("operator back; confirm and memory Ready and connected %.1fs after the broker's pod was deleted", time.Since(start).Seconds())
}
