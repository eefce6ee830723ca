package registration

import (
	"slices"
	"testing"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

var (
	planner = a2amqtt.AgentRef{Org: "acme", Unit: "sales", Agent: "planner"}
	writer  = a2amqtt.AgentRef{Org: "acme", Unit: "sales", Agent: "writer"}
	auditor = a2amqtt.AgentRef{Org: "other", Unit: "audit", Agent: "auditor"}
)

func hasACL(r acl.Role, t acl.ACLType, topic string) bool {
	return slices.ContainsFunc(r.ACLs, func(a acl.ACL) bool { return a.Type == t && a.Topic == topic && a.Allow })
}

// observedShared is a broker on which planner's unit and org groups exist already.
var observedShared = acl.NewState(nil, []acl.Group{{Name: "a2a:unit:acme/sales"}, {Name: "a2a:org:acme"}}, nil)

func TestCompileOwnTopicsAndScopes(t *testing.T) {
	cases := []struct {
		scope      a2av1.CallerScope
		replyTopic string
	}{
		{a2av1.CallerScopeNone, ""},
		{a2av1.CallerScopeSameUnit, "$a2a/v1/reply/acme/sales/#"},
		{a2av1.CallerScopeSameOrg, "$a2a/v1/reply/acme/#"},
	}
	for _, tc := range cases {
		t.Run(string(tc.scope), func(t *testing.T) {
			d := Compile(Input{Agent: planner, Scope: tc.scope, Observed: observedShared})
			own := d.Roles["a2a:agent:acme/sales/planner"]
			for _, want := range []struct {
				t     acl.ACLType
				topic string
			}{
				{acl.SubscribeLiteral, "$a2a/v1/request/acme/sales/planner"},
				{acl.SubscribePattern, "$a2a/v1/reply/acme/sales/planner/#"},
				{acl.PublishClientSend, "$a2a/v1/discovery/acme/sales/planner"},
				{acl.PublishClientSend, "$a2a/v1/event/acme/sales/planner"},
			} {
				if !hasACL(own, want.t, want.topic) {
					t.Errorf("own role lacks %s %s: %v", want.t, want.topic, own.ACLs)
				}
			}
			if tc.replyTopic != "" && !hasACL(own, acl.PublishClientSend, tc.replyTopic) {
				t.Errorf("scope %s: own role lacks reply publish %s", tc.scope, tc.replyTopic)
			}
			if tc.replyTopic == "" && len(own.ACLs) != 4 {
				t.Errorf("scope None must grant only the agent's own topics, got %v", own.ACLs)
			}
			// The agent's own objects only: the shared groups exist and are not touched.
			if len(d.Roles) != 1 || len(d.Groups) != 0 {
				t.Errorf("Compile must not change shared objects: roles %v, groups %v", keys(d.Roles), keys(d.Groups))
			}
			c := d.Clients["a2a:acme/sales/planner"]
			if c.ClientID != "acme/sales/planner" || !slices.Equal(c.Groups, []string{"a2a:unit:acme/sales", "a2a:org:acme"}) ||
				!slices.Equal(c.Roles, []acl.RoleRef{{Name: "a2a:agent:acme/sales/planner"}}) {
				t.Errorf("client = %+v", c)
			}
			if d.DefaultACL == nil || d.DefaultACL.PublishClientSend || d.DefaultACL.Subscribe {
				t.Errorf("default access must deny publish and subscribe: %+v", d.DefaultACL)
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestCompileCreatesMissingSharedGroupsEmptyAndOnce(t *testing.T) {
	d := Compile(Input{Agent: planner, Scope: a2av1.CallerScopeSameUnit})
	for _, g := range []struct{ group, role string }{{"a2a:unit:acme/sales", "a2a:unit:acme/sales"}, {"a2a:org:acme", "a2a:org:acme"}} {
		if got := d.Groups[g.group]; !slices.Equal(got.Roles, []acl.RoleRef{{Name: g.role}}) {
			t.Errorf("group %s = %+v, want exactly role %s", g.group, got, g.role)
		}
		if r, ok := d.Roles[g.role]; ok {
			t.Errorf("shared role %s must never be in the agent's state (its content is the shared reconcile's): %+v", g.role, r)
		}
		if !slices.Contains(d.CreateRoles, g.role) {
			t.Errorf("shared role %s must be created when missing: CreateRoles %v", g.role, d.CreateRoles)
		}
	}
	// Created empty, and not at all when it exists (whatever its content).
	for _, c := range acl.Diff(acl.State{}, d) {
		if c.Op == acl.OpCreateRole && slices.Contains(d.CreateRoles, c.Role) && len(c.ACLs) != 0 {
			t.Errorf("shared role created with content: %s", c)
		}
	}
	filled := acl.NewState([]acl.Role{{Name: "a2a:unit:acme/sales", ACLs: []acl.ACL{{Type: acl.PublishClientSend, Topic: "x", Allow: true}}}}, nil, nil)
	for _, c := range acl.Diff(filled, d) {
		if c.Group == "" && c.Role == "a2a:unit:acme/sales" {
			t.Errorf("a shared role that exists must be left alone: %s", c)
		}
	}
	// Against an empty broker: createRole, createGroup, addGroupRole per shared object (the group
	// is new, so addGroupRole kicks nobody), then the agent's role and client.
	cmds := acl.Diff(acl.State{}, d)
	for _, c := range cmds {
		if c.Kicks() && c.Op != acl.OpAddGroupRole && c.Op != acl.OpModifyClient {
			t.Errorf("unexpected kicking command on creation: %s", c)
		}
	}
}

func TestCompileGatedAgentRepliesOnlyThroughTheService(t *testing.T) {
	d := Compile(Input{Agent: planner, Scope: a2av1.CallerScopeSameOrg, Gated: true, Callers: []a2amqtt.AgentRef{auditor}, Observed: observedShared})
	own := d.Roles["a2a:agent:acme/sales/planner"]
	for _, a := range own.ACLs {
		info, err := a2amqtt.ParseTopic(a.Topic)
		if a.Type == acl.PublishClientSend && err == nil && info.Method == a2amqtt.MethodReply && info.Org != identity.ReservedOrg {
			t.Errorf("gated agent may reply to a caller directly: %s", a)
		}
		if a.Type == acl.PublishClientSend && a.Topic == "$a2a/v1/reply/acme/#" {
			t.Errorf("gated agent keeps its scope's reply grant: %s", a)
		}
	}
	for _, want := range []struct {
		t     acl.ACLType
		topic string
	}{
		{acl.SubscribeLiteral, "$a2a/v1/delivery/acme/sales/planner"},
		{acl.PublishClientSend, identity.ServiceReplyFilter()},
		{acl.PublishClientSend, identity.Service.RequestTopic()},
	} {
		if !hasACL(own, want.t, want.topic) {
			t.Errorf("gated role lacks %s %s", want.t, want.topic)
		}
	}
	if hasACL(own, acl.SubscribeLiteral, planner.RequestTopic()) {
		t.Error("gated agent may still read its public request topic")
	}
}

func TestCompileSelectedCallersAndCallees(t *testing.T) {
	// planner admits auditor by selector: planner replies to auditor.
	d := Compile(Input{Agent: planner, Callers: []a2amqtt.AgentRef{auditor}, Observed: observedShared})
	if !hasACL(d.Roles["a2a:agent:acme/sales/planner"], acl.PublishClientSend, "$a2a/v1/reply/other/audit/auditor/#") {
		t.Error("planner cannot reply to its selected caller")
	}
	// auditor is admitted by planner (a pool member, gated) and by writer: its own role holds
	// the calls; the client stays in its own unit and org groups only.
	d = Compile(Input{Agent: auditor, Callees: []Member{
		{Agent: planner, Pool: "workers", Gated: true},
		{Agent: writer},
	}, Observed: acl.NewState(nil, []acl.Group{{Name: "a2a:unit:other/audit"}, {Name: "a2a:org:other"}}, nil)})
	own := d.Roles["a2a:agent:other/audit/auditor"]
	for _, topic := range []string{planner.RequestTopic(), "$a2a/v1/request/acme/sales/pool/workers", writer.RequestTopic(), identity.Service.RequestTopic()} {
		if !hasACL(own, acl.PublishClientSend, topic) {
			t.Errorf("caller cannot publish to %s: %v", topic, own.ACLs)
		}
	}
	if !hasACL(own, acl.SubscribeLiteral, planner.DiscoveryTopic()) {
		t.Error("a caller of another org cannot read the callee's card")
	}
	if c := d.Clients["a2a:other/audit/auditor"]; !slices.Equal(c.Groups, []string{"a2a:unit:other/audit", "a2a:org:other"}) {
		t.Errorf("a selected caller must not join other groups (that kicks it): %v", c.Groups)
	}
	// Same-org callees need no card literal: the org role covers it.
	d = Compile(Input{Agent: writer, Callees: []Member{{Agent: planner}}, Observed: observedShared})
	if hasACL(d.Roles["a2a:agent:acme/sales/writer"], acl.SubscribeLiteral, planner.DiscoveryTopic()) {
		t.Error("same-org callee's card literal is redundant")
	}
}

func TestCompilePoolAndLegacyCleanup(t *testing.T) {
	d := Compile(Input{Agent: planner, Pool: "workers", Observed: observedShared})
	if !hasACL(d.Roles["a2a:agent:acme/sales/planner"], acl.SubscribeLiteral, "$share/a2a.acme.sales.workers/$a2a/v1/request/acme/sales/pool/workers") {
		t.Errorf("pool member cannot subscribe to its pool: %v", d.Roles["a2a:agent:acme/sales/planner"].ACLs)
	}
	// The earlier model's per-agent objects are removed when found.
	if !slices.Contains(d.Delete.Roles, "a2a:callers:acme/sales/planner") || !slices.Contains(d.Delete.Roles, "a2a:gate:acme/sales/planner") ||
		!slices.Contains(d.Delete.Groups, "a2a:callers:acme/sales/planner") {
		t.Errorf("legacy objects not deleted: %+v", d.Delete)
	}
}

func TestSharedObjects(t *testing.T) {
	members := []Member{
		{Agent: writer, Scope: a2av1.CallerScopeSameUnit, Pool: "workers"},
		{Agent: planner, Scope: a2av1.CallerScopeSameOrg, Gated: true},
		{Agent: a2amqtt.AgentRef{Org: "acme", Unit: "sales", Agent: "quiet"}, Scope: a2av1.CallerScopeNone},
	}
	unit := SharedDesired(UnitKey("acme", "sales"), members)
	ur := unit.Roles["a2a:unit:acme/sales"]
	if !hasACL(ur, acl.PublishClientSend, writer.RequestTopic()) || !hasACL(ur, acl.PublishClientSend, "$a2a/v1/request/acme/sales/pool/workers") {
		t.Errorf("unit role lacks the SameUnit agent's topics: %v", ur.ACLs)
	}
	if hasACL(ur, acl.PublishClientSend, planner.RequestTopic()) {
		t.Error("unit role admits a SameOrg agent's callers (that is the org role's job)")
	}
	if g := unit.Groups["a2a:unit:acme/sales"]; !slices.Equal(g.Roles, []acl.RoleRef{{Name: "a2a:unit:acme/sales"}}) {
		t.Errorf("unit group = %+v", g)
	}
	org := SharedDesired(OrgKey("acme"), members)
	or := org.Roles["a2a:org:acme"]
	if !hasACL(or, acl.SubscribePattern, "$a2a/v1/discovery/acme/#") || !hasACL(or, acl.PublishClientSend, planner.RequestTopic()) ||
		!hasACL(or, acl.PublishClientSend, identity.Service.RequestTopic()) || hasACL(or, acl.PublishClientSend, writer.RequestTopic()) {
		t.Errorf("org role = %v", or.ACLs)
	}
	gates := SharedDesired(GatesKey, members)
	gr := gates.Roles[identity.GatesRoleName]
	if len(gr.ACLs) != 3 || !hasACL(gr, acl.PublishClientSend, identity.DeliveryTopic(planner)) || !hasACL(gr, acl.SubscribeLiteral, planner.RequestTopic()) {
		t.Errorf("gates role = %v", gr.ACLs)
	}
	if g := gates.Groups[identity.ServiceGroupName]; !slices.Equal(g.Roles, []acl.RoleRef{{Name: identity.GatesRoleName}}) {
		t.Errorf("service group = %+v", g)
	}
	// The content does not depend on the members' order.
	reversed := slices.Clone(members)
	slices.Reverse(reversed)
	if !slices.Equal(SharedDesired(UnitKey("acme", "sales"), reversed).Roles["a2a:unit:acme/sales"].ACLs, ur.ACLs) {
		t.Error("member order changes the unit role")
	}
	// Shrinking a shared role never kicks: the shared reconcile drops the revocation kick.
	cmds := withoutRevocationKicks(acl.Diff(acl.NewState([]acl.Role{gr}, []acl.Group{gates.Groups[identity.ServiceGroupName]}, nil),
		SharedDesired(GatesKey, nil)), func(acl.Command) bool { return true })
	if len(cmds) != 1 || cmds[0].Op != acl.OpModifyRole {
		t.Errorf("ungating the last agent: %v, want one modifyRole", cmds)
	}
}

func TestSharedKeys(t *testing.T) {
	for _, k := range []SharedKey{UnitKey("acme", "sales"), OrgKey("acme"), GatesKey} {
		got, err := ParseSharedKey(k.String())
		if err != nil || got != k {
			t.Errorf("ParseSharedKey(%q) = %v, %v", k, got, err)
		}
	}
	for _, bad := range []string{"", "unit:acme", "org:", "gates:x", "pool:a/b"} {
		if _, err := ParseSharedKey(bad); err == nil {
			t.Errorf("ParseSharedKey(%q) accepted", bad)
		}
	}
}

func TestServiceIdentityKeepsTheGatesRole(t *testing.T) {
	st := ServiceIdentity()
	if _, ok := st.Roles[identity.GatesRoleName]; ok {
		t.Error("the service identity must never name the gates role: an apply would rewrite its content")
	}
	if g := st.Groups[identity.ServiceGroupName]; !slices.Equal(g.Roles, []acl.RoleRef{{Name: identity.GatesRoleName}}) {
		t.Errorf("service group = %+v", g)
	}
}

// TestCompileSizeIsConstantPerAgent: an agent's own objects do not grow with its unit or org.
func TestCompileSizeIsConstantPerAgent(t *testing.T) {
	d := Compile(Input{Agent: planner, Scope: a2av1.CallerScopeSameUnit, Observed: observedShared})
	observed := observedShared.Clone()
	observed.DefaultACL = &acl.DenyByDefault
	cmds := acl.Diff(observed, d)
	// createRole, createClient, modifyClient: nothing about the rest of the unit.
	if len(cmds) != 3 {
		t.Errorf("creating an agent in an existing unit: %d commands (%s), want 3", len(cmds), acl.Summary(cmds))
	}
	for _, c := range cmds {
		if c.Group != "" || (c.Role != "" && c.Role != "a2a:agent:acme/sales/planner") {
			t.Errorf("creating an agent touches a shared object: %s", c)
		}
	}
}
