package registration

import (
	"slices"
	"testing"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// FindOrphans takes exactly the per-agent objects of unclaimed identities: never a live agent's,
// never the operator's, the service's, the sentinel's or a shared object, and never a name that
// only looks per-agent.
func TestFindOrphans(t *testing.T) {
	gone := a2amqtt.AgentRef{Org: "acme", Unit: "sales", Agent: "gone"}
	live := a2amqtt.AgentRef{Org: "acme", Unit: "sales", Agent: "live"}
	var roles, groups, clients []string
	for _, id := range []a2amqtt.AgentRef{gone, live} {
		clients = append(clients, identity.Username(id))
		roles = append(roles, identity.AgentRoleName(id), identity.CallersRoleName(id), identity.GateRoleName(id))
		groups = append(groups, identity.CallersGroupName(id))
	}
	system := []string{
		identity.OperatorUsername, identity.SentinelRoleName, identity.ServiceUsername, identity.GatesRoleName,
		identity.UnitRoleName("acme", "sales"), identity.OrgRoleName("acme"),
		// Look-alikes: wrong number of levels, invalid identifiers, an empty rest.
		"a2a:acme/sales", "a2a:acme/sales/x/y", "a2a:agent:acme/sales", "a2a:agent:", "a2a:", "a2a:acme//gone",
		"a2a:callers:acme/sales/x/y", "a2a:gate:acme/sales",
	}
	roles = append(roles, system...)
	groups = append(groups, identity.ServiceGroupName, identity.UnitGroupName("acme", "sales"), identity.OrgGroupName("acme"))
	groups = append(groups, system...)
	clients = append(clients, system...)
	observed := acl.NewState(nil, nil, nil)
	for _, n := range roles {
		observed.Roles[n] = acl.Role{Name: n}
	}
	for _, n := range groups {
		observed.Groups[n] = acl.Group{Name: n}
	}
	for _, n := range clients {
		observed.Clients[n] = acl.Client{Username: n}
	}

	got := FindOrphans(observed, func(id a2amqtt.AgentRef) bool { return id == live })
	want := Orphans{
		Names: acl.Names{
			Clients: []string{identity.Username(gone)},
			Roles:   sorted(identity.AgentRoleName(gone), identity.CallersRoleName(gone), identity.GateRoleName(gone)),
			Groups:  []string{identity.CallersGroupName(gone)},
		},
		Agents: []a2amqtt.AgentRef{gone},
	}
	if !slices.Equal(got.Names.Clients, want.Names.Clients) || !slices.Equal(got.Names.Roles, want.Names.Roles) ||
		!slices.Equal(got.Names.Groups, want.Names.Groups) || !slices.Equal(got.Agents, want.Agents) {
		t.Fatalf("orphans:\n got %+v\nwant %+v", got, want)
	}
	if everyone := FindOrphans(observed, func(a2amqtt.AgentRef) bool { return true }); !everyone.Empty() {
		t.Errorf("orphans although every identity is claimed: %+v", everyone)
	}
	// Nothing claimed: both agents' objects, and still none of the others.
	all := FindOrphans(observed, func(a2amqtt.AgentRef) bool { return false })
	if len(all.Agents) != 2 || len(all.Names.Clients) != 2 || len(all.Names.Roles) != 6 || len(all.Names.Groups) != 2 {
		t.Errorf("nothing claimed: %+v", all)
	}
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// An object is deleted only after two passes found it orphaned; a claim in between (the Agent
// created again) or a first sighting keeps it.
func TestOrphansConfirmedOverTwoPasses(t *testing.T) {
	a := a2amqtt.AgentRef{Org: "o", Unit: "u", Agent: "a"}
	b := a2amqtt.AgentRef{Org: "o", Unit: "u", Agent: "b"}
	pass := func(ids ...a2amqtt.AgentRef) Orphans {
		o := Orphans{Agents: ids}
		for _, id := range ids {
			o.Names.Clients = append(o.Names.Clients, identity.Username(id))
			o.Names.Roles = append(o.Names.Roles, identity.AgentRoleName(id))
		}
		return o
	}
	if got := pass(a).confirmed(Orphans{}); !got.Empty() || len(got.Agents) != 0 {
		t.Fatalf("first sighting confirmed: %+v", got)
	}
	got := pass(a, b).confirmed(pass(a))
	if !slices.Equal(got.Names.Clients, []string{identity.Username(a)}) || !slices.Equal(got.Agents, []a2amqtt.AgentRef{a}) {
		t.Fatalf("second pass: %+v", got)
	}
	if got := pass(b).confirmed(pass(a)); !got.Empty() {
		t.Fatalf("a claimed again in between, b seen once: %+v", got)
	}
}

// Every per-agent form parses back to its identity, and only to it.
func TestPerAgentNameRoundTrip(t *testing.T) {
	for _, id := range []a2amqtt.AgentRef{{Org: "acme", Unit: "sales", Agent: "quote"}, {Org: "a", Unit: "b-c", Agent: "d_e.f"}} {
		for kind, forms := range map[string][]func(a2amqtt.AgentRef) string{
			"client": {identity.Username},
			"role":   {identity.AgentRoleName, identity.CallersRoleName, identity.GateRoleName},
			"group":  {identity.CallersGroupName},
		} {
			for _, form := range forms {
				got, ok := perAgentName(kind, form(id))
				if !ok || got != id {
					t.Errorf("%s %q: parsed %v %v", kind, form(id), got, ok)
				}
			}
		}
		// A client name is not a role name and the other way round.
		if _, ok := perAgentName("role", identity.Username(id)); ok {
			t.Errorf("client name %q taken for a role", identity.Username(id))
		}
		if _, ok := perAgentName("client", identity.AgentRoleName(id)); ok {
			t.Errorf("role name %q taken for a client", identity.AgentRoleName(id))
		}
	}
}
