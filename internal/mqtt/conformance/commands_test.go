package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// The embedded store must answer every dynsec command like Mosquitto does:
// same error text (or benign success) for the same sequence, and the same
// resulting state.
func TestCommandParity(t *testing.T) {
	t.Parallel()
	m, e := startMosquitto(t), startEmbedded(t)
	p1 := []acl.ACL{allow(acl.PublishClientSend, "a/#", 0), allow(acl.SubscribePattern, "a/#", 0)}
	seq := []acl.Command{
		{Op: acl.OpCreateRole, Role: "a2a:p1", ACLs: p1},
		{Op: acl.OpCreateRole, Role: "a2a:p1"}, // exists: benign
		{Op: acl.OpModifyRole, Role: "a2a:missing"},
		{Op: acl.OpAddRoleACL, Role: "a2a:p1", ACL: allow(acl.PublishClientSend, "a/#", 3)}, // same topic: benign
		{Op: acl.OpAddRoleACL, Role: "a2a:missing", ACL: allow(acl.PublishClientSend, "b", 0)},
		{Op: acl.OpAddRoleACL, Role: "a2a:p1", ACL: acl.ACL{Type: "bogus", Topic: "b"}},
		{Op: acl.OpAddRoleACL, Role: "a2a:p1", ACL: deny(acl.PublishClientSend, "a/secret", 9)},
		{Op: acl.OpRemoveRoleACL, Role: "a2a:p1", ACL: allow(acl.SubscribeLiteral, "zzz", 0)}, // absent: benign
		{Op: acl.OpCreateClient, Username: "a2a:c1", Password: "pw", Groups: []string{"a2a:no-group"}},
		{Op: acl.OpCreateClient, Username: "a2a:c1", Password: "pw", ClientID: "id-1"},
		{Op: acl.OpCreateClient, Username: "a2a:c1", Password: "pw"}, // exists: benign
		{Op: acl.OpAddClientRole, Username: "a2a:c1", Role: "a2a:p1", Priority: 2},
		{Op: acl.OpAddClientRole, Username: "a2a:c1", Role: "a2a:p1", Priority: 2}, // "Internal error" (sic)
		{Op: acl.OpAddClientRole, Username: "a2a:nobody", Role: "a2a:p1"},
		{Op: acl.OpAddClientRole, Username: "a2a:c1", Role: "a2a:missing"},
		{Op: acl.OpRemoveClientRole, Username: "a2a:c1", Role: "a2a:missing"},
		{Op: acl.OpCreateGroup, Group: "a2a:g1"},
		{Op: acl.OpCreateGroup, Group: "a2a:g1"}, // benign
		{Op: acl.OpAddGroupRole, Group: "a2a:g1", Role: "a2a:p1", Priority: 4},
		{Op: acl.OpAddGroupRole, Group: "a2a:g1", Role: "a2a:p1", Priority: 4}, // benign
		{Op: acl.OpAddGroupRole, Group: "a2a:g-missing", Role: "a2a:p1"},
		{Op: acl.OpAddGroupClient, Group: "a2a:g1", Username: "a2a:c1"},
		{Op: acl.OpAddGroupClient, Group: "a2a:g1", Username: "a2a:c1"}, // benign
		{Op: acl.OpAddGroupClient, Group: "a2a:g-missing", Username: "a2a:c1"},
		{Op: acl.OpModifyClient, Username: "a2a:nobody"},
		{Op: acl.OpModifyClient, Username: "a2a:c1", ClientID: "id-2", Roles: []acl.RoleRef{{Name: "a2a:missing"}}, Groups: []string{"a2a:g1"}},
		{Op: acl.OpSetClientID, Username: "a2a:nobody", ClientID: "x"},
		{Op: acl.OpSetClientPassword, Username: "a2a:nobody", Password: "x"},
		{Op: acl.OpRemoveGroupRole, Group: "a2a:g1", Role: "a2a:missing"},
		{Op: acl.OpRemoveGroupClient, Group: "a2a:g1", Username: "a2a:nobody"},
		{Op: acl.OpDeleteGroup, Group: "a2a:g-missing"},  // benign
		{Op: acl.OpDeleteClient, Username: "a2a:nobody"}, // benign
		{Op: acl.OpCreateRole, Role: "a2a:p2", ACLs: p1}, // then delete it while it is in use
		{Op: acl.OpAddClientRole, Username: "a2a:c1", Role: "a2a:p2", Priority: -3},
		{Op: acl.OpDeleteRole, Role: "a2a:p2"},
		{Op: acl.OpDeleteRole, Role: "a2a:p2"}, // benign
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, c := range seq {
		var res [2]string
		for j, b := range []*broker{m, e} {
			if err := b.backend.Execute(ctx, []acl.Command{c}); err != nil {
				res[j] = err.Error()
			}
		}
		if res[0] != res[1] {
			t.Errorf("command %d %s:\n  mosquitto: %q\n  embedded:  %q", i, c, res[0], res[1])
		}
	}
	var states [2]string
	for j, b := range []*broker{m, e} {
		st, err := b.backend.Observe(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		js, _ := json.Marshal(st)
		states[j] = string(js)
	}
	if states[0] != states[1] {
		t.Errorf("state differs:\n  mosquitto: %s\n  embedded:  %s", states[0], states[1])
	}
}

// agentFleet is n agents, each with its own role and client, all in one
// org-wide group: the shape the ACL compiler is expected to produce.
func agentFleet(n int) acl.Desired {
	roles := []acl.Role{{Name: "a2a:org/acme", ACLs: []acl.ACL{allow(acl.SubscribePattern, "$a2a/v1/discovery/acme/#", 0)}}}
	groups := []acl.Group{{Name: "a2a:org/acme", Roles: []acl.RoleRef{{Name: "a2a:org/acme"}}}}
	var clients []acl.Client
	pw := map[string]string{}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("acme/u/agent-%03d", i)
		roles = append(roles, acl.Role{Name: "a2a:" + id, ACLs: []acl.ACL{
			allow(acl.SubscribePattern, "$a2a/v1/request/"+id, 0),
			allow(acl.SubscribePattern, "$a2a/v1/reply/"+id+"/#", 0),
			allow(acl.PublishClientSend, "$a2a/v1/request/acme/#", 0),
			allow(acl.PublishClientSend, "$a2a/v1/reply/acme/#", 0),
			allow(acl.PublishClientSend, "$a2a/v1/discovery/"+id, 0),
		}})
		clients = append(clients, acl.Client{Username: "a2a:" + id, ClientID: id,
			Roles: []acl.RoleRef{{Name: "a2a:" + id}}, Groups: []string{"a2a:org/acme"}})
		pw["a2a:"+id] = "pw-" + id
	}
	st := acl.NewState(roles, groups, clients)
	st.DefaultACL = &acl.DenyByDefault
	return acl.Desired{State: st, Passwords: pw}
}

// The command counts docs/broker.md promises, enforced on both backends.
func TestCommandCounts(t *testing.T) {
	t.Parallel()
	forEachBroker(t, func(t *testing.T, b *broker) {
		const n = 10
		count := func(d acl.Desired) int {
			t.Helper()
			before := b.backend.Stats().Mutations
			res := apply(t, b, d)
			if got := int(b.backend.Stats().Mutations - before); got != len(res.Commands) {
				t.Fatalf("Stats.Mutations moved by %d for %d commands", got, len(res.Commands))
			}
			return len(res.Commands)
		}
		d := agentFleet(n)
		if got, want := count(d), 3*n+3; got != want {
			t.Errorf("%s: create %d agents: %d commands, want %d (createRole+createClient+modifyClient each, plus the org role and group)", b.name, n, got, want)
		}
		if got := count(d); got != 0 {
			t.Errorf("%s: re-apply: %d commands, want 0", b.name, got)
		}
		// one agent gains a publish grant: one modifyRole
		r := d.Roles["a2a:acme/u/agent-003"]
		r.ACLs = append(r.ACLs, allow(acl.PublishClientSend, "$a2a/v1/event/acme/u/agent-003", 0))
		d.Roles[r.Name] = r
		if got := count(d); got != 1 {
			t.Errorf("%s: grant: %d commands, want 1", b.name, got)
		}
		// one agent loses a subscribe grant: kick + modifyRole
		r.ACLs = r.ACLs[1:]
		d.Roles[r.Name] = r
		if got := count(d); got != 2 {
			t.Errorf("%s: revoke: %d commands, want 2", b.name, got)
		}
		// one agent gets a fixed client ID changed: one modifyClient
		c := d.Clients["a2a:acme/u/agent-004"]
		c.ClientID = "renamed"
		d.Clients[c.Username] = c
		if got := count(d); got != 1 {
			t.Errorf("%s: client change: %d commands, want 1", b.name, got)
		}
		// one agent deleted: deleteClient + deleteRole
		gone := "a2a:acme/u/agent-005"
		delete(d.Roles, gone)
		delete(d.Clients, gone)
		d.Delete = acl.Names{Roles: []string{gone}, Clients: []string{gone}}
		if got := count(d); got != 2 {
			t.Errorf("%s: delete one agent: %d commands, want 2", b.name, got)
		}
		// everything pruned: one delete per object
		if got, want := count(acl.Desired{Prune: true}), 2*(n-1)+2; got != want {
			t.Errorf("%s: prune all: %d commands, want %d", b.name, got, want)
		}
	})
}

// BenchmarkApplyAgents measures creating a fleet from scratch; run with
// go test -run XXX -bench ApplyAgents ./internal/mqtt/conformance/
func BenchmarkApplyAgents(b *testing.B) {
	for _, n := range []int{100, 500} {
		for _, kind := range []string{"mosquitto", "embedded", "table"} {
			b.Run(fmt.Sprintf("%s/agents=%d", kind, n), func(b *testing.B) {
				var cmds, total int
				var elapsed time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					br := benchBroker(b, kind)
					d := agentFleet(n)
					b.StartTimer()
					t0 := time.Now()
					res, err := acl.Apply(context.Background(), br.backend, d)
					elapsed += time.Since(t0)
					if err != nil {
						b.Fatal(err)
					}
					cmds += len(res.Commands)
					total += n
				}
				b.ReportMetric(float64(cmds)/float64(total), "cmds/agent")
				b.ReportMetric(float64(elapsed.Microseconds())/1000/float64(total), "ms/agent")
			})
		}
	}
}

func benchBroker(b *testing.B, kind string) *broker {
	switch kind {
	case "mosquitto":
		return startMosquitto(b)
	case "table":
		return startTable(b)
	}
	return startEmbedded(b)
}
