package conformance_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// Both backends say whom each command disconnected, and that is exactly
// whom the broker disconnected: checked with real connected clients, one
// command kind at a time (client-, group- and role-level kicks, and the
// commands that kick nobody).
func TestKicksAreReported(t *testing.T) {
	t.Parallel()
	forEachBroker(t, func(t *testing.T, b *broker) {
		const (
			userA, userB, userC = "a2a:k/a", "a2a:k/b", "a2a:k/c"
			roleA, roleC, roleG = "a2a:k-role-a", "a2a:k-role-c", "a2a:k-role-g"
			group               = "a2a:k-group"
		)
		sub := func(topic string) acl.ACL { return allow(acl.SubscribePattern, topic, 0) }
		st := acl.NewState(
			[]acl.Role{{Name: roleA, ACLs: []acl.ACL{sub("a/#")}}, {Name: roleC, ACLs: []acl.ACL{sub("c/#")}}, {Name: roleG, ACLs: []acl.ACL{sub("g/#")}}},
			[]acl.Group{{Name: group, Roles: []acl.RoleRef{{Name: roleG}}}},
			[]acl.Client{
				{Username: userA, Roles: []acl.RoleRef{{Name: roleA}}},
				{Username: userB, Groups: []string{group}},
				{Username: userC, Roles: []acl.RoleRef{{Name: roleC}}, Groups: []string{group}},
			})
		apply(t, b, acl.Desired{State: st, Passwords: map[string]string{userA: "pw", userB: "pw", userC: "pw"}})

		steps := []struct {
			name string
			cmd  acl.Command
			want []string
		}{
			{"modifyRole kicks nobody", acl.Command{Op: acl.OpModifyRole, Role: roleG, ACLs: []acl.ACL{sub("g/#"), sub("h/#")}}, nil},
			{"createRole kicks nobody", acl.Command{Op: acl.OpCreateRole, Role: "a2a:k-new"}, nil},
			{"modifyClient kicks its client", acl.Command{Op: acl.OpModifyClient, Username: userA, Roles: []acl.RoleRef{{Name: roleA}}}, []string{userA}},
			{"addGroupRole kicks the members", acl.Command{Op: acl.OpAddGroupRole, Group: group, Role: "a2a:k-new"}, []string{userB, userC}},
			{"removeRoleACL kicks the holders", acl.Command{Op: acl.OpRemoveRoleACL, Role: roleC, ACL: sub("c/#")}, []string{userC}},
			{"setClientPassword kicks its client", acl.Command{Op: acl.OpSetClientPassword, Username: userB, Password: "pw"}, []string{userB}},
		}
		for _, step := range steps {
			clients := []*client{mustDial(t, b, userA, "pw", ""), mustDial(t, b, userB, "pw", ""), mustDial(t, b, userC, "pw", "")}
			watch := brokertest.NewWatch()
			for _, c := range clients {
				watch.Add(c.Client)
			}
			before := b.backend.Stats()
			var mu sync.Mutex
			var reported []string
			ctx := acl.WithTrace(context.Background(), &acl.Trace{Kicked: func(k acl.Kick) {
				mu.Lock()
				defer mu.Unlock()
				reported = append(reported, k.Usernames...)
			}})
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := b.backend.Execute(ctx, []acl.Command{step.cmd}); err != nil {
				t.Fatalf("%s: %s: %v", b.name, step.name, err)
			}
			cancel()
			kicked := watch.Kicked()
			slices.Sort(reported)
			if !slices.Equal(kicked, step.want) {
				t.Errorf("%s: %s: the broker disconnected %v, want %v", b.name, step.name, kicked, step.want)
			}
			if !slices.Equal(reported, step.want) {
				t.Errorf("%s: %s: the backend reported %v, want %v", b.name, step.name, reported, step.want)
			}
			after := b.backend.Stats()
			if got := after.KickedUsernames - before.KickedUsernames; got != uint64(len(step.want)) {
				t.Errorf("%s: %s: Stats.KickedUsernames grew by %d, want %d", b.name, step.name, got, len(step.want))
			}
			for _, c := range clients {
				c.close()
			}
		}
	})
}
