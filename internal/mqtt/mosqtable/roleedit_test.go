package mosqtable

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
)

// memberRules are n rules of a shared role (one per member), in canonical order.
func memberRules(members ...int) []acl.ACL {
	out := make([]acl.ACL, 0, len(members))
	for _, i := range members {
		out = append(out, memberACL(i))
	}
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// loadedPlugin is a memory-only plugin with an (empty) imported table and a mirror of it.
func loadedPlugin(t *testing.T) (*Plugin, *embedded.Store) {
	t.Helper()
	p, err := StartPlugin(PluginConfig{AdminUsername: "admin", AdminPassword: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	mirror, err := embedded.NewStore(embedded.StoreConfig{KeepHashes: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mirror.Close() })
	table, err := mirror.ExportTable(nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := control(t, p, "admin", Request{ID: "import", Op: OpImport, Table: &table}); r.Error != "" {
		t.Fatalf("import: %+v", r)
	}
	return p, mirror
}

// both runs cmds on the plugin (whole lists) and on the mirror.
func both(t *testing.T, p *Plugin, mirror *embedded.Store, cmds []acl.Command) {
	t.Helper()
	if r := control(t, p, "admin", Request{ID: "whole", Op: OpExecute, Commands: cmds}); r.Error != "" || embedded.Errors(cmds, r.Outcomes) != nil {
		t.Fatalf("execute: %+v", r)
	}
	if err := mirror.Execute(context.Background(), cmds); err != nil {
		t.Fatal(err)
	}
}

func roleOf(t *testing.T, s *embedded.Store, name string) []acl.ACL {
	t.Helper()
	st, err := s.Observe(context.Background(), &acl.Names{Roles: []string{name}})
	if err != nil {
		t.Fatal(err)
	}
	return st.Roles[name].ACLs
}

// A new member of a large shared role reaches the plugin as an edit of the role it holds (a few
// hundred bytes instead of the whole list), and the plugin ends with exactly the list the
// command carried: a rule inserted in the middle, one dropped, one changed, and at the ends.
func TestRoleEditsRebuildTheCommandsList(t *testing.T) {
	const role = "a2a:unit:o/u1"
	p, mirror := loadedPlugin(t)
	both(t, p, mirror, []acl.Command{{Op: acl.OpCreateRole, Role: role, ACLs: memberRules(seq(0, 3000)...)}})

	changed := memberRules(seq(0, 3000)...)
	changed[2000].Allow = false
	for name, want := range map[string][]acl.ACL{
		"insert in the middle": memberRules(slices.Insert(seq(0, 3000), 1500, 7777)...),
		"drop one":             memberRules(slices.Delete(seq(0, 3000), 10, 11)...),
		"change one":           changed,
		"append":               memberRules(seq(0, 3001)...),
		"prepend":              memberRules(append([]int{9999}, seq(0, 3000)...)...),
	} {
		t.Run(name, func(t *testing.T) {
			both(t, p, mirror, []acl.Command{{Op: acl.OpModifyRole, Role: role, ACLs: memberRules(seq(0, 3000)...)}})
			cmds := []acl.Command{
				{Op: acl.OpCreateClient, Username: "a2a:" + name},
				{Op: acl.OpModifyRole, Role: role, ACLs: want},
			}
			wire, edits := roleEdits(mirror, cmds)
			if len(edits) != 1 || wire[1].ACLs != nil || cmds[1].ACLs == nil {
				t.Fatalf("want one edit of command 1 (the caller's commands untouched): %+v", edits)
			}
			req := Request{ID: name, Op: OpExecute, Commands: wire, Edits: edits, Base: p.Status().Generation}
			payload, _ := json.Marshal(req)
			whole, _ := json.Marshal(Request{ID: name, Op: OpExecute, Commands: cmds})
			if len(payload) > 2048 || len(whole) < 100*len(payload) {
				t.Errorf("the edit's message is %d bytes, the whole list's %d", len(payload), len(whole))
			}
			if r := control(t, p, "admin", req); r.Error != "" || embedded.Errors(cmds, r.Outcomes) != nil {
				t.Fatalf("execute with edits: %+v", r)
			}
			if err := mirror.Execute(context.Background(), cmds); err != nil {
				t.Fatal(err)
			}
			if got := roleOf(t, p.store, role); !slices.Equal(got, acl.Canonical(want)) {
				t.Fatalf("the plugin's role has %d rules, want the command's %d", len(got), len(want))
			}
			if got, mine := roleOf(t, p.store, role), roleOf(t, mirror, role); !slices.Equal(got, mine) {
				t.Fatal("the plugin's role differs from the mirror's")
			}
		})
	}
}

// An edit made against another generation of the table, or of a role that does not have the
// rules the edit was made for, is refused whole: nothing of the request is applied.
func TestRoleEditsAgainstAnotherTableAreRefused(t *testing.T) {
	const role = "a2a:org:o"
	p, mirror := loadedPlugin(t)
	both(t, p, mirror, []acl.Command{{Op: acl.OpCreateRole, Role: role, ACLs: memberRules(seq(0, 100)...)}})
	cmds := []acl.Command{
		{Op: acl.OpCreateClient, Username: "a2a:late"},
		{Op: acl.OpModifyRole, Role: role, ACLs: memberRules(seq(0, 101)...)},
	}
	wire, edits := roleEdits(mirror, cmds)
	if len(edits) != 1 {
		t.Fatalf("edits: %+v", edits)
	}
	gen := p.Status().Generation
	stale := []Request{
		{ID: "old generation", Op: OpExecute, Commands: wire, Edits: edits, Base: gen - 1},
		{ID: "other length", Op: OpExecute, Commands: wire, Edits: []RoleEdit{{Command: 1, Had: 99, Keep: 99, Insert: edits[0].Insert}}, Base: gen},
		{ID: "not a modifyRole", Op: OpExecute, Commands: wire, Edits: []RoleEdit{{Command: 0, Had: 100, Keep: 100}}, Base: gen},
		{ID: "out of range", Op: OpExecute, Commands: wire, Edits: []RoleEdit{{Command: 1, Had: 100, Keep: 60, KeepEnd: 60}}, Base: gen},
	}
	for _, req := range stale {
		if r := control(t, p, "admin", req); r.Error != ErrStaleEdit || r.Status.Generation != gen {
			t.Errorf("%s: error %q at generation %d, want %q and nothing applied (generation %d)", req.ID, r.Error, r.Status.Generation, ErrStaleEdit, gen)
		}
	}
	if st := p.Status(); st.Clients != 0 || len(roleOf(t, p.store, role)) != 100 {
		t.Errorf("a refused request changed the table: %+v, %d rules", st, len(roleOf(t, p.store, role)))
	}
}

// Through the broker: the operator's backend sends a large shared role's change as an edit, and
// when another admin changed the table since its mirror was made (the edit refused), it reads the
// table again and sends the list whole; either way the broker decides from the command's list.
func TestBackendSendsLargeRolesAsEdits(t *testing.T) {
	const role = "a2a:org:o"
	m := startBroker(t)
	be := connect(t, m)
	execute(t, be, append(fleet(3), acl.Command{Op: acl.OpCreateRole, Role: role, ACLs: memberRules(seq(0, 500)...)},
		acl.Command{Op: acl.OpAddClientRole, Username: "a2a:o/u/agent-00001", Role: role}))
	other := connect(t, m)

	for round, author := range []*Backend{be, other, be} {
		members := seq(0, 501+round)
		before := be.roundTrips.Load()
		execute(t, author, []acl.Command{{Op: acl.OpModifyRole, Role: role, ACLs: memberRules(members...)}})
		if author == be && round == 2 && be.roundTrips.Load()-before < 3 {
			t.Errorf("after another admin's change the edit should be refused and the table read again (%d round trips)", be.roundTrips.Load()-before)
		}
		c, err := brokertest.Dial(t, m.Addr(), brokertest.Options{Username: "a2a:o/u/agent-00001", Password: "pw-a2a:o/u/agent-00001", ClientID: "a2a:o/u/agent-00001"})
		if err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, m.Log())
		}
		newest := memberACL(members[len(members)-1]).Topic
		if code := c.Publish(newest, "x"); code >= 0x80 {
			t.Errorf("round %d: publish to the newest member %s refused (%#x)", round, newest, code)
		}
		if code := c.Publish(fmt.Sprintf("rpc/o/u0/agent-%05d/request", 9000), "x"); code < 0x80 {
			t.Errorf("round %d: publish to a non-member accepted", round)
		}
		c.Close()
	}
	if be.mirror == nil || !slices.Equal(roleOf(t, be.mirror, role), memberRules(seq(0, 503)...)) {
		t.Error("the mirror does not hold the last list")
	}
}

// A large role's changes go to the disk as edit records (a few rules each, not the role), and
// every maxRoleEdits of them the role is written whole again; a restarted plugin rebuilds the
// role from its record and its edits, exactly.
func TestJournalWritesLargeRolesAsEdits(t *testing.T) {
	const role = "a2a:org:o"
	dir := t.TempDir()
	start := func() *Plugin {
		p, err := StartPlugin(PluginConfig{StateDir: dir, AdminUsername: "admin", AdminPassword: "secret"})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := start()
	mirror, err := embedded.NewStore(embedded.StoreConfig{KeepHashes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mirror.Close()
	table, _ := mirror.ExportTable(nil)
	if r := control(t, p, "admin", Request{ID: "import", Op: OpImport, Table: &table}); r.Error != "" {
		t.Fatalf("import: %+v", r)
	}
	members := seq(0, 2000)
	modify := func(members []int) {
		t.Helper()
		cmds := []acl.Command{{Op: acl.OpModifyRole, Role: role, ACLs: memberRules(members...)}}
		if len(members) == 2000 {
			cmds[0].Op = acl.OpCreateRole
		}
		if r := control(t, p, "admin", Request{ID: "m", Op: OpExecute, Commands: cmds}); r.Error != "" || embedded.Errors(cmds, r.Outcomes) != nil {
			t.Fatalf("execute: %+v", r)
		}
		if err := p.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	modify(members)
	var records []int
	for i := range maxRoleEdits + 10 {
		if i%7 == 3 {
			members = slices.Delete(members, 100+i, 101+i) // a member leaves
		} else {
			members = slices.Insert(members, 500+i, 5000+i) // one joins
		}
		modify(members)
		_ = p.disk.db.View(func(tx *bolt.Tx) error {
			records = append(records, tx.Bucket(bucketRoleEdits).Stats().KeyN)
			return nil
		})
	}
	if records[0] != 1 || records[maxRoleEdits-1] != maxRoleEdits || records[maxRoleEdits] != 0 || records[len(records)-1] != 9 {
		t.Errorf("edit records after each change: %v, want 1..%d, then 0 (the role written whole) and counting again", records, maxRoleEdits)
	}
	_ = p.disk.db.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(bucketMeta); meta.Get(keyEpoch) != nil || meta.Get(keyEpochEdits) == nil {
			t.Error("a file with role edits keeps its epoch where a plugin from before them would find it (it would load the roles without their edits)")
		}
		return nil
	})
	want := roleOf(t, p.store, role)
	if !slices.Equal(want, memberRules(members...)) {
		t.Fatal("the plugin's role is not the last command's list")
	}
	gen := p.Status().Generation
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = start()
	defer p.Close()
	if st := p.Status(); !st.Loaded || st.Generation != gen {
		t.Fatalf("after a restart: %+v, want the table of generation %d", st, gen)
	}
	if got := roleOf(t, p.store, role); !slices.Equal(got, want) {
		t.Fatalf("after a restart the role has %d rules, want the %d it had", len(got), len(want))
	}
}

// The backend sends each password it sets with its at-rest form, so that the plugin and the
// mirror do not hash it again; the form is the password's (a store that loads it accepts the
// password), and the caller's commands are left as they were.
func TestBackendSendsPasswordHashes(t *testing.T) {
	cmds := []acl.Command{
		{Op: acl.OpCreateRole, Role: "a2a:r"},
		{Op: acl.OpCreateClient, Username: "a2a:a", Password: "pw-a"},
		{Op: acl.OpSetClientPassword, Username: "a2a:b", Password: "pw-b"},
	}
	out, err := withPasswordHashes(cmds)
	if err != nil {
		t.Fatal(err)
	}
	if cmds[1].PasswordHash != nil || cmds[2].PasswordHash != nil {
		t.Fatal("the caller's commands were changed")
	}
	if out[0].PasswordHash != nil || out[1].PasswordHash == nil || out[2].PasswordHash == nil {
		t.Fatalf("forms on %v %v %v, want on the two password commands only", out[0].PasswordHash, out[1].PasswordHash, out[2].PasswordHash)
	}
	s, err := embedded.NewStore(embedded.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	table := embedded.Table{Version: embedded.TableVersion, State: acl.NewState(nil, nil, []acl.Client{{Username: "a2a:a"}}),
		Credentials: map[string]*embedded.Credential{"a2a:a": {Salt: out[1].PasswordHash.Salt, Iterations: out[1].PasswordHash.Iterations, Hash: out[1].PasswordHash.Hash}}}
	if err := s.ImportTable(table); err != nil {
		t.Fatal(err)
	}
	if !s.Authenticate("a2a:a", "pw-a", "") || s.Authenticate("a2a:a", "pw-b", "") {
		t.Fatal("the form sent is not the password's")
	}
}
