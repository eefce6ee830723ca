package security_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

func eventually(t testing.TB, what string, check func() error) {
	t.Helper()
	testenv.Eventually(t, 45*time.Second, what, check)
}

// create creates the object a manifest describes in ns ("" for cluster-scoped or as written).
func create(t testing.TB, ctx context.Context, c client.Client, ns, manifest string) error {
	t.Helper()
	return testenv.Create(ctx, c, ns, manifest)
}

func mustCreate(t testing.TB, ctx context.Context, ns, manifest string) {
	t.Helper()
	if err := create(t, ctx, k8s, ns, manifest); err != nil {
		t.Fatalf("create: %v\n%s", err, manifest)
	}
}

// agentYAML is an Agent manifest.
func agentYAML(name, org, unit, labels, extra string) string {
	if labels == "" {
		labels = "{}"
	}
	return fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: %s, labels: %s}
spec:
  orgID: %s
  unitID: %s
  card: {name: %s, description: security suite agent}
%s`, name, labels, org, unit, name, extra)
}

func getAgent(t testing.TB, ctx context.Context, ns, name string) *a2av1.Agent {
	t.Helper()
	a := &a2av1.Agent{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, a); err != nil {
		t.Fatalf("get agent %s/%s: %v", ns, name, err)
	}
	return a
}

// condition waits until an Agent's condition has the status and reason (and the message contains
// msg) and returns the Agent.
func condition(t testing.TB, ctx context.Context, ns, name, condType string, status metav1.ConditionStatus, reason, msg string) *a2av1.Agent {
	t.Helper()
	var a *a2av1.Agent
	eventually(t, fmt.Sprintf("%s/%s %s=%s/%s", ns, name, condType, status, reason), func() error {
		a = &a2av1.Agent{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, a); err != nil {
			return err
		}
		c := meta.FindStatusCondition(a.Status.Conditions, condType)
		if c == nil || c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) || c.ObservedGeneration != a.Generation {
			return fmt.Errorf("%s = %+v", condType, c)
		}
		return nil
	})
	return a
}

// ready waits for an Agent to be Ready and returns its broker password.
func ready(t testing.TB, ctx context.Context, ns, name string) string {
	t.Helper()
	a := condition(t, ctx, ns, name, a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonReconciled, "")
	s := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: a.Status.CredentialsSecret}, s); err != nil {
		t.Fatalf("credentials of %s/%s: %v", ns, name, err)
	}
	return string(s.Data["password"])
}

// mqttClient is the suites' one test MQTT client: raw paho v5, no reconnects, every disconnect
// visible.
type mqttClient = brokertest.Client

func dial(t testing.TB, addr, username, clientID, password string) (*mqttClient, error) {
	t.Helper()
	return brokertest.Dial(t, addr, brokertest.Options{Username: username, ClientID: clientID, Password: password, IgnoreMessages: true})
}

func connectAgent(t testing.TB, _ context.Context, addr, clientID, password string) *mqttClient {
	t.Helper()
	return testenv.DialAgent(t, addr, clientID, password)
}

// publishVerdict sends a QoS 1 publish and reads the broker's verdict from the PUBACK.
func publishVerdict(ctx context.Context, c *mqttClient, topic string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.Paho().Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(`{}`)})
	if resp != nil {
		return resp.ReasonCode < 0x80, nil
	}
	return false, err
}

func mayPublish(t testing.TB, ctx context.Context, c *mqttClient, topic string) bool {
	t.Helper()
	ok, err := publishVerdict(ctx, c, topic)
	if err != nil {
		t.Fatalf("%s publish %s: %v", c.Name(), topic, err)
	}
	return ok
}

// maySubscribe subscribes and reads the verdict from the SUBACK, then unsubscribes.
func maySubscribe(t testing.TB, ctx context.Context, c *mqttClient, filter string) bool {
	t.Helper()
	ack, err := c.Paho().Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if ack == nil || len(ack.Reasons) != 1 {
		t.Fatalf("%s subscribe %s: %v", c.Name(), filter, err)
	}
	if ack.Reasons[0] >= 0x80 {
		return false
	}
	_, _ = c.Paho().Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{filter}})
	return true
}

// eventuallyPublish waits until c's publish verdict on topic is want.
func eventuallyPublish(t testing.TB, ctx context.Context, c *mqttClient, topic string, want bool) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s publish %s allowed=%v", c.Name(), topic, want), func() error {
		got, err := publishVerdict(ctx, c, topic)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("allowed=%v", got)
		}
		return nil
	})
}

// noKicks fails the test for every client that saw a disconnect.
func noKicks(t testing.TB, what string, clients ...*mqttClient) {
	t.Helper()
	for _, c := range clients {
		if ev := c.Kicks(); len(ev) > 0 {
			t.Errorf("%s: %s was disconnected %d times: %v", what, c.Name(), len(ev), ev)
		}
	}
}
