package acl

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Op is a dynsec command name. Only the commands Diff emits, plus the ones
// tests use to simulate hand-made drift, are listed.
type Op string

// The broker model's changes: create, modify or delete a client, a role or a group; add or
// remove one of a role's rules, a role of a client or a group, a client of a group; set a
// client's password or client id; set the default access. Each backend maps them to its own
// API (package dynsec: Mosquitto's dynamic-security commands, wire.go; package embedded: its
// store) and judges its own replies (Verdict). The values are for logs and errors.
const (
	OpSetDefaultACLAccess Op = "set default access"
	OpCreateRole          Op = "create role"
	OpModifyRole          Op = "modify role"
	OpDeleteRole          Op = "delete role"
	OpAddRoleACL          Op = "add role rule"
	OpRemoveRoleACL       Op = "remove role rule"
	OpCreateGroup         Op = "create group"
	OpDeleteGroup         Op = "delete group"
	OpAddGroupRole        Op = "add group role"
	OpRemoveGroupRole     Op = "remove group role"
	OpCreateClient        Op = "create client"
	OpModifyClient        Op = "modify client"
	OpDeleteClient        Op = "delete client"
	OpSetClientPassword   Op = "set client password"
	OpSetClientID         Op = "set client id"
	OpAddClientRole       Op = "add client role"
	OpRemoveClientRole    Op = "remove client role"
	OpAddGroupClient      Op = "add group client"
	OpRemoveGroupClient   Op = "remove group client"
)

// Command is one change to the broker's state. Which fields matter depends on Op (the fields
// mirror Mosquitto's dynamic-security JSON, the first backend; see docs/broker.md); backends
// translate it.
type Command struct {
	Op       Op
	Role     string // rolename
	Group    string // groupname
	Username string
	// ClientID for createClient/modifyClient/setClientId ("" clears).
	ClientID string
	// Password for createClient/setClientPassword ("" on createClient: no
	// password, the client cannot log in until one is set).
	Password string
	// PasswordHash, when set with Password, is its at-rest form computed by
	// the sender: a store that keeps that form takes it instead of computing
	// it again (the decision-table plugin; dynsec ignores it).
	PasswordHash *PasswordHash `json:"PasswordHash,omitempty"`
	// ACLs is the full list for createRole/modifyRole.
	ACLs []ACL
	// Splice, on a modifyRole without ACLs, gives the full list as an edit
	// of the role's current one: the embedded store applies it in the time
	// of the edit. Only the decision-table plugin sets it (from the edit its
	// request carries); it is never encoded.
	Splice *RoleSplice `json:"-"`
	// ACL is the single rule of addRoleACL/removeRoleACL.
	ACL ACL
	// Priority of addClientRole/addGroupRole.
	Priority int
	// Roles and Groups are the full lists of modifyClient (Groups also of
	// createClient).
	Roles  []RoleRef
	Groups []string
	// Default is the access of setDefaultACLAccess.
	Default DefaultACLAccess
}

// Target names the object a command acts on, for error messages.
func (c Command) Target() string {
	switch {
	case c.Op == OpSetDefaultACLAccess:
		return "default ACL access"
	case c.Op == OpAddGroupRole || c.Op == OpRemoveGroupRole:
		return fmt.Sprintf("group %q role %q", c.Group, c.Role)
	case c.Op == OpAddClientRole || c.Op == OpRemoveClientRole:
		return fmt.Sprintf("client %q role %q", c.Username, c.Role)
	case c.Op == OpAddGroupClient || c.Op == OpRemoveGroupClient:
		return fmt.Sprintf("group %q client %q", c.Group, c.Username)
	case c.Op == OpAddRoleACL || c.Op == OpRemoveRoleACL:
		return fmt.Sprintf("role %q %s %q", c.Role, c.ACL.Type, c.ACL.Topic)
	case c.Role != "":
		return fmt.Sprintf("role %q", c.Role)
	case c.Group != "":
		return fmt.Sprintf("group %q", c.Group)
	case c.Username != "":
		return fmt.Sprintf("client %q", c.Username)
	}
	return "?"
}

// String never includes the password.
func (c Command) String() string { return string(c.Op) + ": " + c.Target() }

// Kicks reports whether Mosquitto 2.0.11 disconnects clients when it runs
// this command (the plugin's "enforce any changes" kicks); the embedded
// broker mirrors it. Creations, modifyRole and setDefaultACLAccess do not.
func (c Command) Kicks() bool {
	switch c.Op {
	case OpCreateRole, OpModifyRole, OpCreateGroup, OpCreateClient, OpSetDefaultACLAccess:
		return false
	}
	return true
}

// Diff returns the commands that turn observed into the state desired by d,
// in an order the broker can execute in one batch (roles before the groups
// and clients that use them, deletions of roles last). It emits nothing for
// objects that already match, so applying twice costs zero commands.
//
// Choices, all driven by what Mosquitto 2.0.11 does (docs/broker.md):
//   - a role is created with its ACLs inline (1 command) and changed with
//     modifyRole carrying the full list (1 command, no disconnects); when the
//     change takes away a subscribe grant, one removeRoleACL/addRoleACL of
//     that rule goes first because it disconnects the role's clients, so
//     existing subscriptions are re-checked on reconnect;
//   - a client is created without roles (createClient's inline roles leave a
//     dangling pointer in 2.0.11 when the role is later deleted) but with
//     its groups, then modifyClient sets the roles: 2 commands at most. Any
//     later change is one modifyClient (roles, groups and client ID at once;
//     it disconnects the client, as every client change does);
//   - groups get createGroup plus one addGroupRole per role (createGroup's
//     inline roles have the same dangling-pointer bug), and
//     removeGroupRole/addGroupRole for changes;
//   - passwords are only sent on creation (see Desired.Passwords).
//
// d is assumed valid (Desired.Validate).
func Diff(observed State, d Desired) []Command {
	var cmds []Command

	if d.DefaultACL != nil && (observed.DefaultACL == nil || *observed.DefaultACL != *d.DefaultACL) {
		cmds = append(cmds, Command{Op: OpSetDefaultACLAccess, Default: *d.DefaultACL})
	}

	delRoles, delGroups, delClients := deletions(observed, d)

	// Clients go first so that deleting their groups and roles does not
	// disconnect anyone twice.
	for _, u := range delClients {
		cmds = append(cmds, Command{Op: OpDeleteClient, Username: u})
	}
	for _, g := range delGroups {
		cmds = append(cmds, Command{Op: OpDeleteGroup, Group: g})
	}

	for _, name := range sortedKeys(d.Roles) {
		want := d.Roles[name]
		have, ok := observed.Roles[name]
		if !ok {
			cmds = append(cmds, Command{Op: OpCreateRole, Role: name, ACLs: Canonical(want.ACLs)})
			continue
		}
		oldACLs, newACLs := Canonical(have.ACLs), Canonical(want.ACLs)
		if slices.Equal(oldACLs, newACLs) {
			continue
		}
		if kick, ok := revocationKick(name, oldACLs, newACLs); ok {
			cmds = append(cmds, kick)
		}
		cmds = append(cmds, Command{Op: OpModifyRole, Role: name, ACLs: newACLs})
	}

	for _, name := range d.CreateRoles {
		_, have := observed.Roles[name]
		_, desired := d.Roles[name]
		if !have && !desired {
			cmds = append(cmds, Command{Op: OpCreateRole, Role: name})
		}
	}

	for _, name := range sortedKeys(d.Groups) {
		want := d.Groups[name]
		have, ok := observed.Groups[name]
		if !ok {
			cmds = append(cmds, Command{Op: OpCreateGroup, Group: name})
		}
		cmds = append(cmds, groupRefChanges(name, have.Roles, want.Roles)...)
	}

	for _, user := range sortedKeys(d.Clients) {
		want := d.Clients[user]
		have, ok := observed.Clients[user]
		if !ok {
			cmds = append(cmds, Command{Op: OpCreateClient, Username: user, ClientID: want.ClientID,
				Password: d.Passwords[user], Groups: sortedStrings(want.Groups)})
			if len(want.Roles) > 0 {
				cmds = append(cmds, Command{Op: OpModifyClient, Username: user, ClientID: want.ClientID,
					Roles: sortedRefs(want.Roles), Groups: sortedStrings(want.Groups)})
			}
			continue
		}
		if clientEqual(have, want) {
			continue
		}
		cmds = append(cmds, Command{Op: OpModifyClient, Username: user, ClientID: want.ClientID,
			Roles: sortedRefs(want.Roles), Groups: sortedStrings(want.Groups)})
	}

	for _, r := range delRoles {
		cmds = append(cmds, Command{Op: OpDeleteRole, Role: r})
	}
	return cmds
}

// groupRefChanges returns the removeGroupRole/addGroupRole commands that turn
// a group's role references have into want (a changed priority is a remove
// and an add), removals first, each in dynsec order. It costs one map of the
// observed references and a sort of only what changed: shared groups hold
// thousands of references of which one Apply changes one.
func groupRefChanges(group string, have, want []RoleRef) []Command {
	remaining := make(map[string]int, len(have))
	for _, r := range have {
		remaining[r.Name] = r.Priority
	}
	var adds, removes []RoleRef
	for _, r := range want {
		p, had := remaining[r.Name]
		if had {
			delete(remaining, r.Name)
			if p == r.Priority {
				continue
			}
			removes = append(removes, RoleRef{Name: r.Name, Priority: p})
		}
		adds = append(adds, r)
	}
	for name, p := range remaining {
		removes = append(removes, RoleRef{Name: name, Priority: p})
	}
	var cmds []Command
	for _, r := range sortedRefs(removes) {
		cmds = append(cmds, Command{Op: OpRemoveGroupRole, Group: group, Role: r.Name})
	}
	for _, r := range sortedRefs(adds) {
		cmds = append(cmds, Command{Op: OpAddGroupRole, Group: group, Role: r.Name, Priority: r.Priority})
	}
	return cmds
}

// deletions lists the observed objects that go away: explicit ones and, with
// Prune, everything not desired. Desired names are never deleted.
func deletions(observed State, d Desired) (roles, groups, clients []string) {
	pick := func(explicit []string, obs, desired map[string]struct{}) []string {
		set := map[string]struct{}{}
		for _, n := range explicit {
			set[n] = struct{}{}
		}
		if d.Prune {
			for n := range obs {
				set[n] = struct{}{}
			}
		}
		var out []string
		for n := range set {
			if _, want := desired[n]; want {
				continue
			}
			if _, present := obs[n]; !present {
				continue // absent already: nothing to send
			}
			out = append(out, n)
		}
		sort.Strings(out)
		return out
	}
	return pick(d.Delete.Roles, keySet(observed.Roles), keySet(d.Roles)),
		pick(d.Delete.Groups, keySet(observed.Groups), keySet(d.Groups)),
		pick(d.Delete.Clients, keySet(observed.Clients), keySet(d.Clients))
}

func keySet[V any](m map[string]V) map[string]struct{} {
	out := make(map[string]struct{}, len(m))
	for k := range m {
		out[k] = struct{}{}
	}
	return out
}

// revocationKick returns a command that makes Mosquitto disconnect the
// role's clients when newACLs no longer grant a subscription that oldACLs
// granted (an allow rule went away or changed, or a deny rule appeared).
// modifyRole itself never disconnects, and existing subscriptions are only
// re-checked when a client reconnects, so without this a revoked
// subscription would keep delivering. The command is harmless for the
// state: modifyRole right after it sets the full list anyway.
func revocationKick(role string, oldACLs, newACLs []ACL) (Command, bool) {
	for _, a := range oldACLs {
		if a.Type.isSubscribe() && a.Allow && !slices.Contains(newACLs, a) {
			return Command{Op: OpRemoveRoleACL, Role: role, ACL: a}, true
		}
	}
	for _, a := range newACLs {
		if a.Type.isSubscribe() && !a.Allow && !slices.Contains(oldACLs, a) {
			// Adding the exact rule modifyRole will keep; the topic is new
			// for this type or dynsec would refuse it, so remove first.
			if old, ok := findACL(oldACLs, a.Type, a.Topic); ok {
				return Command{Op: OpRemoveRoleACL, Role: role, ACL: old}, true
			}
			return Command{Op: OpAddRoleACL, Role: role, ACL: a}, true
		}
	}
	return Command{}, false
}

func findACL(acls []ACL, t ACLType, topic string) (ACL, bool) {
	for _, a := range acls {
		if a.Type == t && a.Topic == topic {
			return a, true
		}
	}
	return ACL{}, false
}

func clientEqual(a, b Client) bool {
	if a.ClientID != b.ClientID {
		return false
	}
	if !slices.Equal(sortedStrings(a.Groups), sortedStrings(b.Groups)) {
		return false
	}
	return slices.Equal(sortedRefs(a.Roles), sortedRefs(b.Roles))
}

func sortedStrings(in []string) []string {
	out := append([]string(nil), in...)
	sort.Strings(out)
	return out
}

// Summary counts commands by op, e.g. "create role=2 modify client=1", for
// logs and benchmarks.
func Summary(cmds []Command) string {
	counts := map[Op]int{}
	for _, c := range cmds {
		counts[c.Op]++
	}
	ops := make([]string, 0, len(counts))
	for op := range counts {
		ops = append(ops, string(op))
	}
	sort.Strings(ops)
	var b strings.Builder
	for i, op := range ops {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", op, counts[Op(op)])
	}
	return b.String()
}
