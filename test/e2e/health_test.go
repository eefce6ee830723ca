package e2e

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// TestReadinessFollowsTheBroker: /readyz (Service.Ready) fails while the
// broker is gone for longer than the grace period, and the replica serves
// again, with no restart, when the broker is back (issue 9).
func TestReadinessFollowsTheBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := newStack(t, ctx, "mosquitto")
	svc := st.startServiceCfg(t, ctx, &clock{}, "health", func(c *convservice.Config) { c.ReadinessGrace = 500 * time.Millisecond })
	if err := svc.Ready(ctx); err != nil {
		t.Fatalf("not ready at start: %v", err)
	}
	st.mosquitto.Kill()
	eventually(t, 20*time.Second, "readiness fails while the broker is down", func() error {
		if err := svc.Ready(ctx); err == nil {
			return errors.New("still ready")
		}
		return nil
	})
	t.Logf("with the broker down: %v", svc.Ready(ctx))
	if err := st.mosquitto.Restart(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "ready again once the broker is back", func() error { return svc.Ready(ctx) })
	// And it serves: the subscriptions came back with the session. (The
	// plain-paho test agent does not reconnect by itself: it connects now.)
	startRawAgent(t, ctx, st.addr, st.usernames["raw"], st.passwords["raw"], ref("raw"), identity.DeliveryTopic(ref("raw")))
	r := st.requester(t, ctx)
	eventually(t, 30*time.Second, "a request through the service after the broker restart", func() error {
		res, err := send(ctx, r.Transport(ref("raw")), uuid.NewString(), uuid.NewString(), "back")
		if err == nil && state(res) != a2a.TaskStateCompleted {
			err = errors.New(string(state(res)))
		}
		return err
	})
}

// TestServiceWaitsForTheBroker: a replica started while the broker is down (an install's start,
// where the broker's pod comes up after the service's) keeps trying, not ready, and serves once
// the broker is there, instead of exiting (found on kind: the service's pod restarted once).
func TestServiceWaitsForTheBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := newStack(t, ctx, "mosquitto")
	st.mosquitto.Kill()
	started := make(chan error, 1)
	go func() {
		svc, err := convservice.Start(ctx, convservice.Config{
			BrokerURL: st.brokerURL, Username: st.svcUser, Password: st.svcPass, ReplicaID: "late-broker",
			Store: "bolt:" + filepath.Join(t.TempDir(), "state.db"), BoltNoSync: true,
			RestConfig: restCfg, Namespace: st.ns, Logger: serviceLogger(t), CallerRate: -1,
		})
		if err == nil {
			t.Cleanup(func() { _ = svc.Close() })
		}
		started <- err
	}()
	select {
	case err := <-started:
		t.Fatalf("Start returned while the broker was down (the replica would exit): %v", err)
	case <-time.After(15 * time.Second): // longer than a connect attempt (10 s)
	}
	if err := st.mosquitto.Restart(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("Start failed once the broker was back: %v", err)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("Start still waiting 45 s after the broker came back")
	}
}
