package acl

import "testing"

func allow(t ACLType, topic string, prio int) ACL {
	return ACL{Type: t, Topic: topic, Priority: prio, Allow: true}
}
func deny(t ACLType, topic string, prio int) ACL { return ACL{Type: t, Topic: topic, Priority: prio} }

// decideState is a small fleet exercising every ordering rule of dynsec's
// acl_check: ACL priority within a role, role priority within a client,
// client roles before group roles, groups in name order, literal subscribe
// rules before patterns, defaults and $CONTROL.
func decideState() State {
	s := NewState(
		[]Role{
			{Name: "a2a:caller", ACLs: []ACL{
				allow(PublishClientSend, "$a2a/v1/request/acme/#", 0),
				deny(PublishClientSend, "$a2a/v1/request/acme/secret", 10),
				allow(SubscribePattern, "$a2a/v1/reply/acme/caller/#", 0),
				allow(SubscribePattern, "$share/+/$a2a/v1/request/acme/pool/#", 0),
				// Literal rules win over patterns of the same role even at a
				// lower priority.
				allow(SubscribeLiteral, "$a2a/v1/reply/acme/other/x", -100),
				deny(SubscribePattern, "$a2a/v1/reply/acme/other/#", 100),
			}},
			{Name: "a2a:deny-ops", ACLs: []ACL{deny(PublishClientSend, "$a2a/v1/request/acme/ops", 0)}},
			{Name: "a2a:allow-ops", ACLs: []ACL{allow(PublishClientSend, "$a2a/v1/request/acme/ops", 0)}},
			{Name: "a2a:group-a", ACLs: []ACL{allow(PublishClientSend, "grp/x", 0)}},
			{Name: "a2a:group-b", ACLs: []ACL{deny(PublishClientSend, "grp/x", 0), allow(PublishClientSend, "grp/y", 0)}},
			{Name: "a2a:receive", ACLs: []ACL{deny(PublishClientReceive, "news/secret", 0), allow(SubscribePattern, "news/#", 0)}},
			{Name: "a2a:everything", ACLs: []ACL{allow(PublishClientSend, "#", 0), allow(SubscribePattern, "#", 0)}},
		},
		[]Group{
			{Name: "a2a:g-a", Roles: []RoleRef{{Name: "a2a:group-a", Priority: 0}}},
			{Name: "a2a:g-b", Roles: []RoleRef{{Name: "a2a:group-b", Priority: 0}}},
		},
		[]Client{
			{Username: "a2a:caller", Roles: []RoleRef{{Name: "a2a:caller", Priority: 0}}},
			// deny-ops has the higher priority: denied.
			{Username: "a2a:ops-denied", Roles: []RoleRef{{Name: "a2a:deny-ops", Priority: 5}, {Name: "a2a:allow-ops", Priority: 1}}},
			// swapped: allowed.
			{Username: "a2a:ops-allowed", Roles: []RoleRef{{Name: "a2a:deny-ops", Priority: 1}, {Name: "a2a:allow-ops", Priority: 5}}},
			// equal priority: role names decide ("a2a:allow-ops" < "a2a:deny-ops").
			{Username: "a2a:ops-tie", Roles: []RoleRef{{Name: "a2a:deny-ops", Priority: 0}, {Name: "a2a:allow-ops", Priority: 0}}},
			// client roles come before any group, even with a lower priority.
			{Username: "a2a:grouped", Roles: []RoleRef{{Name: "a2a:group-b", Priority: -50}}, Groups: []string{"a2a:g-a"}},
			// groups are checked in name order: g-a allows grp/x before g-b denies it.
			{Username: "a2a:two-groups", Groups: []string{"a2a:g-b", "a2a:g-a"}},
			{Username: "a2a:reader", Roles: []RoleRef{{Name: "a2a:receive"}}},
			{Username: "a2a:wild", Roles: []RoleRef{{Name: "a2a:everything"}}},
			{Username: "a2a:nobody"},
		},
	)
	return s
}

func TestPolicyCheck(t *testing.T) {
	p := Compile(decideState())
	cases := []struct {
		user   string
		access Access
		topic  string
		want   bool
	}{
		{"a2a:caller", Publish, "$a2a/v1/request/acme/agent", true},
		{"a2a:caller", Publish, "$a2a/v1/request/acme/secret", false}, // higher-priority deny
		{"a2a:caller", Publish, "$a2a/v1/request/acme/secret/sub", true},
		{"a2a:caller", Publish, "$a2a/v1/request/other/agent", false}, // default deny
		{"a2a:caller", Subscribe, "$a2a/v1/reply/acme/caller/1", true},
		{"a2a:caller", Subscribe, "$a2a/v1/reply/acme/caller/#", true},
		{"a2a:caller", Subscribe, "$a2a/v1/reply/acme/#", false},
		{"a2a:caller", Subscribe, "$a2a/v1/reply/acme/other/x", true}, // literal beats pattern
		{"a2a:caller", Subscribe, "$a2a/v1/reply/acme/other/y", false},
		{"a2a:caller", Subscribe, "$share/g/$a2a/v1/request/acme/pool/p1", true},
		{"a2a:caller", Subscribe, "$a2a/v1/request/acme/pool/p1", false}, // only the $share form is granted
		{"a2a:caller", Receive, "$a2a/v1/reply/acme/caller/1", true},     // default receive allow
		{"a2a:caller", Unsubscribe, "anything", true},                    // default unsubscribe allow
		{"a2a:caller", Publish, "$CONTROL/dynamic-security/v1", false},
		{"a2a:caller", Receive, "$CONTROL/dynamic-security/v1/response", false}, // never by default
		{"a2a:ops-denied", Publish, "$a2a/v1/request/acme/ops", false},
		{"a2a:ops-allowed", Publish, "$a2a/v1/request/acme/ops", true},
		{"a2a:ops-tie", Publish, "$a2a/v1/request/acme/ops", true},
		{"a2a:grouped", Publish, "grp/x", false},
		{"a2a:grouped", Publish, "grp/y", true},
		{"a2a:two-groups", Publish, "grp/x", true},
		{"a2a:two-groups", Publish, "grp/y", true},
		{"a2a:reader", Subscribe, "news/#", true},
		{"a2a:reader", Receive, "news/secret", false},
		{"a2a:reader", Receive, "news/public", true},
		{"a2a:wild", Publish, "plain/topic", true},
		{"a2a:wild", Publish, "$a2a/v1/request/acme/x", false},  // "#" never matches "$" topics
		{"a2a:wild", Subscribe, "$a2a/v1/request/acme/x", true}, // but covers "$" filters
		{"a2a:nobody", Publish, "x", false},
		{"a2a:nobody", Subscribe, "x", false},
		{"stranger", Receive, "x", false},
	}
	for _, c := range cases {
		d := p.Check(c.user, c.access, c.topic)
		if d.Allow != c.want {
			t.Errorf("Check(%s, %s, %q) = %v, want allow=%v", c.user, c.access, c.topic, d, c.want)
		}
		if d.Reason == "" {
			t.Errorf("Check(%s, %s, %q) has no reason", c.user, c.access, c.topic)
		}
	}
}

func TestPolicyDefaults(t *testing.T) {
	s := decideState()
	s.DefaultACL = &DefaultACLAccess{PublishClientSend: true, Subscribe: true}
	p := Compile(s)
	if d := p.Check("a2a:nobody", Publish, "x"); !d.Allow {
		t.Errorf("default allow publish: %v", d)
	}
	if d := p.Check("a2a:nobody", Publish, "$CONTROL/dynamic-security/v1"); d.Allow {
		t.Errorf("$CONTROL granted by default: %v", d)
	}
	if d := p.Check("a2a:nobody", Receive, "x"); d.Allow {
		t.Errorf("receive should follow the explicit default deny: %v", d)
	}
	if d := p.Check("a2a:caller", Publish, "$a2a/v1/request/acme/secret"); d.Allow {
		t.Errorf("a matching deny must win over default allow: %v", d)
	}
}

// Equal priorities inside a role keep the order given (dynsec inserts in
// order), so the first listed of two overlapping rules decides.
func TestACLTieKeepsOrder(t *testing.T) {
	mk := func(acls ...ACL) *Policy {
		return Compile(NewState([]Role{{Name: "r", ACLs: acls}}, nil, []Client{{Username: "u", Roles: []RoleRef{{Name: "r"}}}}))
	}
	if d := mk(allow(PublishClientSend, "a/#", 0), deny(PublishClientSend, "a/b", 0)).Check("u", Publish, "a/b"); !d.Allow {
		t.Errorf("first rule should decide: %v", d)
	}
	if d := mk(deny(PublishClientSend, "a/b", 0), allow(PublishClientSend, "a/#", 0)).Check("u", Publish, "a/b"); d.Allow {
		t.Errorf("first rule should decide: %v", d)
	}
}
