package registration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Orphans are the per-agent broker objects whose identity no Agent claims any more: what an Agent
// deleted without its finalizer leaves behind (the finalizer removed by hand, a namespace
// force-deleted, the cluster restored from an etcd backup older than the broker's state). Such a
// client still logs in with the password it was given, so it must not outlive its Agent.
type Orphans struct {
	// Names are the objects to delete: clients, own roles and the per-agent objects of the
	// earlier model.
	Names acl.Names
	// Agents are the identities the objects belonged to (their retained cards are cleared too).
	Agents []a2amqtt.AgentRef
}

// Empty reports whether nothing is orphaned.
func (o Orphans) Empty() bool {
	return len(o.Names.Clients)+len(o.Names.Roles)+len(o.Names.Groups) == 0
}

// perAgentName parses a broker object name of one of the per-agent forms (the client
// "a2a:{org}/{unit}/{agent}", the own role "a2a:agent:…", the earlier model's "a2a:callers:…"
// role and group and "a2a:gate:…" role) into its identity. Any other name, the operator's, the
// service's, the sentinel's and the shared unit, org and gates objects included, is not
// per-agent: ok is false, and the collector never touches it.
func perAgentName(kind, name string) (id a2amqtt.AgentRef, ok bool) {
	var forms []func(a2amqtt.AgentRef) string
	switch kind {
	case "client":
		forms = []func(a2amqtt.AgentRef) string{identity.Username}
	case "role":
		forms = []func(a2amqtt.AgentRef) string{identity.AgentRoleName, identity.CallersRoleName, identity.GateRoleName}
	case "group":
		forms = []func(a2amqtt.AgentRef) string{identity.CallersGroupName}
	}
	for _, form := range forms {
		// Each form is a fixed prefix followed by the client ID: find the prefix from a probe.
		probe := a2amqtt.AgentRef{Org: "o", Unit: "u", Agent: "a"}
		prefix := strings.TrimSuffix(form(probe), probe.ClientID())
		rest, found := strings.CutPrefix(name, prefix)
		if !found {
			continue
		}
		ref, err := a2amqtt.ParseAgentRef(rest)
		// The name must be exactly what the form renders, so nothing but a per-agent name parses.
		if err == nil && form(ref) == name {
			return ref, true
		}
	}
	return a2amqtt.AgentRef{}, false
}

// FindOrphans lists the per-agent objects in observed whose identity claimed does not hold.
// claimed must hold for the identity of every Agent that exists, whatever its status (one
// refused its identity or being deleted included): keeping too much is harmless, deleting a
// live Agent's client disconnects it.
func FindOrphans(observed acl.State, claimed func(a2amqtt.AgentRef) bool) Orphans {
	var out Orphans
	seen := map[a2amqtt.AgentRef]bool{}
	collect := func(kind string, names []string, into *[]string) {
		for _, n := range names {
			id, ok := perAgentName(kind, n)
			if !ok || claimed(id) {
				continue
			}
			*into = append(*into, n)
			if !seen[id] {
				seen[id] = true
				out.Agents = append(out.Agents, id)
			}
		}
	}
	collect("client", sortedNames(observed.Clients), &out.Names.Clients)
	collect("role", sortedNames(observed.Roles), &out.Names.Roles)
	collect("group", sortedNames(observed.Groups), &out.Names.Groups)
	slices.SortFunc(out.Agents, func(a, b a2amqtt.AgentRef) int { return strings.Compare(a.ClientID(), b.ClientID()) })
	return out
}

// confirmed keeps the objects of o that were also orphaned in the previous pass: an object is
// deleted only once it has been an orphan for a whole collection interval, so an identity in the
// middle of being claimed (an Agent created between an observation and the cache read) is never
// taken for an orphan.
func (o Orphans) confirmed(previous Orphans) Orphans {
	keep := func(now, before []string) []string {
		return slices.DeleteFunc(slices.Clone(now), func(n string) bool { return !slices.Contains(before, n) })
	}
	out := Orphans{Names: acl.Names{
		Clients: keep(o.Names.Clients, previous.Names.Clients),
		Roles:   keep(o.Names.Roles, previous.Names.Roles),
		Groups:  keep(o.Names.Groups, previous.Names.Groups),
	}}
	for _, id := range o.Agents {
		if slices.Contains(previous.Agents, id) {
			out.Agents = append(out.Agents, id)
		}
	}
	return out
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// DefaultOrphanInterval is cmd/manager's --broker-orphan-interval default: an orphaned client
// is deleted 10–20 minutes after its Agent went.
const DefaultOrphanInterval = 10 * time.Minute

// orphanCollector deletes orphaned per-agent broker objects, one pass per interval (leader only,
// part of the Broker runtime). It relies on what the identity model already requires: one
// operator per broker (the broker-wide names under identity.BrokerPrefix are this operator's),
// and a manager cache that sees Agents in every namespace (cmd/manager's). It is off when the
// interval is zero (the tests' operators, whose caches are scoped to their namespaces, leave it
// off unless they test it).
type orphanCollector struct {
	b        *Broker
	interval time.Duration
	// suspects are the orphans of the previous pass.
	suspects Orphans
}

// run collects until ctx ends. A failed pass is logged and retried at the next interval: the
// broker or the API server may be down, and nothing is deleted from a partial view.
func (c *orphanCollector) run(ctx context.Context) {
	// A cache still filling would make live Agents look absent: wait for it (the manager starts
	// leader runnables after its caches synced; this holds for any other caller too).
	if c.b.cfg.Cache != nil && !c.b.cfg.Cache.WaitForCacheSync(ctx) {
		return
	}
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		if n, err := c.pass(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			c.b.log.Info("orphaned broker objects not collected this time; retrying at the next interval", "error", err.Error(), "interval", c.interval)
		} else if n > 0 {
			c.b.orphansDeleted.Add(int64(n))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pass observes the broker, then reads the Agents (in that order: an object observed was written
// by a reconcile that read its Agent from the same cache before, so the cache read afterwards
// still holds that Agent unless it was deleted since), deletes what was an orphan in this pass and
// the previous one, and clears those identities' retained cards. It returns how many objects it
// deleted.
func (c *orphanCollector) pass(ctx context.Context) (int, error) {
	observed, err := c.b.cfg.Backend.Observe(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("observe broker: %w", err)
	}
	claimed, err := c.claimed(ctx)
	if err != nil {
		return 0, err
	}
	now := FindOrphans(observed, claimed)
	doomed := now.confirmed(c.suspects)
	c.suspects = now
	if doomed.Empty() {
		return 0, nil
	}
	// Read the Agents once more right before deleting: the window in which an Agent created now
	// could lose its brand-new client is this call's duration, and such a client is re-created by
	// its Agent's next drift check (docs/registration.md, "Orphaned broker objects").
	if claimed, err = c.claimed(ctx); err != nil {
		return 0, err
	}
	doomed = FindOrphans(acl.State{Clients: pick(observed.Clients, doomed.Names.Clients), Roles: pick(observed.Roles, doomed.Names.Roles),
		Groups: pick(observed.Groups, doomed.Names.Groups)}, claimed)
	if doomed.Empty() {
		return 0, nil
	}
	if _, err := acl.Apply(ctx, c.b.cfg.Backend, acl.Desired{Delete: doomed.Names}); err != nil {
		return 0, fmt.Errorf("delete orphaned broker objects: %w", err)
	}
	n := len(doomed.Names.Clients) + len(doomed.Names.Roles) + len(doomed.Names.Groups)
	c.b.log.Info("deleted the broker objects of identities no Agent claims (an Agent deleted without its finalizer)",
		"agents", len(doomed.Agents), "clients", doomed.Names.Clients, "roles", len(doomed.Names.Roles), "groups", len(doomed.Names.Groups))
	for _, id := range doomed.Agents {
		if err := c.b.PublishCard(ctx, id.DiscoveryTopic(), nil, nil); err != nil {
			return n, fmt.Errorf("clear the card of orphaned %s: %w", id, err)
		}
	}
	return n, nil
}

// claimed reads every Agent from the manager's cache and reports whether an identity is one of
// theirs.
func (c *orphanCollector) claimed(ctx context.Context) (func(a2amqtt.AgentRef) bool, error) {
	var agents a2av1.AgentList
	if err := c.b.cfg.Client.List(ctx, &agents, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	ids := make(map[a2amqtt.AgentRef]bool, len(agents.Items))
	for i := range agents.Items {
		ids[identity.Of(&agents.Items[i])] = true
	}
	return func(id a2amqtt.AgentRef) bool { return ids[id] }, nil
}

func pick[V any](m map[string]V, names []string) map[string]V {
	out := make(map[string]V, len(names))
	for _, n := range names {
		if v, ok := m[n]; ok {
			out[n] = v
		}
	}
	return out
}
