package controllers

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
)

// brokerResyncs turns the broker runtime's "the broker lost its state" stream (one event per
// Agent, registration.Broker.AgentResyncs) into work for both controllers that hold broker
// state: the Agent is reconciled again (its client and role are re-created), and its shared
// objects are marked lost and re-applied (their entries are computed from the cache, so nothing
// else remembers them). Marking them lost first keeps ACLsSynced honest meanwhile: it reads False
// until the shared objects hold the Agent's entries again. And the Agent's first reconcile after
// the loss writes that first (Registered and ACLsSynced False, reason BrokerStateLost) before it
// repairs: a repair faster than the status write (the shared objects re-applied before the
// Agent's turn) would otherwise leave no trace of the loss in its status.
type brokerResyncs struct {
	// lost holds the Agents the broker lost and whose status has not said so yet (takeLost).
	lostMu sync.Mutex
	lost   map[types.NamespacedName]time.Time

	in      <-chan event.TypedGenericEvent[client.Object]
	out     chan event.GenericEvent
	tracker *SharedTracker
	gating  bool
	// reader completes the events' Agents: the stream may carry bare references (namespace and
	// name, as registration.Broker sends them), and the shared keys come from the identity in the
	// spec.
	reader client.Reader
}

func newBrokerResyncs(in <-chan event.TypedGenericEvent[client.Object], tracker *SharedTracker, gating bool, reader client.Reader) *brokerResyncs {
	return &brokerResyncs{in: in, out: make(chan event.GenericEvent, 1024), tracker: tracker, gating: gating, reader: reader,
		lost: map[types.NamespacedName]time.Time{}}
}

// ReasonBrokerStateLost: the broker lost the Agent's client, role and shared grants (a broker
// restored without its state); the operator is registering it again.
const ReasonBrokerStateLost = "BrokerStateLost"

// takeLost reports (once) that the broker lost the Agent's state since its last reconcile, and
// since when: its next status must say so before the repair makes it True again, however fast
// the repair is.
func (b *brokerResyncs) takeLost(agent *a2av1.Agent) (time.Time, bool) {
	if b == nil {
		return time.Time{}, false
	}
	b.lostMu.Lock()
	defer b.lostMu.Unlock()
	key := client.ObjectKeyFromObject(agent)
	since, ok := b.lost[key]
	delete(b.lost, key)
	return since, ok
}

func (b *brokerResyncs) markLostAgent(a *a2av1.Agent) {
	b.lostMu.Lock()
	defer b.lostMu.Unlock()
	key := client.ObjectKeyFromObject(a)
	if _, already := b.lost[key]; !already {
		b.lost[key] = time.Now()
	}
}

// Start forwards events until the manager stops (a manager.Runnable, leader only: the broker
// runtime that feeds it runs on the leader).
func (b *brokerResyncs) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-b.in:
			if !ok {
				return nil
			}
			if a, isAgent := e.Object.(*a2av1.Agent); isAgent {
				b.markLostAgent(a)
			}
			if a, isAgent := e.Object.(*a2av1.Agent); isAgent && b.tracker != nil {
				if a = b.complete(ctx, a); a != nil {
					keys := registration.KeysOf(identity.Of(a), b.gating)
					b.tracker.markLost(keys...)
					b.tracker.Poke(ctx, keys...)
				}
			}
			select {
			case b.out <- event.GenericEvent(e):
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// complete returns a with its spec: as sent when it has one, else from the reader (nil when the
// Agent is gone: its reconcile has nothing to restore, and a deletion re-applies its shared
// objects anyway).
func (b *brokerResyncs) complete(ctx context.Context, a *a2av1.Agent) *a2av1.Agent {
	if a.Spec.OrgID != "" || b.reader == nil {
		return a
	}
	full := &a2av1.Agent{}
	if err := b.reader.Get(ctx, client.ObjectKeyFromObject(a), full); err != nil {
		return nil
	}
	return full
}

// NeedLeaderElection: only the leader reconciles.
func (b *brokerResyncs) NeedLeaderElection() bool { return true }

// source enqueues the forwarded Agents into the Agent controller.
func (b *brokerResyncs) source() source.Source {
	return source.Channel(b.out, &handler.EnqueueRequestForObject{})
}

// markLost forgets what the shared objects keys held: the broker lost them. Agents with entries
// in them read "not included" until the objects are applied again.
func (t *SharedTracker) markLost(keys ...registration.SharedKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		t.applied[k] = map[types.UID]trackedEntry{}
	}
}
