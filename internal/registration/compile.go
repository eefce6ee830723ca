// Package registration turns an Agent into a live, least-privilege identity on the broker: a
// client with exactly the topic ACLs the A2A over MQTT profile needs, and a retained agent card.
//
// The ACL model grows with agents plus caller rules, never with agents²:
//
//   - every agent has its own role (its request/reply/discovery/event topics and the reply topics
//     of the callers it admits) and a "callers" role (publish to its request topic);
//   - callers admitted by scope get the callers role through one shared group per unit or org
//     (one group-role reference per agent);
//   - callers admitted by selector join the agent's "callers" group (one membership per rule match).
//
// Shared groups are edited with add/remove of single role references, so concurrent reconciles of
// different agents never overwrite each other.
package registration

import (
	"slices"
	"strings"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// ServiceIdentity is the conversation service's base broker identity: its client (any client
// ID: replicas connect side by side), its own request and reply topics, and the right to relay
// replies to any requester. The per-agent gate roles reach it through identity.ServiceGroupName.
func ServiceIdentity(observed acl.State) acl.State {
	role := acl.Role{Name: identity.ServiceUsername, ACLs: []acl.ACL{
		{Type: acl.SubscribeLiteral, Topic: identity.RequestSubscription(identity.Service), Allow: true},
		{Type: acl.SubscribeLiteral, Topic: identity.Service.RequestTopic(), Allow: true},
		{Type: acl.SubscribePattern, Topic: identity.ServiceReplyFilter(), Allow: true},
		{Type: acl.PublishClientSend, Topic: a2amqtt.MethodFilter(a2amqtt.MethodReply), Allow: true},
	}}
	group := acl.Group{Name: identity.ServiceGroupName}
	if have, ok := observed.Groups[identity.ServiceGroupName]; ok {
		group.Roles = slices.Clone(have.Roles)
	}
	client := acl.Client{Username: identity.ServiceUsername, Roles: []acl.RoleRef{{Name: role.Name}}, Groups: []string{identity.ServiceGroupName}}
	return acl.NewState([]acl.Role{role}, []acl.Group{group}, []acl.Client{client})
}

// Input is everything the ACLs of one agent depend on.
type Input struct {
	Agent a2amqtt.AgentRef
	Scope a2av1.CallerScope
	// PoolID is empty when the agent is not a pool member.
	PoolID string
	// Gated puts the conversation service in front of the agent (a ConversationPolicy governs
	// it): the service reads the public request topic, the agent reads its delivery topic and
	// replies to the service.
	Gated bool
	// HasSelectors is true when the agent has callers.from rules (even if they select nobody
	// now): only then does it need a callers group.
	HasSelectors bool
	// Callers are the agents its callers.from selectors admit (it publishes to their replies).
	Callers []a2amqtt.AgentRef
	// CalledBy are the agents whose callers.from selectors admit this agent (it joins their
	// callers groups).
	CalledBy []a2amqtt.AgentRef
	// Observed is the broker's current view of the shared objects (see SharedNames): the unit
	// and org groups, whose role references belong to many agents, and the callers groups and
	// roles of CalledBy, which belong to those agents.
	Observed acl.State
}

// SharedNames lists the objects Compile needs to have observed.
func SharedNames(in Input) acl.Names {
	n := acl.Names{Groups: []string{identity.UnitGroupName(in.Agent.Org, in.Agent.Unit), identity.OrgGroupName(in.Agent.Org), identity.ServiceGroupName}}
	for _, callee := range in.CalledBy {
		n.Groups = append(n.Groups, identity.CallersGroupName(callee))
		n.Roles = append(n.Roles, identity.CallersRoleName(callee))
	}
	return n
}

// Compile returns the broker objects for one agent. Password handling is the caller's.
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
			// Replies go to the service, which relays them; history queries go to it too.
			acl.ACL{Type: acl.PublishClientSend, Topic: identity.ServiceReplyFilter(), Allow: true},
			acl.ACL{Type: acl.PublishClientSend, Topic: identity.Service.RequestTopic(), Allow: true})
	} else {
		own.ACLs = append(own.ACLs, acl.ACL{Type: acl.SubscribeLiteral, Topic: id.RequestTopic(), Allow: true})
	}
	callers := acl.Role{Name: identity.CallersRoleName(id), ACLs: []acl.ACL{
		{Type: acl.PublishClientSend, Topic: id.RequestTopic(), Allow: true},
		// Callers from other orgs need the card too; same-org callers have it through the org role.
		{Type: acl.SubscribeLiteral, Topic: id.DiscoveryTopic(), Allow: true},
	}}
	if in.Gated {
		// Callers may ask the conversation service about the contexts they opened with this agent.
		callers.ACLs = append(callers.ACLs, acl.ACL{Type: acl.PublishClientSend, Topic: identity.Service.RequestTopic(), Allow: true})
	}
	if in.PoolID != "" {
		pool := a2amqtt.PoolRef{Org: id.Org, Unit: id.Unit, Pool: in.PoolID}
		own.ACLs = append(own.ACLs, acl.ACL{Type: acl.SubscribeLiteral, Topic: pool.SharedSubscription(), Allow: true})
		callers.ACLs = append(callers.ACLs, acl.ACL{Type: acl.PublishClientSend, Topic: pool.RequestTopic(), Allow: true})
	}
	// Replies go to whoever may call: the whole unit or org, or each selected caller.
	switch in.Scope {
	case a2av1.CallerScopeSameUnit:
		own.ACLs = append(own.ACLs, acl.ACL{Type: acl.PublishClientSend, Topic: a2amqtt.MethodFilter(a2amqtt.MethodReply, id.Org, id.Unit), Allow: true})
	case a2av1.CallerScopeSameOrg:
		own.ACLs = append(own.ACLs, acl.ACL{Type: acl.PublishClientSend, Topic: a2amqtt.MethodFilter(a2amqtt.MethodReply, id.Org), Allow: true})
	}
	for _, c := range sortedRefs(in.Callers) {
		if c == id {
			continue
		}
		own.ACLs = append(own.ACLs, acl.ACL{Type: acl.PublishClientSend, Topic: c.Topic(a2amqtt.MethodReply) + "/#", Allow: true})
	}
	own.ACLs = dedupe(own.ACLs)

	orgRole := acl.Role{Name: identity.OrgRoleName(id.Org), ACLs: []acl.ACL{
		{Type: acl.SubscribePattern, Topic: a2amqtt.MethodFilter(a2amqtt.MethodDiscovery, id.Org), Allow: true},
	}}
	// Mosquitto 2.0.11 never delivers $-topics to shared subscriptions (docs/broker.md), so a
	// service replica may also subscribe to the public request topic directly and split the work
	// with its peers through the state store instead.
	gateRole := acl.Role{Name: identity.GateRoleName(id), ACLs: []acl.ACL{
		{Type: acl.SubscribeLiteral, Topic: identity.RequestSubscription(id), Allow: true},
		{Type: acl.SubscribeLiteral, Topic: id.RequestTopic(), Allow: true},
		{Type: acl.PublishClientSend, Topic: identity.DeliveryTopic(id), Allow: true},
	}}
	serviceGroup := sharedGroup(identity.ServiceGroupName, in.Observed, gateRole.Name, in.Gated)
	unitGroup := sharedGroup(identity.UnitGroupName(id.Org, id.Unit), in.Observed, callers.Name, in.Scope == a2av1.CallerScopeSameUnit)
	orgGroup := sharedGroup(identity.OrgGroupName(id.Org), in.Observed, callers.Name, in.Scope == a2av1.CallerScopeSameOrg)
	orgGroup.Roles = withRef(orgGroup.Roles, orgRole.Name, true)

	memberOf := []string{unitGroup.Name, orgGroup.Name}
	for _, callee := range sortedRefs(in.CalledBy) {
		if callee != id {
			memberOf = append(memberOf, identity.CallersGroupName(callee))
		}
	}
	client := acl.Client{
		Username: identity.Username(id),
		ClientID: id.ClientID(),
		Roles:    []acl.RoleRef{{Name: own.Name}},
		Groups:   memberOf,
	}
	// Objects nobody needs are not created (each dynsec command costs a rewrite of the broker's
	// whole configuration file), and are deleted when a spec change makes them unneeded.
	roles := []acl.Role{own, orgRole}
	groups := []acl.Group{unitGroup, orgGroup}
	var unneeded acl.Names
	if in.Scope != a2av1.CallerScopeNone || in.HasSelectors {
		roles = append(roles, callers)
	} else {
		unneeded.Roles = append(unneeded.Roles, callers.Name)
	}
	if in.HasSelectors {
		groups = append(groups, acl.Group{Name: identity.CallersGroupName(id), Roles: []acl.RoleRef{{Name: callers.Name}}})
	} else {
		unneeded.Groups = append(unneeded.Groups, identity.CallersGroupName(id))
	}
	if in.Gated {
		roles = append(roles, gateRole)
	} else {
		unneeded.Roles = append(unneeded.Roles, gateRole.Name)
	}
	if _, observed := in.Observed.Groups[identity.ServiceGroupName]; in.Gated || observed {
		groups = append(groups, serviceGroup)
	}
	state := acl.NewState(roles, groups, []acl.Client{client})
	// The groups of the agents that admit this one must exist before it can join them. Their
	// content belongs to those agents, so they are only created when missing, never changed.
	for _, callee := range in.CalledBy {
		if callee == id {
			continue
		}
		if _, ok := in.Observed.Roles[identity.CallersRoleName(callee)]; !ok {
			state.Roles[identity.CallersRoleName(callee)] = calleeCallersRole(callee)
		}
		if _, ok := in.Observed.Groups[identity.CallersGroupName(callee)]; !ok {
			name := identity.CallersGroupName(callee)
			state.Groups[name] = acl.Group{Name: name, Roles: []acl.RoleRef{{Name: identity.CallersRoleName(callee)}}}
		}
	}
	state.DefaultACL = &acl.DenyByDefault
	return acl.Desired{State: state, Delete: unneeded}
}

// calleeCallersRole is the minimal callers role of another agent; that agent's own reconcile
// owns its full content (pool topics) and converges it.
func calleeCallersRole(id a2amqtt.AgentRef) acl.Role {
	return acl.Role{Name: identity.CallersRoleName(id), ACLs: []acl.ACL{
		{Type: acl.PublishClientSend, Topic: id.RequestTopic(), Allow: true},
		{Type: acl.SubscribeLiteral, Topic: id.DiscoveryTopic(), Allow: true},
	}}
}

// Removal lists what Unregister deletes: the agent's client, roles and callers group. Shared
// groups lose the agent's role reference through the role's deletion.
func Removal(id a2amqtt.AgentRef) acl.Desired {
	return acl.Desired{Delete: acl.Names{
		Clients: []string{identity.Username(id)},
		Groups:  []string{identity.CallersGroupName(id)},
		Roles:   []string{identity.AgentRoleName(id), identity.CallersRoleName(id), identity.GateRoleName(id)},
	}}
}

// sharedGroup keeps every role reference of the observed group that is not this agent's, and
// adds or drops this agent's callers role.
func sharedGroup(name string, observed acl.State, role string, member bool) acl.Group {
	g := acl.Group{Name: name}
	if have, ok := observed.Groups[name]; ok {
		g.Roles = slices.Clone(have.Roles)
	}
	g.Roles = withRef(g.Roles, role, member)
	return g
}

func withRef(refs []acl.RoleRef, role string, present bool) []acl.RoleRef {
	refs = slices.DeleteFunc(refs, func(r acl.RoleRef) bool { return r.Name == role })
	if present {
		refs = append(refs, acl.RoleRef{Name: role})
	}
	return refs
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
