// Package registration turns an Agent into a live, least-privilege identity on the broker: a
// client with exactly the topic ACLs the A2A over MQTT profile needs, and a retained agent card.
//
// The ACL model is built so that no change to one Agent or policy disconnects any other client
// (docs/registration.md, "No collateral kicks"):
//
//   - every agent has one client and one own role; the client joins its unit and org groups when
//     it is created (inline groups of createClient, no kick) and never changes groups again;
//   - each unit and org group holds exactly one fixed shared role whose ACL list says whom the
//     scope admits (publish to the request and pool topics of the SameUnit/SameOrg agents; the
//     org's discovery topics). Shared roles change by modifyRole only, which kicks nobody;
//   - a caller admitted by another agent's callers.from gets "publish to that agent's request
//     topic, read its card" in its own role (modifyRole, no kick when gaining);
//   - the conversation service reaches every gated agent through one gates role in its group,
//     also changed by modifyRole only.
//
// Shared role content is computed from the Kubernetes cache (the live members of the unit, org
// or gate), never read-modify-written from the broker, so concurrent reconciles of different
// agents cannot lose each other's entries.
package registration

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// Member is how a live agent appears in the ACLs of others: the shared roles of its unit and org
// (by scope), the gates role (when gated), and the own roles of the callers it selects.
type Member struct {
	Agent a2amqtt.AgentRef
	Scope a2av1.CallerScope
	// Pool is the pool the agent is a member of ("" when none, or when it may not join it).
	Pool string
	// Gated: a ConversationPolicy governs the agent and the conversation service stands in front.
	Gated bool
}

// callerACLs is what a caller admitted to m may do: publish to its request (and pool) topic, read
// its card when it is of another org (same-org callers read every card of the org through the org
// role), and, for a gated agent, ask the conversation service about the contexts it opened.
func callerACLs(m Member, crossOrg bool) []acl.ACL {
	out := []acl.ACL{{Type: acl.PublishClientSend, Topic: m.Agent.RequestTopic(), Allow: true}}
	if m.Pool != "" {
		out = append(out, acl.ACL{Type: acl.PublishClientSend, Topic: poolRef(m.Agent, m.Pool).RequestTopic(), Allow: true})
	}
	if crossOrg {
		out = append(out, acl.ACL{Type: acl.SubscribeLiteral, Topic: m.Agent.DiscoveryTopic(), Allow: true})
	}
	if m.Gated {
		out = append(out, acl.ACL{Type: acl.PublishClientSend, Topic: identity.Service.RequestTopic(), Allow: true})
	}
	return out
}

func poolRef(id a2amqtt.AgentRef, pool string) a2amqtt.PoolRef {
	return a2amqtt.PoolRef{Org: id.Org, Unit: id.Unit, Pool: pool}
}

// Input is everything the agent's own broker objects depend on.
type Input struct {
	Agent a2amqtt.AgentRef
	Scope a2av1.CallerScope
	// Pool is the pool the agent is a member of ("" when none or not granted).
	Pool string
	// Gated puts the conversation service in front of the agent: it reads its delivery topic,
	// replies only to the service, and gets no reply grant to any caller.
	Gated bool
	// Callers are the live agents its callers.from selectors admit (with their namespaces'
	// consent): it may publish replies to them (unless gated).
	Callers []a2amqtt.AgentRef
	// Callees are the live agents whose callers.from selectors admit this agent: it may call them.
	Callees []Member
	// Observed is the broker's view of OwnNames(Agent).
	Observed acl.State
}

// OwnNames lists the broker objects Compile needs observed: the agent's client and role, its unit
// and org groups (only whether they exist), and the objects of the earlier per-agent model that
// Compile deletes when it finds them.
func OwnNames(id a2amqtt.AgentRef) acl.Names {
	return acl.Names{
		Clients: []string{identity.Username(id)},
		Roles:   []string{identity.AgentRoleName(id), identity.CallersRoleName(id), identity.GateRoleName(id)},
		Groups:  []string{identity.UnitGroupName(id.Org, id.Unit), identity.OrgGroupName(id.Org), identity.CallersGroupName(id)},
	}
}

// Compile returns the agent's own broker objects. Password handling is the caller's.
func Compile(in Input) acl.Desired {
	id := in.Agent
	own := acl.Role{Name: identity.AgentRoleName(id), ACLs: []acl.ACL{
		{Type: acl.SubscribePattern, Topic: id.Topic(a2amqtt.MethodReply) + "/#", Allow: true},
		{Type: acl.PublishClientSend, Topic: id.DiscoveryTopic(), Allow: true},
		{Type: acl.PublishClientSend, Topic: id.EventTopic(), Allow: true},
	}}
	if in.Gated {
		own.ACLs = append(own.ACLs,
			acl.ACL{Type: acl.SubscribeLiteral, Topic: identity.DeliveryTopic(id), Allow: true},
			// Replies go to the service, which relays them; history queries go to it too. No reply
			// grant to any caller: a gated agent answers only through the service.
			acl.ACL{Type: acl.PublishClientSend, Topic: identity.ServiceReplyFilter(), Allow: true},
			acl.ACL{Type: acl.PublishClientSend, Topic: identity.Service.RequestTopic(), Allow: true})
	} else {
		own.ACLs = append(own.ACLs, acl.ACL{Type: acl.SubscribeLiteral, Topic: id.RequestTopic(), Allow: true})
		switch in.Scope {
		case a2av1.CallerScopeSameUnit:
			own.ACLs = append(own.ACLs, acl.ACL{Type: acl.PublishClientSend, Topic: a2amqtt.MethodFilter(a2amqtt.MethodReply, id.Org, id.Unit), Allow: true})
		case a2av1.CallerScopeSameOrg:
			own.ACLs = append(own.ACLs, acl.ACL{Type: acl.PublishClientSend, Topic: a2amqtt.MethodFilter(a2amqtt.MethodReply, id.Org), Allow: true})
		}
		for _, c := range sortedRefs(in.Callers) {
			if c != id {
				own.ACLs = append(own.ACLs, acl.ACL{Type: acl.PublishClientSend, Topic: c.Topic(a2amqtt.MethodReply) + "/#", Allow: true})
			}
		}
	}
	if in.Pool != "" {
		own.ACLs = append(own.ACLs, acl.ACL{Type: acl.SubscribeLiteral, Topic: poolRef(id, in.Pool).SharedSubscription(), Allow: true})
	}
	callees := slices.Clone(in.Callees)
	slices.SortFunc(callees, func(a, b Member) int { return strings.Compare(a.Agent.ClientID(), b.Agent.ClientID()) })
	for _, m := range callees {
		if m.Agent != id {
			own.ACLs = append(own.ACLs, callerACLs(m, m.Agent.Org != id.Org)...)
		}
	}
	own.ACLs = dedupe(own.ACLs)

	unit, org := identity.UnitGroupName(id.Org, id.Unit), identity.OrgGroupName(id.Org)
	client := acl.Client{
		Username: identity.Username(id),
		ClientID: id.ClientID(),
		Roles:    []acl.RoleRef{{Name: own.Name}},
		Groups:   []string{unit, org},
	}
	state := acl.NewState([]acl.Role{own}, nil, []acl.Client{client})
	// The client joins its unit and org groups when it is created, so they must exist. Their
	// content belongs to the shared reconcile: they are only created when missing (the shared
	// role empty and create-only, so that a role the shared reconcile fills meanwhile is never
	// overwritten), never changed here.
	var createRoles []string
	for _, shared := range []struct{ group, role string }{
		{unit, identity.UnitRoleName(id.Org, id.Unit)},
		{org, identity.OrgRoleName(id.Org)},
	} {
		if _, ok := in.Observed.Groups[shared.group]; !ok {
			createRoles = append(createRoles, shared.role)
			state.Groups[shared.group] = acl.Group{Name: shared.group, Roles: []acl.RoleRef{{Name: shared.role}}}
		}
	}
	state.DefaultACL = &acl.DenyByDefault
	return acl.Desired{State: state, CreateRoles: createRoles, Delete: acl.Names{
		// The per-agent objects of the earlier model, if an upgrade left them.
		Roles:  []string{identity.CallersRoleName(id), identity.GateRoleName(id)},
		Groups: []string{identity.CallersGroupName(id)},
	}}
}

// Removal lists what Unregister deletes: the agent's client and role (and the per-agent objects
// of the earlier model). The shared roles drop the agent through the shared reconcile.
func Removal(id a2amqtt.AgentRef) acl.Desired {
	return acl.Desired{Delete: acl.Names{
		Clients: []string{identity.Username(id)},
		Groups:  []string{identity.CallersGroupName(id)},
		Roles:   []string{identity.AgentRoleName(id), identity.CallersRoleName(id), identity.GateRoleName(id)},
	}}
}

// SharedKind is the kind of a shared broker object.
type SharedKind string

// The shared objects.
const (
	SharedUnit  SharedKind = "unit"
	SharedOrg   SharedKind = "org"
	SharedGates SharedKind = "gates"
)

// SharedKey names one shared object: a unit's or an org's role and group, or the service's gates.
type SharedKey struct {
	Kind      SharedKind
	Org, Unit string
}

// UnitKey, OrgKey and GatesKey build SharedKeys.
func UnitKey(org, unit string) SharedKey { return SharedKey{Kind: SharedUnit, Org: org, Unit: unit} }
func OrgKey(org string) SharedKey        { return SharedKey{Kind: SharedOrg, Org: org} }

// GatesKey is the key of the conversation service's gates role.
var GatesKey = SharedKey{Kind: SharedGates}

// String encodes the key as "unit:{org}/{unit}", "org:{org}" or "gates" (identifiers cannot
// contain ':' or '/').
func (k SharedKey) String() string {
	switch k.Kind {
	case SharedUnit:
		return "unit:" + k.Org + "/" + k.Unit
	case SharedOrg:
		return "org:" + k.Org
	}
	return string(k.Kind)
}

// ParseSharedKey is the inverse of String.
func ParseSharedKey(s string) (SharedKey, error) {
	kind, rest, _ := strings.Cut(s, ":")
	switch SharedKind(kind) {
	case SharedUnit:
		if org, unit, ok := strings.Cut(rest, "/"); ok && org != "" && unit != "" {
			return UnitKey(org, unit), nil
		}
	case SharedOrg:
		if rest != "" {
			return OrgKey(rest), nil
		}
	case SharedGates:
		if rest == "" {
			return GatesKey, nil
		}
	}
	return SharedKey{}, fmt.Errorf("not a shared object key: %q", s)
}

// KeysOf are the shared objects an agent may appear in.
func KeysOf(id a2amqtt.AgentRef, gating bool) []SharedKey {
	keys := []SharedKey{UnitKey(id.Org, id.Unit), OrgKey(id.Org)}
	if gating {
		keys = append(keys, GatesKey)
	}
	return keys
}

// Contribution is what member m puts into the shared object k (nil: nothing).
func Contribution(k SharedKey, m Member) []acl.ACL {
	switch {
	case k.Kind == SharedUnit && m.Scope == a2av1.CallerScopeSameUnit && m.Agent.Org == k.Org && m.Agent.Unit == k.Unit,
		k.Kind == SharedOrg && m.Scope == a2av1.CallerScopeSameOrg && m.Agent.Org == k.Org:
		return callerACLs(m, false)
	case k.Kind == SharedGates && m.Gated:
		// Mosquitto 2.0.11 never delivers $-topics to shared subscriptions (docs/broker.md), so a
		// service replica may also subscribe to the public request topic directly and split the
		// work with its peers through the state store instead.
		return []acl.ACL{
			{Type: acl.SubscribeLiteral, Topic: identity.RequestSubscription(m.Agent), Allow: true},
			{Type: acl.SubscribeLiteral, Topic: m.Agent.RequestTopic(), Allow: true},
			{Type: acl.PublishClientSend, Topic: identity.DeliveryTopic(m.Agent), Allow: true},
		}
	}
	return nil
}

// SharedRoleName is the role of shared object k.
func SharedRoleName(k SharedKey) string {
	switch k.Kind {
	case SharedUnit:
		return identity.UnitRoleName(k.Org, k.Unit)
	case SharedOrg:
		return identity.OrgRoleName(k.Org)
	}
	return identity.GatesRoleName
}

// SharedGroupName is the group that holds k's role.
func SharedGroupName(k SharedKey) string {
	switch k.Kind {
	case SharedUnit:
		return identity.UnitGroupName(k.Org, k.Unit)
	case SharedOrg:
		return identity.OrgGroupName(k.Org)
	}
	return identity.ServiceGroupName
}

// SharedNames are the broker objects SharedDesired needs observed.
func SharedNames(k SharedKey) acl.Names {
	return acl.Names{Roles: []string{SharedRoleName(k)}, Groups: []string{SharedGroupName(k)}}
}

// SharedDesired is the desired state of shared object k given its members: the role with the
// union of their contributions (plus, for an org, reading the org's cards and the keys that sign
// them), and the group holding
// exactly that role.
func SharedDesired(k SharedKey, members []Member) acl.Desired {
	role := acl.Role{Name: SharedRoleName(k)}
	if k.Kind == SharedOrg {
		role.ACLs = append(role.ACLs, acl.ACL{Type: acl.SubscribePattern, Topic: a2amqtt.MethodFilter(a2amqtt.MethodDiscovery, k.Org), Allow: true},
			// The public keys that sign the cards (read-only: only the operator publishes them).
			acl.ACL{Type: acl.SubscribeLiteral, Topic: a2amqtt.CardKeysTopic, Allow: true})
	}
	var entries []acl.ACL
	for _, m := range members {
		entries = append(entries, Contribution(k, m)...)
	}
	// One order whatever the members' order, so that the same set never looks like a change.
	slices.SortFunc(entries, func(a, b acl.ACL) int {
		return cmp.Or(cmp.Compare(a.Type, b.Type), cmp.Compare(a.Topic, b.Topic))
	})
	role.ACLs = dedupe(append(role.ACLs, entries...))
	group := acl.Group{Name: SharedGroupName(k), Roles: []acl.RoleRef{{Name: role.Name}}}
	return acl.Desired{State: acl.NewState([]acl.Role{role}, []acl.Group{group}, nil)}
}

// ServiceIdentity is the conversation service's base broker identity: its client (any client
// ID: replicas connect side by side), its own request and reply topics, the right to relay
// replies to any requester, and its group, which holds exactly the gates role (the agents it
// stands in front of). The gates role itself is not part of it: its content belongs to the
// shared reconcile of GatesKey, and a desired state that named it would empty it whenever that
// reconcile filled it between an observation and an apply (EnsureServiceIdentity only creates
// it, empty, when it is missing: acl.Desired.CreateRoles).
func ServiceIdentity() acl.State {
	role := acl.Role{Name: identity.ServiceUsername, ACLs: []acl.ACL{
		{Type: acl.SubscribeLiteral, Topic: identity.RequestSubscription(identity.Service), Allow: true},
		{Type: acl.SubscribeLiteral, Topic: identity.Service.RequestTopic(), Allow: true},
		{Type: acl.SubscribePattern, Topic: identity.ServiceReplyFilter(), Allow: true},
		{Type: acl.PublishClientSend, Topic: a2amqtt.MethodFilter(a2amqtt.MethodReply), Allow: true},
	}}
	group := acl.Group{Name: identity.ServiceGroupName, Roles: []acl.RoleRef{{Name: identity.GatesRoleName}}}
	client := acl.Client{Username: identity.ServiceUsername, Roles: []acl.RoleRef{{Name: role.Name}}, Groups: []string{identity.ServiceGroupName}}
	return acl.NewState([]acl.Role{role}, []acl.Group{group}, []acl.Client{client})
}

// ServiceGatesRole creates the gates role, empty, if it does not exist; a role that exists is
// left as it is (the broker answers "Role already exists", which the backends take as done).
func ServiceGatesRole() acl.Command {
	return acl.Command{Op: acl.OpCreateRole, Role: identity.GatesRoleName}
}

// withoutRevocationKicks drops the commands that Diff puts before a modifyRole only to disconnect
// the role's holders when a subscribe grant is revoked (docs/broker.md), for the revocations drop
// selects: those whose holders must not be disconnected. The modifyRole that follows sets the full
// list either way, so the broker state is the same.
func withoutRevocationKicks(cmds []acl.Command, drop func(acl.Command) bool) []acl.Command {
	return slices.DeleteFunc(cmds, func(c acl.Command) bool {
		return (c.Op == acl.OpRemoveRoleACL || c.Op == acl.OpAddRoleACL) && drop(c)
	})
}

func sortedRefs(in []a2amqtt.AgentRef) []a2amqtt.AgentRef {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b a2amqtt.AgentRef) int { return strings.Compare(a.ClientID(), b.ClientID()) })
	return slices.Compact(out)
}

func dedupe(acls []acl.ACL) []acl.ACL {
	seen := map[acl.ACL]bool{}
	return slices.DeleteFunc(acls, func(a acl.ACL) bool {
		if seen[a] {
			return true
		}
		seen[a] = true
		return false
	})
}
