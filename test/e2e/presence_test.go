package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TestConnectedTellsTheTruth, on both brokers: an Agent's Connected condition follows its
// process. An SDK agent given its password once is Connected; its credentials are rotated, the
// broker disconnects it (no Will: a kick) and refuses its CONNECTs with the old password, and
// within 5 s the Agent says Connected=False (Disconnected, with the reason) while Ready stays
// True, and its retained card says offline. A plain-paho agent that publishes no card of its own
// is Connected, and its retained card says online (source broker), which a2actl reads; it goes
// offline when it disconnects. Before, nothing in the status said whether the process was
// connected, and the rotated agent's card said "online" for as long as it stayed unreachable
// (issue 23); the non-SDK agent was always "offline (source broker)" (issue 26).
//
// A never-connected Agent is Connected=False (NotConnected) where the broker reports every
// connection (the embedded broker, Mosquitto with the decision-table plugin: "table") and
// Unknown on Mosquitto with dynsec, whose log tells only what happened since the operator
// subscribed to it.
func TestConnectedTellsTheTruth(t *testing.T) {
	for _, kind := range []string{"mosquitto", "table", "embedded"} {
		t.Run(kind, func(t *testing.T) { connectedTellsTheTruth(t, kind) })
	}
}

func connectedTellsTheTruth(t *testing.T, kind string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := newStack(t, ctx, kind)
	if kind == "mosquitto" {
		waitConnected(t, ctx, st.ns, "story", metav1.ConditionUnknown, a2av1.ReasonPresenceUnknown, 10*time.Second)
	} else {
		waitConnected(t, ctx, st.ns, "story", metav1.ConditionFalse, a2av1.ReasonNotConnected, 10*time.Second)
	}
	st.startService(t, ctx, &clock{}, "r1")
	agent, err := agents.Start(ctx, agents.KindMemory, agents.Options{
		BrokerURL: st.brokerURL, Username: st.usernames["memory"], Password: st.passwords["memory"],
		Agent: ref("memory"), RequestTopic: identity.DeliveryTopic(ref("memory")), Logger: quietLogger(),
		SessionExpiry: a2amqtt.DefaultAgentSessionExpiry, // as the example agents' pods keep one
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Close(context.Background()) })
	raw := startRawAgent(t, ctx, st.addr, st.usernames["raw"], st.passwords["raw"], ref("raw"), identity.DeliveryTopic(ref("raw")))

	watcher := st.requester(t, ctx).Conn()
	for _, name := range []string{"memory", "raw"} {
		waitConnected(t, ctx, st.ns, name, metav1.ConditionTrue, a2av1.ReasonConnected, 10*time.Second)
	}
	waitCard(t, ctx, watcher, "raw", a2amqtt.StatusOnline, 10*time.Second)

	// Rotate memory's credentials: the broker gets the new password and disconnects it; its
	// old password is refused from then on.
	a := &a2av1.Agent{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: "memory"}, a); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(a.DeepCopy())
	rotated := time.Now()
	a.Annotations = map[string]string{"a2a.fleet.dev/rotate-credentials": "presence-test"}
	if err := k8s.Patch(ctx, a, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the agent disconnected by the rotation", func() error {
		if agent.Conn.Healthy(0) == nil {
			return fmt.Errorf("still connected")
		}
		return nil
	})
	kicked := time.Now()
	c := waitConnected(t, ctx, st.ns, "memory", metav1.ConditionFalse, a2av1.ReasonDisconnected, 5*time.Second)
	took := time.Since(kicked)
	waitCard(t, ctx, watcher, "memory", a2amqtt.StatusOffline, 5*time.Second)
	a = &a2av1.Agent{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: "memory"}, a); err != nil {
		t.Fatal(err)
	}
	if !meta.IsStatusConditionTrue(a.Status.Conditions, a2av1.ConditionReady) {
		t.Errorf("Ready is not about the process: %+v", meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionReady))
	}
	if a.Status.Presence == nil || a.Status.Presence.LastDisconnectReason == "" || a.Status.Presence.Source != "Broker" {
		t.Errorf("status.presence: %+v", a.Status.Presence)
	}
	t.Logf("%s: the kicked agent shows Connected=False %s after it lost its connection (%s after the rotation was asked for): %s",
		kind, took.Round(10*time.Millisecond), time.Since(rotated).Round(10*time.Millisecond), c.Message)

	// The new pod: the same agent with the rotated password, while the old one keeps retrying
	// with its old password. It takes over the kicked connection's persistent session, which
	// Mosquitto reports ended a second time after the new connection authenticated: the new
	// connection stays Connected.
	password := ""
	eventually(t, 30*time.Second, "the rotated password in the Secret", func() error {
		sec := &corev1.Secret{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: a.Status.CredentialsSecret}, sec); err != nil {
			return err
		}
		if password = string(sec.Data["password"]); password == st.passwords["memory"] {
			return fmt.Errorf("not rotated yet")
		}
		return nil
	})
	newPod, err := agents.Start(ctx, agents.KindMemory, agents.Options{
		BrokerURL: st.brokerURL, Username: st.usernames["memory"], Password: password,
		Agent: ref("memory"), RequestTopic: identity.DeliveryTopic(ref("memory")), Logger: quietLogger(),
		SessionExpiry: a2amqtt.DefaultAgentSessionExpiry, // as the example agents' pods keep one
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = newPod.Close(context.Background()) })
	c = waitConnected(t, ctx, st.ns, "memory", metav1.ConditionTrue, a2av1.ReasonConnected, 10*time.Second)
	t.Logf("%s: the agent with the rotated password: %s", kind, c.Message)

	_ = raw.c.Disconnect(&paho.Disconnect{})
	gone := time.Now()
	waitConnected(t, ctx, st.ns, "raw", metav1.ConditionFalse, a2av1.ReasonDisconnected, 5*time.Second)
	waitCard(t, ctx, watcher, "raw", a2amqtt.StatusOffline, 5*time.Second)
	t.Logf("%s: the plain-paho agent shows Connected=False %s after it disconnected", kind, time.Since(gone).Round(10*time.Millisecond))
}

// waitConnected waits until the Agent's Connected condition has status and reason.
func waitConnected(t *testing.T, ctx context.Context, ns, name string, status metav1.ConditionStatus, reason string, within time.Duration) *metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	eventually(t, within, fmt.Sprintf("%s Connected=%s (%s)", name, status, reason), func() error {
		a := &a2av1.Agent{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, a); err != nil {
			return err
		}
		c = meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionConnected)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("Connected %+v", c)
		}
		return nil
	})
	return c
}

// waitCard waits until the agent's retained card says status, as a2actl reads it.
func waitCard(t *testing.T, ctx context.Context, conn *a2amqtt.Conn, name, status string, within time.Duration) {
	t.Helper()
	eventually(t, within, fmt.Sprintf("%s's card says %s", name, status), func() error {
		_, p, err := a2amqtt.ResolveCard(ctx, conn, ref(name), time.Second)
		if err != nil {
			return err
		}
		if p.Status != status {
			return fmt.Errorf("card presence %+v", p)
		}
		return nil
	})
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
