package acl

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func ops(cmds []Command) string {
	var s []string
	for _, c := range cmds {
		s = append(s, c.String())
	}
	return strings.Join(s, "; ")
}

var (
	roleCaller = Role{Name: "a2a:r1", ACLs: []ACL{
		allow(PublishClientSend, "$a2a/v1/request/acme/#", 0),
		allow(SubscribePattern, "$a2a/v1/reply/acme/a/#", 0),
	}}
	roleOther = Role{Name: "a2a:r2", ACLs: []ACL{allow(PublishClientSend, "x/#", 0)}}
	groupG    = Group{Name: "a2a:g", Roles: []RoleRef{{Name: "a2a:r1", Priority: 1}, {Name: "a2a:r2", Priority: 0}}}
	clientA   = Client{Username: "a2a:a", ClientID: "acme/u/a", Roles: []RoleRef{{Name: "a2a:r1", Priority: 1}}, Groups: []string{"a2a:g"}}
)

func withACLs(r Role, acls ...ACL) Role { r.ACLs = acls; return r }

func TestDiff(t *testing.T) {
	full := NewState([]Role{roleCaller, roleOther}, []Group{groupG}, []Client{clientA})
	cases := []struct {
		name     string
		observed State
		desired  Desired
		want     []Op
		check    func(t *testing.T, cmds []Command)
	}{
		{
			name:    "create everything",
			desired: Desired{State: full, Passwords: map[string]string{"a2a:a": "pw"}},
			want:    []Op{OpCreateRole, OpCreateRole, OpCreateGroup, OpAddGroupRole, OpAddGroupRole, OpCreateClient, OpModifyClient},
			check: func(t *testing.T, cmds []Command) {
				cc := cmds[5]
				if cc.Password != "pw" || cc.ClientID != "acme/u/a" || !slices.Equal(cc.Groups, []string{"a2a:g"}) || len(cc.Roles) != 0 {
					t.Errorf("createClient carries password, client ID and groups but no roles: %+v", cc)
				}
				if mc := cmds[6]; len(mc.Roles) != 1 || mc.Roles[0].Name != "a2a:r1" || mc.Password != "" {
					t.Errorf("modifyClient sets the roles only: %+v", mc)
				}
				if ag := cmds[3]; ag.Role != "a2a:r1" || ag.Priority != 1 {
					t.Errorf("group roles in priority order: %+v", ag)
				}
			},
		},
		{name: "in sync", observed: full, desired: Desired{State: full}},
		{
			name:     "ACL order and priorities only canonicalised",
			observed: NewState([]Role{withACLs(roleCaller, roleCaller.ACLs[1], roleCaller.ACLs[0])}, nil, nil),
			desired:  Desired{State: NewState([]Role{roleCaller}, nil, nil)},
		},
		{
			name:     "grant added: one modifyRole, no kick",
			observed: NewState([]Role{roleCaller}, nil, nil),
			desired:  Desired{State: NewState([]Role{withACLs(roleCaller, append(slices.Clone(roleCaller.ACLs), allow(PublishClientSend, "more", 0))...)}, nil, nil)},
			want:     []Op{OpModifyRole},
		},
		{
			name:     "publish grant removed: modifyRole only (checked per publish)",
			observed: NewState([]Role{roleCaller}, nil, nil),
			desired:  Desired{State: NewState([]Role{withACLs(roleCaller, roleCaller.ACLs[1])}, nil, nil)},
			want:     []Op{OpModifyRole},
		},
		{
			name:     "subscribe grant removed: kick first",
			observed: NewState([]Role{roleCaller}, nil, nil),
			desired:  Desired{State: NewState([]Role{withACLs(roleCaller, roleCaller.ACLs[0])}, nil, nil)},
			want:     []Op{OpRemoveRoleACL, OpModifyRole},
			check: func(t *testing.T, cmds []Command) {
				if cmds[0].ACL != roleCaller.ACLs[1] {
					t.Errorf("kick removes the revoked rule: %+v", cmds[0].ACL)
				}
			},
		},
		{
			name:     "subscribe deny added: kick by adding it",
			observed: NewState([]Role{roleCaller}, nil, nil),
			desired:  Desired{State: NewState([]Role{withACLs(roleCaller, append(slices.Clone(roleCaller.ACLs), deny(SubscribeLiteral, "$a2a/v1/reply/acme/a/x", 5))...)}, nil, nil)},
			want:     []Op{OpAddRoleACL, OpModifyRole},
		},
		{
			name:     "group role priority changed",
			observed: NewState([]Role{roleCaller, roleOther}, []Group{groupG}, nil),
			desired:  Desired{State: NewState(nil, []Group{{Name: "a2a:g", Roles: []RoleRef{{Name: "a2a:r1", Priority: 1}, {Name: "a2a:r2", Priority: 7}}}}, nil)},
			want:     []Op{OpRemoveGroupRole, OpAddGroupRole},
		},
		{
			name:     "group role removed",
			observed: NewState([]Role{roleCaller, roleOther}, []Group{groupG}, nil),
			desired:  Desired{State: NewState(nil, []Group{{Name: "a2a:g", Roles: []RoleRef{{Name: "a2a:r1", Priority: 1}}}}, nil)},
			want:     []Op{OpRemoveGroupRole},
		},
		{
			name:     "client ID changed: one modifyClient",
			observed: full,
			desired:  Desired{State: NewState(nil, nil, []Client{{Username: "a2a:a", ClientID: "other", Roles: clientA.Roles, Groups: clientA.Groups}})},
			want:     []Op{OpModifyClient},
		},
		{
			name:     "client roles and groups changed: still one modifyClient",
			observed: full,
			desired:  Desired{State: NewState(nil, nil, []Client{{Username: "a2a:a", ClientID: "acme/u/a", Roles: []RoleRef{{Name: "a2a:r2", Priority: 3}}}})},
			want:     []Op{OpModifyClient},
		},
		{
			name:    "client without roles: createClient only",
			desired: Desired{State: NewState(nil, nil, []Client{{Username: "a2a:plain"}})},
			want:    []Op{OpCreateClient},
		},
		{
			name:     "password of existing client is not resent",
			observed: full,
			desired:  Desired{State: full, Passwords: map[string]string{"a2a:a": "new"}},
		},
		{
			name:     "explicit deletes, absent ones skipped, order clients-groups-roles",
			observed: full,
			desired:  Desired{Delete: Names{Roles: []string{"a2a:r1", "a2a:gone"}, Groups: []string{"a2a:g"}, Clients: []string{"a2a:a"}}},
			want:     []Op{OpDeleteClient, OpDeleteGroup, OpDeleteRole},
		},
		{
			name:     "prune keeps desired",
			observed: full,
			desired:  Desired{State: NewState([]Role{roleCaller}, nil, nil), Prune: true},
			want:     []Op{OpDeleteClient, OpDeleteGroup, OpDeleteRole},
			check: func(t *testing.T, cmds []Command) {
				if cmds[2].Role != "a2a:r2" {
					t.Errorf("pruned the wrong role: %v", ops(cmds))
				}
			},
		},
		{
			name:     "delete of a desired name is ignored",
			observed: full,
			desired:  Desired{State: NewState([]Role{roleCaller}, nil, nil), Delete: Names{Roles: []string{"a2a:r1"}}},
		},
		{
			name:     "default ACL drift",
			observed: State{DefaultACL: &DefaultACLAccess{PublishClientSend: true, PublishClientReceive: true, Subscribe: true, Unsubscribe: true}},
			desired:  Desired{State: State{DefaultACL: &DenyByDefault}},
			want:     []Op{OpSetDefaultACLAccess},
		},
		{
			name:     "default ACL in sync",
			observed: State{DefaultACL: &DefaultACLAccess{PublishClientReceive: true, Unsubscribe: true}},
			desired:  Desired{State: State{DefaultACL: &DenyByDefault}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmds := Diff(c.observed, c.desired)
			var got []Op
			for _, cmd := range cmds {
				got = append(got, cmd.Op)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("Diff = [%s], want %v", ops(cmds), c.want)
			}
			if c.check != nil {
				c.check(t, cmds)
			}
			// Applying the result must converge: Diff against the planned
			// state is empty.
			if again := Diff(Planned(c.observed, c.desired), c.desired); len(again) != 0 {
				t.Errorf("not idempotent: second Diff = [%s]", ops(again))
			}
		})
	}
}

func TestCommandStringHidesPassword(t *testing.T) {
	c := Command{Op: OpSetClientPassword, Username: "a2a:a", Password: "s3cret"}
	if strings.Contains(c.String(), "s3cret") {
		t.Fatalf("password leaked: %s", c)
	}
}

func TestDesiredValidate(t *testing.T) {
	full := NewState([]Role{roleCaller, roleOther}, []Group{groupG}, []Client{clientA})
	if err := (Desired{State: full}).Validate(DefaultPrefix, State{}); err != nil {
		t.Fatalf("valid fleet refused: %v", err)
	}
	bad := []struct {
		name string
		d    Desired
		obs  State
		want string
	}{
		{"foreign role", Desired{State: NewState([]Role{{Name: "admin"}}, nil, nil)}, State{}, "prefix"},
		{"foreign delete", Desired{Delete: Names{Clients: []string{"admin"}}}, State{}, "prefix"},
		{"dangling role", Desired{State: NewState(nil, nil, []Client{{Username: "a2a:x", Roles: []RoleRef{{Name: "a2a:missing"}}}})}, State{}, "neither desired nor present"},
		{"role deleted while used", Desired{State: NewState(nil, nil, []Client{{Username: "a2a:x", Roles: []RoleRef{{Name: "a2a:r1"}}}}), Delete: Names{Roles: []string{"a2a:r1"}}}, full, "neither desired nor present"},
		{"dangling group", Desired{State: NewState(nil, nil, []Client{{Username: "a2a:x", Groups: []string{"a2a:nope"}}})}, State{}, "group"},
		{"duplicate ACL", Desired{State: NewState([]Role{{Name: "a2a:d", ACLs: []ACL{allow(PublishClientSend, "a", 0), deny(PublishClientSend, "a", 1)}}}, nil, nil)}, State{}, "two"},
		{"bad filter", Desired{State: NewState([]Role{{Name: "a2a:d", ACLs: []ACL{allow(PublishClientSend, "a/#/b", 0)}}}, nil, nil)}, State{}, "last level"},
		{"bad type", Desired{State: NewState([]Role{{Name: "a2a:d", ACLs: []ACL{{Type: "subscribe", Topic: "a"}}}}, nil, nil)}, State{}, "unknown ACL type"},
	}
	for _, b := range bad {
		err := b.d.Validate(DefaultPrefix, b.obs)
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: Validate = %v, want error containing %q", b.name, err, b.want)
		}
	}
	// A reference to an observed role is fine.
	d := Desired{State: NewState(nil, nil, []Client{{Username: "a2a:x", Roles: []RoleRef{{Name: "a2a:r1"}}}})}
	if err := d.Validate(DefaultPrefix, full); err != nil {
		t.Errorf("reference to observed role refused: %v", err)
	}
}

// TestOnlyLostContent: the shared reconcile treats a createRole race as expected only when every
// refusal in the error is one; anything else stays an error.
func TestOnlyLostContent(t *testing.T) {
	lost := &CommandError{Command: Command{Op: OpCreateRole, Role: "r", ACLs: []ACL{{Type: SubscribeLiteral, Topic: "t", Allow: true}}}, Verdict: LostContent, Message: "Role already exists"}
	emptyCreate := &CommandError{Command: Command{Op: OpCreateRole, Role: "r"}, Verdict: Refused, Message: "Role already exists"}
	other := &CommandError{Command: Command{Op: OpAddGroupRole, Group: "g", Role: "r"}, Verdict: Refused, Message: "Group not found"}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"lost content", lost, true},
		{"wrapped", fmt.Errorf("apply: %w", lost), true},
		{"joined, all lost", errors.Join(lost, fmt.Errorf("x: %w", lost)), true},
		{"joined with another refusal", errors.Join(lost, other), false},
		{"a create-only race (benign, not lost content)", emptyCreate, false},
		{"another refusal", other, false},
		{"a plain error", errors.New("timeout"), false},
	} {
		if got := OnlyLostContent(c.err); got != c.want {
			t.Errorf("%s: OnlyLostContent(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
