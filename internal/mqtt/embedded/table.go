package embedded

import (
	"context"
	"errors"
	"fmt"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/presence"
)

// This file is the store's surface for a host other than the embedded mochi broker: the
// project's Mosquitto plugin (internal/mqtt/mosqtable) runs a Store inside Mosquitto, so the
// shipped broker decides with the very same code, and the operator keeps a mirror Store of
// what the plugin holds. Both move the whole table in one piece (Table) and need each
// command's own verdict (Outcome).

// TableVersion is the version of the Table format (the snapshot file's too).
const TableVersion = 1

// Credential is one password as a Table carries it: its PBKDF2 hash and salt.
type Credential = credential

// Table is a store's whole content in a portable form: every object and every password as
// its PBKDF2 hash (never a plaintext). It is the snapshot file's format.
type Table struct {
	Version int       `json:"version"`
	State   acl.State `json:"state"`
	// Credentials by username. The element type is the store's own: a Table is made by
	// ExportTable and read by ImportTable, and travels as JSON in between.
	Credentials map[string]*credential `json:"credentials"`
	// Unhashed are the clients whose password was set while ExportTable ran, left out of
	// Credentials (not transferred: export again to get them).
	Unhashed []string `json:"-"`
}

// Outcome is one command's result: its verdict, the broker's words for it (dynsec's texts,
// "" when applied) and whom it disconnected.
type Outcome struct {
	Verdict acl.Verdict `json:"verdict"`
	Message string      `json:"message,omitempty"`
	// Kicked are the usernames whose live connections the command ended, and ClientIDs
	// those connections (when the host can tell).
	Kicked    []string `json:"kicked,omitempty"`
	ClientIDs []string `json:"clientIds,omitempty"`
}

// Connections is a host broker's view of its live connections, for kicks: the host calls
// AttachConnections once, before the store is used.
type Connections interface {
	// Count is the number of connected usernames (an upper bound is fine).
	Count() int
	// Connected reports whether user may have a live connection (false only when it has none).
	Connected(user string) bool
	// Each calls fn for every connected username (fn must not call back).
	Each(fn func(user string))
	// Kick ends every connection of users without their Wills and returns the client IDs it
	// closed by username (a username with unknown client IDs maps to an empty list).
	Kick(users []string) map[string][]string
}

// AttachConnections makes the store kick through c (see Connections).
func (s *Store) AttachConnections(c Connections) { s.setConnections(hostConnections{c}) }

type hostConnections struct{ c Connections }

func (h hostConnections) count() int                                                    { return h.c.Count() }
func (h hostConnections) connected(user string) bool                                    { return h.c.Connected(user) }
func (h hostConnections) each(fn func(string))                                          { h.c.Each(fn) }
func (h hostConnections) kick(users []string) map[string][]string                       { return h.c.Kick(users) }
func (hostConnections) watchPresence(func(presence.Observation)) []presence.Observation { return nil }

// Authenticate is the CONNECT decision (see authenticate): the admin, or a known user with
// the configured client ID (when set) and its password.
func (s *Store) Authenticate(username, password, clientID string) bool {
	return s.authenticate(username, password, clientID)
}

// Allows is the per-message decision (dynsec semantics, the admin may do anything). It does
// not allocate.
func (s *Store) Allows(username string, access acl.Access, topic string) bool {
	return s.allows(username, access, topic)
}

// IsAdmin reports whether username is the store's configured admin.
func (s *Store) IsAdmin(username string) bool { return s.isAdmin(username) }

// ExecuteEach is Execute returning each command's Outcome (in order) instead of an error.
func (s *Store) ExecuteEach(ctx context.Context, cmds []acl.Command) ([]Outcome, error) {
	return s.execute(ctx, cmds)
}

// Errors turns outcomes into Execute's error: every failed verdict as an *acl.CommandError.
func Errors(cmds []acl.Command, outs []Outcome) error {
	var errs []error
	for i, o := range outs {
		if o.Verdict.Failed() {
			errs = append(errs, &acl.CommandError{Command: cmds[i], Verdict: o.Verdict, Message: o.Message})
		}
	}
	return errors.Join(errs...)
}

// ExportTable copies the store's content (only the named objects when only is set; the
// default access always). Passwords not hashed yet are hashed first (PBKDF2, slow): a store
// meant to be exported hashes in the background (StoreConfig.KeepHashes), so little is left.
// A password set while the export runs is left out and named in Unhashed.
func (s *Store) ExportTable(only *acl.Names) (Table, error) {
	if s.snap != nil {
		if err := s.hashPending(); err != nil {
			return Table{}, err
		}
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	t := Table{Version: TableVersion, State: acl.NewState(nil, nil, nil), Credentials: map[string]*credential{}}
	d := *s.state.DefaultACL
	t.State.DefaultACL = &d
	copyCred := func(u string) error {
		c, ok := s.creds[u]
		if !ok {
			return nil
		}
		if c.pending != "" {
			t.Unhashed = append(t.Unhashed, u)
			return nil
		}
		t.Credentials[u] = &credential{Salt: c.Salt, Iterations: c.Iterations, Hash: c.Hash}
		return nil
	}
	if only == nil {
		for k, v := range s.state.Roles {
			t.State.Roles[k] = v
		}
		for k, v := range s.state.Groups {
			t.State.Groups[k] = v
		}
		for k, v := range s.state.Clients {
			t.State.Clients[k] = v
			if err := copyCred(k); err != nil {
				return Table{}, err
			}
		}
		t.State = t.State.Clone()
		return t, nil
	}
	for _, k := range only.Roles {
		if v, ok := s.state.Roles[k]; ok {
			t.State.Roles[k] = v
		}
	}
	for _, k := range only.Groups {
		if v, ok := s.state.Groups[k]; ok {
			t.State.Groups[k] = v
		}
	}
	for _, k := range only.Clients {
		if v, ok := s.state.Clients[k]; ok {
			t.State.Clients[k] = v
			if err := copyCred(k); err != nil {
				return Table{}, err
			}
		}
	}
	t.State = t.State.Clone()
	return t, nil
}

// ImportTable replaces the store's whole content with t (one step: a check sees the old
// table or the new one). Nobody is kicked: a host imports into a store that serves no one yet.
func (s *Store) ImportTable(t Table) error {
	if t.Version != TableVersion {
		return fmt.Errorf("embedded: import: unknown table version %d", t.Version)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := acl.Names{Roles: keys(s.state.Roles), Groups: keys(s.state.Groups), Clients: keys(s.state.Clients)}
	s.state = acl.NewState(nil, nil, nil)
	d := acl.DenyByDefault
	s.state.DefaultACL = &d
	s.creds = map[string]*credential{}
	s.members, s.direct, s.roleGroups = map[string]map[string]struct{}{}, map[string]map[string]struct{}{}, map[string]map[string]struct{}{}
	s.roleKeys = map[string]map[ruleKey]struct{}{}
	creds := make(map[string]*credential, len(t.Credentials))
	for u, c := range t.Credentials {
		if c != nil {
			creds[u] = &credential{Salt: c.Salt, Iterations: c.Iterations, Hash: c.Hash}
		}
	}
	s.restore(&snapshot{Version: t.Version, State: t.State, Credentials: creds})
	all := acl.Names{
		Roles:   append(old.Roles, keys(s.state.Roles)...),
		Groups:  append(old.Groups, keys(s.state.Groups)...),
		Clients: append(old.Clients, keys(s.state.Clients)...),
	}
	s.policy.Sync(s.state, all)
	if s.snap != nil {
		_ = s.snap.changed()
	}
	return nil
}

// RoleLen is the number of rules of role name, and whether it exists.
func (s *Store) RoleLen(name string) (int, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.state.Roles[name]
	return len(r.ACLs), ok
}

// RoleEditSince returns role name's list as an edit of had (the rules it keeps at both ends of
// had, and a copy of the ones between), when the edit holds at most half of the list: a writer
// that keeps the list it wrote learns what changed by a comparison, without a copy of the role.
// False when the role does not exist or the edit is larger.
func (s *Store) RoleEditSince(name string, had []acl.ACL) (acl.RoleSplice, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.state.Roles[name]
	if !ok {
		return acl.RoleSplice{}, false
	}
	return acl.SpliceOf(had, r.ACLs)
}

// RoleEditTo returns want as an edit of role name's current list, when the edit holds at most
// half of want: a sender learns what a whole list changes in the role it mirrors without a copy
// of the role (an org's is thousands of rules at 10 000 Agents). False when the role does not
// exist or the edit is larger.
func (s *Store) RoleEditTo(name string, want []acl.ACL) (acl.RoleSplice, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.state.Roles[name]
	if !ok {
		return acl.RoleSplice{}, false
	}
	return acl.SpliceOf(r.ACLs, want)
}

// Size is the number of clients, roles and groups the store holds.
func (s *Store) Size() (clients, roles, groups int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.state.Clients), len(s.state.Roles), len(s.state.Groups)
}
