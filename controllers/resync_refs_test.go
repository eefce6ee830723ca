package controllers

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
)

// The broker runtime sends bare references (namespace and name) after a broker state loss; the
// shared objects marked lost must be the Agent's own (unit:acme/lab, org:acme, gates), read
// from its spec, not the empty keys of a bare reference ("unit:/", "org:"), or ACLsSynced stays
// True while the broker has none of the shared grants and nobody re-applies them.
func TestBrokerResyncsCompleteBareReferences(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := a2av1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	agent := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "worker", UID: "u1"},
		Spec: a2av1.AgentSpec{OrgID: "acme", UnitID: "lab"}}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(agent).Build()

	tracker := NewSharedTracker()
	keys := registration.KeysOf(identity.Of(agent), true)
	for _, k := range keys {
		tracker.applied[k] = map[types.UID]trackedEntry{"u1": {digest: "applied", namespace: "ns", name: "worker"}}
	}
	in := make(chan event.TypedGenericEvent[client.Object], 1)
	b := newBrokerResyncs(in, tracker, true, reader)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() { _ = b.Start(ctx) }()
	in <- event.TypedGenericEvent[client.Object]{Object: &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "worker"}}}

	select {
	case e := <-b.out:
		if e.Object.GetName() != "worker" {
			t.Fatalf("forwarded %s", e.Object.GetName())
		}
	case <-ctx.Done():
		t.Fatal("the event was not forwarded to the Agent controller")
	}
	var poked []string
	for range keys {
		select {
		case p := <-tracker.pokes:
			poked = append(poked, p.Object.GetName())
		case <-ctx.Done():
			t.Fatalf("pokes: %v", poked)
		}
	}
	for _, k := range keys {
		if !slices.Contains(poked, k.String()) {
			t.Errorf("shared object %s not re-applied (pokes %v)", k, poked)
		}
		tracker.mu.Lock()
		entries := len(tracker.applied[k])
		tracker.mu.Unlock()
		if entries != 0 {
			t.Errorf("shared object %s still counts the Agent's entries after the loss", k)
		}
	}
}
