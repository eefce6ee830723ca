package registration

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// Broker state loss (a Mosquitto restarted without its dynsec file, a restore of an old backup,
// an embedded broker started with an empty state dir) is found by a sentinel: an empty role,
// identity.SentinelRoleName, that the operator creates and nobody else touches. It is looked
// up every SentinelInterval (one read) and on every reconnect of the admin connection, and
// whenever the card connection is refused. When it is gone, the operator re-creates it and its
// own identity, repairs the service identity and resyncs every Agent at once, instead of
// waiting up to a resync period (10 min) with every Agent wrongly Ready.
//
// A broker restored from a backup taken after the sentinel was created still holds it: such a
// partial loss is repaired by the periodic resync only.

// CheckState asks for a sentinel check now (e.g. after a reconnect).
func (b *Broker) CheckState() {
	select {
	case b.checkNow <- struct{}{}:
	default:
	}
}

// watchState checks the sentinel until ctx ends.
func (b *Broker) watchState(ctx context.Context) {
	t := time.NewTicker(b.cfg.SentinelInterval)
	defer t.Stop()
	first := true
	for {
		if b.checkSentinel(ctx, first) {
			first = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-b.checkNow:
		}
	}
}

var sentinelRole = acl.Role{Name: identity.SentinelRoleName, ACLs: []acl.ACL{}}

// checkSentinel looks for the sentinel and handles a loss; it reports whether the broker
// answered. The first answer after start only creates a missing sentinel: a fresh broker, or
// one that lost its state while no operator ran, and every Agent is reconciled at start anyway.
func (b *Broker) checkSentinel(ctx context.Context, first bool) bool {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := b.cfg.Backend.Observe(rctx, &acl.Names{Roles: []string{identity.SentinelRoleName}})
	if err != nil {
		if ctx.Err() == nil {
			b.log.V(1).Info("broker state check failed; will retry", "err", err.Error())
		}
		return false
	}
	if _, ok := st.Roles[identity.SentinelRoleName]; ok {
		return true
	}
	if err := b.cfg.Backend.Execute(rctx, []acl.Command{{Op: acl.OpCreateRole, Role: sentinelRole.Name, ACLs: sentinelRole.ACLs}}); err != nil {
		b.log.Info("could not create the broker state sentinel; will retry", "err", err.Error())
		return false
	}
	if first {
		b.log.Info("broker state sentinel created", "role", identity.SentinelRoleName)
		return true
	}
	b.lossMu.Lock()
	b.losses++
	b.lastLoss = time.Now()
	b.lossMu.Unlock()
	n := b.resyncAgents(ctx)
	b.log.Info("the broker lost its identities (state sentinel missing): re-creating the operator's and the service's identities and resyncing every Agent",
		"agents", n, "sentinel", identity.SentinelRoleName)
	b.cards.identityLost()
	if b.service != nil {
		b.service.trigger()
	}
	return true
}

// resyncAgents sends one event per Agent on the resync stream (in the background: the stream
// is drained by the Agent controller) and returns how many.
func (b *Broker) resyncAgents(ctx context.Context) int {
	var agents a2av1.AgentList
	if err := b.cfg.Client.List(ctx, &agents); err != nil {
		b.log.Error(err, "list Agents to resync after a broker state loss")
		return 0
	}
	if !b.resyncing.CompareAndSwap(false, true) {
		return len(agents.Items) // a resync of every Agent is already under way
	}
	refs := make([]client.Object, 0, len(agents.Items))
	for i := range agents.Items {
		a := &agents.Items[i]
		refs = append(refs, &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: a.Namespace, Name: a.Name}})
	}
	go func() {
		defer b.resyncing.Store(false)
		for _, obj := range refs {
			select {
			case b.resyncs <- event.TypedGenericEvent[client.Object]{Object: obj}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return len(refs)
}
