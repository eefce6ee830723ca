package mosqtable

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
)

func control(t *testing.T, p *Plugin, sender string, req Request) Response {
	t.Helper()
	payload, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var resp Response
	if err := json.Unmarshal(p.Control(sender, payload), &resp); err != nil {
		t.Fatalf("response: %v", err)
	}
	return resp
}

var agentCommands = []acl.Command{
	{Op: acl.OpCreateRole, Role: "a2a:r", ACLs: []acl.ACL{{Type: acl.PublishClientSend, Topic: "x/#", Allow: true}}},
	{Op: acl.OpCreateClient, Username: "a2a:u", Password: "pw"},
	{Op: acl.OpAddClientRole, Username: "a2a:u", Role: "a2a:r", Priority: 1},
}

// The plugin on a disk without a table lets only its admin in, refuses commands, and after
// an import decides from the imported table; a restart on the same disk keeps it, a restart
// on an emptied disk fails closed again.
func TestPluginFailsClosedUntilImportAndPersists(t *testing.T) {
	dir := t.TempDir()
	start := func() *Plugin {
		p, err := StartPlugin(PluginConfig{StateDir: dir, AdminUsername: "admin", AdminPassword: "secret"})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := start()
	if p.Status().Loaded {
		t.Fatal("a new disk holds no table, yet the plugin says it is loaded")
	}
	if !p.Authenticate(1, "admin", "secret", "op") {
		t.Fatal("the bootstrap admin is refused before the table is loaded")
	}
	if r := control(t, p, "admin", Request{ID: "1", Op: OpExecute, Commands: agentCommands}); r.Error != ErrTableNotLoaded {
		t.Fatalf("execute before import: error %q, want %q", r.Error, ErrTableNotLoaded)
	}
	if r := control(t, p, "a2a:u", Request{ID: "2", Op: OpStatus}); r.Error == "" {
		t.Fatal("a non-admin's control request was answered")
	}

	// The operator's mirror, exported: the table a broker gets back in one message.
	mirror, err := embedded.NewStore(embedded.StoreConfig{KeepHashes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mirror.Close()
	if err := mirror.Execute(t.Context(), agentCommands); err != nil {
		t.Fatal(err)
	}
	table, err := mirror.ExportTable(nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Authenticate(2, "a2a:u", "pw", "c1") {
		t.Fatal("a client is let in before the table is imported (fail closed)")
	}
	if r := control(t, p, "admin", Request{ID: "3", Op: OpImport, Table: &table}); r.Error != "" || !r.Status.Loaded || r.Status.Clients != 1 {
		t.Fatalf("import: %+v", r)
	}
	if !p.Authenticate(3, "a2a:u", "pw", "c1") || p.Authenticate(4, "a2a:u", "wrong", "c1") {
		t.Fatal("after the import the imported password decides CONNECT")
	}
	if !p.Allows("a2a:u", acl.Publish, "x/y") || p.Allows("a2a:u", acl.Publish, "z") {
		t.Fatal("after the import the imported roles decide PUBLISH")
	}
	r := control(t, p, "admin", Request{ID: "4", Op: OpExecute, Commands: []acl.Command{
		{Op: acl.OpCreateClient, Username: "a2a:v", Password: "pw2"},
		{Op: acl.OpDeleteRole, Role: "a2a:r"},
	}})
	if r.Error != "" || len(r.Outcomes) != 2 || r.Outcomes[0].Verdict != acl.Applied || len(r.Outcomes[1].Kicked) != 1 {
		t.Fatalf("execute: %+v (the role's holder was connected: it is kicked)", r)
	}
	epoch := r.Status.Epoch
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	p = start()
	st := p.Status()
	if !st.Loaded || st.Epoch != epoch || st.Clients != 2 || st.Roles != 0 {
		t.Fatalf("restart on the same disk: %+v, want the table of epoch %s with 2 clients and no role", st, epoch)
	}
	if !p.Authenticate(5, "a2a:v", "pw2", "c2") || p.Allows("a2a:u", acl.Publish, "x/y") {
		t.Fatal("restart on the same disk: the persisted changes decide")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	p = start()
	defer p.Close()
	if p.Status().Loaded || p.Authenticate(6, "a2a:v", "pw2", "c2") || !p.Authenticate(7, "admin", "secret", "op") {
		t.Fatalf("restart on an empty disk: %+v: only the admin may connect until an import", p.Status())
	}
}

// An import in parts installs nothing before its last part, and the parts of a table, merged,
// are the table.
func TestImportInParts(t *testing.T) {
	mirror, err := embedded.NewStore(embedded.StoreConfig{KeepHashes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mirror.Close()
	var cmds []acl.Command
	for i := range 25 {
		role, user := fmt.Sprintf("a2a:r%02d", i), fmt.Sprintf("a2a:u%02d", i)
		cmds = append(cmds,
			acl.Command{Op: acl.OpCreateRole, Role: role, ACLs: []acl.ACL{{Type: acl.PublishClientSend, Topic: "t/" + user, Allow: true}}},
			acl.Command{Op: acl.OpCreateClient, Username: user, Password: "pw"},
			acl.Command{Op: acl.OpAddClientRole, Username: user, Role: role})
	}
	if err := mirror.Execute(t.Context(), cmds); err != nil {
		t.Fatal(err)
	}
	table, err := mirror.ExportTable(nil)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := splitTable(table, 7, importPartBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 8 { // 50 objects, 7 per part
		t.Fatalf("%d parts, want 8", len(parts))
	}
	p, err := StartPlugin(PluginConfig{AdminUsername: "admin", AdminPassword: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i, part := range parts {
		if n := len(part.State.Roles) + len(part.State.Clients); n > 7 {
			t.Errorf("part %d holds %d objects", i, n)
		}
		r := control(t, p, "admin", Request{ID: fmt.Sprint(i), Op: OpImport, Table: &part, Import: "x", Part: i, More: i < len(parts)-1})
		if r.Error != "" {
			t.Fatalf("part %d: %s", i, r.Error)
		}
		if last := i == len(parts)-1; r.Status.Loaded != last {
			t.Fatalf("after part %d of %d the plugin says loaded=%v", i+1, len(parts), r.Status.Loaded)
		}
	}
	if st := p.Status(); st.Clients != 25 || st.Roles != 25 {
		t.Fatalf("after the import: %+v", st)
	}
	if !p.Authenticate(8, "a2a:u24", "pw", "c") || !p.Allows("a2a:u24", acl.Publish, "t/a2a:u24") {
		t.Fatal("the imported table does not decide")
	}
	if r := control(t, p, "admin", Request{ID: "z", Op: OpImport, Table: &parts[1], Import: "y", Part: 1}); r.Error == "" {
		t.Error("a part out of order was accepted")
	}
}

// Import parts are bounded in bytes, not only in objects: roles with many rules (an Agent with
// callers and selectors) would make a part of MaxBatch objects larger than the broker's
// max_packet_size, which drops the admin connection at every attempt. Every part here stays
// within the byte budget, and the parts together are the whole table.
func TestImportPartsStayUnderTheByteBudget(t *testing.T) {
	mirror, err := embedded.NewStore(embedded.StoreConfig{KeepHashes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mirror.Close()
	var cmds []acl.Command
	for i := range 40 {
		role, user := fmt.Sprintf("a2a:r%02d", i), fmt.Sprintf("a2a:u%02d", i)
		var rules []acl.ACL
		for j := range 30 {
			rules = append(rules, acl.ACL{Type: acl.PublishClientSend, Topic: fmt.Sprintf("a2a/v1/org/unit%d/agent%05d/request/#", j%10, j), Allow: true})
		}
		cmds = append(cmds,
			acl.Command{Op: acl.OpCreateRole, Role: role, ACLs: rules},
			acl.Command{Op: acl.OpCreateClient, Username: user, Password: "pw"},
			acl.Command{Op: acl.OpAddClientRole, Username: user, Role: role})
	}
	if err := mirror.Execute(t.Context(), cmds); err != nil {
		t.Fatal(err)
	}
	table, err := mirror.ExportTable(nil)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := json.Marshal(table)
	if err != nil {
		t.Fatal(err)
	}
	const budget = 16 << 10
	if len(whole) < 3*budget {
		t.Fatalf("the table encodes to %d bytes: too small to need parts of %d", len(whole), budget)
	}
	parts, err := splitTable(table, 1000, budget)
	if err != nil {
		t.Fatal(err)
	}
	roles, clients := 0, 0
	for i, part := range parts {
		b, err := json.Marshal(part)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > budget+1024 { // the part's own envelope: version, default ACL
			t.Errorf("part %d of %d encodes to %d bytes, over the budget %d", i+1, len(parts), len(b), budget)
		}
		roles, clients = roles+len(part.State.Roles), clients+len(part.State.Clients)
	}
	if roles != 40 || clients != 40 || len(parts) < 3 {
		t.Fatalf("%d parts hold %d roles and %d clients, want all 40 of each in at least 3 parts", len(parts), roles, clients)
	}
}

// A rotated password is on the disk: after a restart the new password opens and the old one
// does not (a password change touches no role, group or client entry, so it needs its own
// journal entry).
func TestRotatedPasswordSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	start := func() *Plugin {
		p, err := StartPlugin(PluginConfig{StateDir: dir, AdminUsername: "admin", AdminPassword: "secret"})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	mirror, err := embedded.NewStore(embedded.StoreConfig{KeepHashes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mirror.Close()
	if err := mirror.Execute(t.Context(), agentCommands); err != nil {
		t.Fatal(err)
	}
	table, err := mirror.ExportTable(nil)
	if err != nil {
		t.Fatal(err)
	}
	p := start()
	if r := control(t, p, "admin", Request{ID: "1", Op: OpImport, Table: &table}); r.Error != "" {
		t.Fatalf("import: %+v", r)
	}
	// The imported table on the disk first, so that no later change rides on its full write.
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, c := range []acl.Command{
		{Op: acl.OpSetClientPassword, Username: "a2a:u", Password: "rotated"},
		{Op: acl.OpCreateClient, Username: "a2a:w", Password: "first"},
		{Op: acl.OpModifyClient, Username: "a2a:w", Password: "modified"},
	} {
		r := control(t, p, "admin", Request{ID: fmt.Sprint(i + 2), Op: OpExecute, Commands: []acl.Command{c}})
		if r.Error != "" || len(r.Outcomes) != 1 || r.Outcomes[0].Verdict != acl.Applied {
			t.Fatalf("%s: %+v", c.Op, r)
		}
		// Each command in a round of its own: the password, not a neighbour, must reach the disk.
		if err := p.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = start()
	defer p.Close()
	if !p.Authenticate(9, "a2a:u", "rotated", "c1") || p.Authenticate(10, "a2a:u", "pw", "c1") {
		t.Fatal("after a restart: want the rotated password accepted and the old one refused")
	}
	if !p.Authenticate(11, "a2a:w", "modified", "c2") || p.Authenticate(12, "a2a:w", "first", "c2") {
		t.Fatal("after a restart: want the modified password accepted and the first one refused")
	}
}
