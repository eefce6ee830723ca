package registration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// TestRolloutRequestsPerAgent counts the operator's requests to kube-apiserver (on its HTTP
// transport) while 50 new Agents become Ready: per Agent one Secret create, one finalizer update
// and about one status patch, and no read of a Secret from the API server (a new Agent's Secret
// cannot exist yet but for a foreign one, which its create finds). Counted, not timed: the
// rollout's cost is kube-apiserver's CPU per request (docs/benchmarks.md, "Where the time goes").
func TestRolloutRequestsPerAgent(t *testing.T) {
	const n = 50
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("start embedded broker: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	ns := map[string]string{}
	for _, org := range []string{"org0", "org1"} {
		ns[org] = cp.NewNamespace(t, ctx, "requests-")
		cp.BindNamespace(t, ctx, ns[org], org)
	}
	cfg := rest.CopyConfig(cp.Config)
	counted := operatorClientConfig(cfg)
	cp.StartOperatorWith(t, ctx, testenv.Operator{Config: cfg, Namespaces: ns,
		Broker: registration.BrokerConfig{URL: srv.URL(), Backend: srv.Backend()}})
	writesBefore, readsBefore := counted.snapshot(), counted.snapshotReads()

	for i := range n {
		if err := k8s.Create(ctx, benchAgent(ns, i)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d Agents Ready", n), func() error {
		ready := 0
		for _, namespace := range ns {
			var list a2av1.AgentList
			if err := k8s.List(ctx, &list, client.InNamespace(namespace)); err != nil {
				return err
			}
			for _, a := range list.Items {
				if meta.IsStatusConditionTrue(a.Status.Conditions, a2av1.ConditionReady) {
					ready++
				}
			}
		}
		if ready < n {
			return fmt.Errorf("%d of %d Ready", ready, n)
		}
		return nil
	})
	// Quiet: the operator writes nothing more for Agents that are Ready.
	writes, reads := delta(counted.snapshot(), writesBefore), delta(counted.snapshotReads(), readsBefore)
	t.Logf("operator requests for %d new Agents: writes %v, reads %v", n, writes, reads)

	// None on a first reconcile (the old code read one per Agent); a reconcile retried after a
	// failure part-way (a broker timeout on a loaded machine) reads its Secret, a few are tolerated.
	if got := reads["GET secrets"]; got > 5 {
		t.Errorf("the operator read %d Secrets from the API server for %d new Agents, want 0 (the cache, and the create, answer)", got, n)
	}
	// One each; a request retried after a failure (a conflict, a timeout on a loaded machine)
	// counts again, a few are tolerated.
	for _, want := range []string{"POST secrets", "PUT agents"} {
		if got := writes[want]; got < n || got > n+5 {
			t.Errorf("%s: %d for %d new Agents, want one each", want, got, n)
		}
	}
	// A status patch per Agent, and one more for an Agent that waited for a shared role
	// (SharedACLsPending on the way to Ready).
	if got := writes["PATCH agents/status"]; got < n || got > 2*n {
		t.Errorf("PATCH agents/status: %d for %d new Agents, want %d to %d", got, n, n, 2*n)
	}
	for k := range writes {
		switch {
		case k == "POST secrets", k == "PUT agents", k == "PATCH agents/status":
		case strings.Contains(k, "/tenants/") && strings.HasSuffix(k, "/status"):
			// The Tenants' status counts their Agents: paced, not per Agent.
		default:
			t.Errorf("other writes during the rollout: %v", writes)
		}
	}
}

// delta is after minus before, by key, without the keys that did not move.
func delta(after, before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
