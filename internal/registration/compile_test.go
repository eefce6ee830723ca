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

func TestCompileOwnTopicsAndScopes(t *testing.T) {
	cases := []struct {
		scope      a2av1.CallerScope
		replyTopic string
		unitRef    bool
		orgRef     bool
	}{
		{a2av1.CallerScopeNone, "", false, false},
		{a2av1.CallerScopeSameUnit, "$a2a/v1/reply/acme/sales/#", true, false},
		{a2av1.CallerScopeSameOrg, "$a2a/v1/reply/acme/#", false, true},
	}
	for _, tc := range cases {
		t.Run(string(tc.scope), func(t *testing.T) {
			d := Compile(Input{Agent: planner, Scope: tc.scope})
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
			callersRef := acl.RoleRef{Name: "a2a:callers:acme/sales/planner"}
			if got := slices.Contains(d.Groups["a2a:unit:acme/sales"].Roles, callersRef); got != tc.unitRef {
				t.Errorf("unit group has callers role = %v, want %v", got, tc.unitRef)
			}
			if got := slices.Contains(d.Groups["a2a:org:acme"].Roles, callersRef); got != tc.orgRef {
				t.Errorf("org group has callers role = %v, want %v", got, tc.orgRef)
			}
			c := d.Clients["a2a:acme/sales/planner"]
			if c.ClientID != "acme/sales/planner" || !slices.Equal(c.Groups, []string{"a2a:unit:acme/sales", "a2a:org:acme"}) {
				t.Errorf("client = %+v", c)
			}
			if d.DefaultACL == nil || d.DefaultACL.PublishClientSend || d.DefaultACL.Subscribe {
				t.Errorf("default access must deny publish and subscribe: %+v", d.DefaultACL)
			}
		})
	}
}

func TestCompileKeepsOtherAgentsReferencesInSharedGroups(t *testing.T) {
	observed := acl.NewState(nil, []acl.Group{{Name: "a2a:unit:acme/sales", Roles: []acl.RoleRef{
		{Name: "a2a:callers:acme/sales/writer"}, {Name: "a2a:callers:acme/sales/planner"},
	}}}, nil)
	// planner narrows its scope: its reference goes, writer's stays.
	d := Compile(Input{Agent: planner, Scope: a2av1.CallerScopeNone, Observed: observed})
	if got := d.Groups["a2a:unit:acme/sales"].Roles; !slices.Equal(got, []acl.RoleRef{{Name: "a2a:callers:acme/sales/writer"}}) {
		t.Fatalf("unit group roles = %v", got)
	}
}

func TestCompileSelectedCallersAndCallees(t *testing.T) {
	d := Compile(Input{Agent: planner, HasSelectors: true, Callers: []a2amqtt.AgentRef{auditor, auditor, planner}, CalledBy: []a2amqtt.AgentRef{writer}})
	own := d.Roles["a2a:agent:acme/sales/planner"]
	if !hasACL(own, acl.PublishClientSend, "$a2a/v1/reply/other/audit/auditor/#") {
		t.Fatalf("selected caller's reply topic missing: %v", own.ACLs)
	}
	if len(own.ACLs) != 5 {
		t.Fatalf("duplicates and self must not add entries: %v", own.ACLs)
	}
	if !slices.Contains(d.Clients["a2a:acme/sales/planner"].Groups, "a2a:callers:acme/sales/writer") {
		t.Fatalf("planner must join writer's callers group: %v", d.Clients["a2a:acme/sales/planner"].Groups)
	}
	// writer's group and role did not exist: created minimal; when they exist they are left alone.
	if _, ok := d.Groups["a2a:callers:acme/sales/writer"]; !ok {
		t.Fatal("missing callee group not created")
	}
	observed := acl.NewState([]acl.Role{{Name: "a2a:callers:acme/sales/writer"}}, []acl.Group{{Name: "a2a:callers:acme/sales/writer"}}, nil)
	d = Compile(Input{Agent: planner, CalledBy: []a2amqtt.AgentRef{writer}, Observed: observed})
	if _, ok := d.Groups["a2a:callers:acme/sales/writer"]; ok {
		t.Fatal("an existing callee group must not be rewritten by another agent")
	}
	if _, ok := d.Roles["a2a:callers:acme/sales/writer"]; ok {
		t.Fatal("an existing callee role must not be rewritten by another agent")
	}
}

func TestCompileCreatesOnlyWhatIsNeeded(t *testing.T) {
	d := Compile(Input{Agent: planner, Scope: a2av1.CallerScopeNone})
	if _, ok := d.Roles["a2a:callers:acme/sales/planner"]; ok {
		t.Fatal("an agent nobody may call needs no callers role")
	}
	if _, ok := d.Groups["a2a:callers:acme/sales/planner"]; ok {
		t.Fatal("an agent without selectors needs no callers group")
	}
	if !slices.Contains(d.Delete.Roles, "a2a:callers:acme/sales/planner") || !slices.Contains(d.Delete.Groups, "a2a:callers:acme/sales/planner") {
		t.Fatalf("unneeded objects left behind after a spec change: %+v", d.Delete)
	}
	if _, ok := d.Groups[identity.ServiceGroupName]; ok {
		t.Fatal("no gating, no service group")
	}
	d = Compile(Input{Agent: planner, Scope: a2av1.CallerScopeSameUnit})
	if _, ok := d.Roles["a2a:callers:acme/sales/planner"]; !ok {
		t.Fatal("scope-admitted callers need the callers role")
	}
}

func TestCompilePool(t *testing.T) {
	d := Compile(Input{Agent: planner, PoolID: "p1", Scope: a2av1.CallerScopeSameUnit})
	pool := a2amqtt.PoolRef{Org: "acme", Unit: "sales", Pool: "p1"}
	if !hasACL(d.Roles["a2a:agent:acme/sales/planner"], acl.SubscribeLiteral, pool.SharedSubscription()) {
		t.Fatal("pool member cannot subscribe to the shared pool topic")
	}
	if !hasACL(d.Roles["a2a:callers:acme/sales/planner"], acl.PublishClientSend, pool.RequestTopic()) {
		t.Fatal("callers cannot publish to the pool topic")
	}
}

// TestCompileSizeIsConstantPerAgent: without selector rules an agent costs a fixed number of
// broker entries whatever the fleet size.
func TestCompileSizeIsConstantPerAgent(t *testing.T) {
	d := Compile(Input{Agent: planner, Scope: a2av1.CallerScopeSameOrg})
	entries := 0
	for _, r := range d.Roles {
		entries += len(r.ACLs)
	}
	if entries != 8 || len(d.Clients) != 1 {
		t.Fatalf("entries = %d clients = %d", entries, len(d.Clients))
	}
}
