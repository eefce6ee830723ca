// Package embedded is the local-run acl.Backend: an in-process mochi-mqtt v2
// broker whose authentication and ACL hook enforces the same model with the
// same decisions as Mosquitto's dynamic-security plugin (acl.Policy), and a
// Store that executes the same dynsec commands in memory with the plugin's
// replies and disconnect ("kick") behaviour.
//
// Limits: one process, state in memory, optionally persisted to a JSON
// snapshot file (password hashes only, never plaintext) that a background
// writer keeps up to date; no $CONTROL API (manage it through the Store);
// UNSUBSCRIBE is never refused (mochi has no hook for it; dynsec's default
// allows it too). docs/broker.md lists the remaining differences.
package embedded

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/presence"
)

// DefaultIterations is the PBKDF2-SHA512 work factor of the password hashes
// written to the snapshot: ten times dynsec 2.0's 101. Hashing runs once per
// credential change, in the snapshot writer, never while a command or a
// CONNECT waits (see credential).
const DefaultIterations = 1000

// StoreConfig configures NewStore.
type StoreConfig struct {
	// Prefix of the managed names (default acl.DefaultPrefix).
	Prefix string
	// AdminUsername/AdminPassword: a user that may connect and do anything
	// (all ACL checks pass), like a superuser. Empty disables it.
	AdminUsername string
	AdminPassword string
	// SnapshotPath, when set, is loaded at start (if it exists) and kept up
	// to date by a background writer after every change (Flush and Close
	// wait for it).
	SnapshotPath string
	// Iterations for the snapshot's password hashes (default
	// DefaultIterations).
	Iterations int
	// OnKick, when set, is called for every executed command that
	// disconnected at least one live client (after it ran; must not block).
	OnKick func(acl.Kick)
	// KeepHashes computes every password's PBKDF2 hash in the background
	// even without a snapshot file, so ExportTable has them at once (a
	// store whose table is exported: the Mosquitto plugin's, the operator's
	// mirror of it).
	KeepHashes bool
	// OnChange, when set, is called after every Execute with the names it
	// touched (outside the store's lock; must not block): incremental
	// persistence.
	OnChange func(acl.Names)
}

// Store holds the broker's identities and implements acl.Backend.
type Store struct {
	cfg   StoreConfig
	key   verifierKey
	admin *credential

	mu    sync.RWMutex // guards everything below; Execute holds it for writing
	state acl.State    // all objects (any names); Observe filters by prefix
	creds map[string]*credential
	// unhashed lists the credentials installed with a plaintext still to hash (hashPending),
	// so a round hashes what changed instead of scanning every client's credential.
	unhashed []unhashedCredential
	// Reverse indexes, so a kick or a role deletion touches only the
	// clients concerned instead of scanning the fleet.
	members    map[string]map[string]struct{} // group → member usernames
	direct     map[string]map[string]struct{} // role → usernames holding it directly
	roleGroups map[string]map[string]struct{} // role → groups holding it
	// roleKeys is, per role edited by a splice (built at its first), the
	// type and topic of each of its rules: an edit is validated against it
	// instead of the whole list. Any other change of the role drops it.
	roleKeys map[string]map[ruleKey]struct{}

	policy *acl.Policy // incremental: Execute syncs only what it touched

	conns                   atomic.Pointer[connections]
	mutations, reads, trips atomic.Uint64
	kicks, kickedUsernames  atomic.Uint64

	snap *snapshotWriter // nil without SnapshotPath
	// hashing serialises hashPending: the snapshot writer and an export (the plugin's disk
	// writer) run it at once after every change, and each would otherwise hash the same
	// passwords (PBKDF2, the largest part of a change's cost).
	hashing sync.Mutex
	hashes  atomic.Uint64 // PBKDF2 forms computed (tests: each password is hashed once)
}

// NewStore creates a store, loading the snapshot file when configured.
func NewStore(cfg StoreConfig) (*Store, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = acl.DefaultPrefix
	}
	if cfg.Iterations <= 0 {
		cfg.Iterations = DefaultIterations
	}
	key, err := newVerifierKey()
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	s := &Store{
		cfg: cfg, key: key, state: acl.NewState(nil, nil, nil), creds: map[string]*credential{},
		members: map[string]map[string]struct{}{}, direct: map[string]map[string]struct{}{}, roleGroups: map[string]map[string]struct{}{},
		roleKeys: map[string]map[ruleKey]struct{}{}, policy: acl.NewPolicy(),
	}
	d := acl.DenyByDefault
	s.state.DefaultACL = &d
	if cfg.AdminUsername != "" {
		if cfg.AdminPassword == "" {
			return nil, errors.New("embedded: admin user needs a password")
		}
		if s.admin, err = newCredential(&s.key, cfg.AdminPassword, false); err != nil {
			return nil, fmt.Errorf("embedded: admin: %w", err)
		}
	}
	if cfg.SnapshotPath != "" {
		snap, err := loadSnapshot(cfg.SnapshotPath)
		if err != nil {
			return nil, err
		}
		if snap != nil {
			s.restore(snap)
		}
	}
	if cfg.SnapshotPath != "" || cfg.KeepHashes {
		s.snap = startSnapshotWriter(s)
	}
	s.policy.Sync(s.state, acl.Names{Roles: keys(s.state.Roles), Groups: keys(s.state.Groups), Clients: keys(s.state.Clients)})
	return s, nil
}

// restore installs a loaded snapshot (before the store is shared).
func (s *Store) restore(snap *snapshot) {
	for _, r := range snap.State.Roles {
		s.state.Roles[r.Name] = acl.Role{Name: r.Name, ACLs: acl.Canonical(r.ACLs)}
	}
	for _, g := range snap.State.Groups {
		s.state.Groups[g.Name] = acl.Group{Name: g.Name}
		s.setGroupRoles(g.Name, g.Roles)
	}
	for _, c := range snap.State.Clients {
		s.putClient(c)
	}
	if snap.State.DefaultACL != nil {
		d := *snap.State.DefaultACL
		s.state.DefaultACL = &d
	}
	for u, c := range snap.Credentials {
		s.creds[u] = c
	}
}

// Close stops the snapshot writer after a last write (a no-op without a
// snapshot). The store keeps answering; further changes are not persisted.
func (s *Store) Close() error {
	if s.snap == nil {
		return nil
	}
	return s.snap.close()
}

// Flush waits until the snapshot holds every change made so far.
func (s *Store) Flush() error {
	if s.snap == nil {
		return nil
	}
	return s.snap.flush()
}

// connections is the broker's view of who is connected (the hook), so a kick
// only looks at live connections.
type connections interface {
	// count is the number of connected usernames.
	count() int
	// connected reports whether user has a live connection.
	connected(user string) bool
	// each calls fn for every connected username (fn must not call back).
	each(fn func(user string))
	// kick disconnects every connection of users and returns the client IDs
	// it closed, by username.
	kick(users []string) map[string][]string
	// watchPresence sends every connect, disconnect and refused CONNECT to fn from now on and
	// returns the connections established now.
	watchPresence(fn func(presence.Observation)) []presence.Observation
}

// WatchPresence implements presence.Source: the broker's own view of its clients, from its
// hooks. fn is called on the broker's goroutines and must not block. Without an attached server
// it reports nothing.
func (s *Store) WatchPresence(fn func(presence.Observation)) []presence.Observation {
	if conns := s.conns.Load(); conns != nil {
		return (*conns).watchPresence(fn)
	}
	return nil
}

func (s *Store) setConnections(c connections) { s.conns.Store(&c) }

// kickSet is whom one command disconnects: one client, or the members of
// username sets captured when the command ran (a group's members, a role's
// holders: the maps of the store's indexes, read under the store's lock).
type kickSet struct {
	user string
	sets []map[string]struct{}
}

func userKick(u string) kickSet { return kickSet{user: u} }

func (k kickSet) empty() bool { return k.user == "" && len(k.sets) == 0 }

func (k kickSet) size() int {
	n := 0
	for _, m := range k.sets {
		n += len(m)
	}
	return n
}

func (k kickSet) has(u string) bool {
	for _, m := range k.sets {
		if _, ok := m[u]; ok {
			return true
		}
	}
	return false
}

// live resolves k against the live connections, walking whichever side is
// smaller: a change to a group of thousands of idle agents costs the number
// of connected clients, and the other way round.
func (k kickSet) live(c connections) []string {
	if k.user != "" {
		if c.connected(k.user) {
			return []string{k.user}
		}
		return nil
	}
	seen := map[string]struct{}{}
	if k.size() <= c.count() {
		for _, m := range k.sets {
			for u := range m {
				if c.connected(u) {
					seen[u] = struct{}{}
				}
			}
		}
	} else {
		c.each(func(u string) {
			if k.has(u) {
				seen[u] = struct{}{}
			}
		})
	}
	return keys(seen)
}

// Prefix implements acl.Backend.
func (s *Store) Prefix() string { return s.cfg.Prefix }

// Stats implements acl.Backend.
func (s *Store) Stats() acl.Stats {
	return acl.Stats{Mutations: s.mutations.Load(), Reads: s.reads.Load(), RoundTrips: s.trips.Load(),
		Kicks: s.kicks.Load(), KickedUsernames: s.kickedUsernames.Load()}
}

// Observe implements acl.Backend.
func (s *Store) Observe(ctx context.Context, only *acl.Names) (acl.State, error) {
	if err := ctx.Err(); err != nil {
		return acl.State{}, fmt.Errorf("embedded: observe: %w", err)
	}
	s.trips.Add(1)
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := acl.NewState(nil, nil, nil)
	d := *s.state.DefaultACL
	out.DefaultACL = &d
	owned := func(n string) bool { return strings.HasPrefix(n, s.cfg.Prefix) }
	if only == nil {
		s.reads.Add(4)
		for k, v := range s.state.Roles {
			if owned(k) {
				out.Roles[k] = v
			}
		}
		for k, v := range s.state.Groups {
			if owned(k) {
				out.Groups[k] = v
			}
		}
		for k, v := range s.state.Clients {
			if owned(k) {
				out.Clients[k] = v
			}
		}
		return out.Clone(), nil
	}
	s.reads.Add(uint64(len(only.Roles) + len(only.Groups) + len(only.Clients) + 1))
	for _, k := range only.Roles {
		if v, ok := s.state.Roles[k]; ok && owned(k) {
			out.Roles[k] = v
		}
	}
	for _, k := range only.Groups {
		if v, ok := s.state.Groups[k]; ok && owned(k) {
			out.Groups[k] = v
		}
	}
	for _, k := range only.Clients {
		if v, ok := s.state.Clients[k]; ok && owned(k) {
			out.Clients[k] = v
		}
	}
	return out.Clone(), nil
}

// Check implements acl.Backend with the same policy the hook enforces.
func (s *Store) Check(ctx context.Context, username string, access acl.Access, topic string) (acl.Decision, error) {
	if err := ctx.Err(); err != nil {
		return acl.Decision{}, fmt.Errorf("embedded: check: %w", err)
	}
	if s.isAdmin(username) {
		return acl.Decision{Allow: true, Reason: "admin user"}, nil
	}
	return s.policy.Check(username, access, topic), nil
}

func (s *Store) isAdmin(username string) bool {
	return s.admin != nil && username == s.cfg.AdminUsername
}

// allows is the hook's decision: the admin may do anything, everyone else
// gets dynsec's answer. No allocation: it runs for every message.
func (s *Store) allows(username string, access acl.Access, topic string) bool {
	return s.isAdmin(username) || s.policy.Allows(username, access, topic)
}

// authenticate mirrors dynsec's basic auth: known user, client ID equal to
// the configured one when set, password match (the in-memory digest; a
// credential loaded from the snapshot is verified with PBKDF2 once and then
// cached, see credential).
func (s *Store) authenticate(username, password, clientID string) bool {
	var cred *credential
	if s.isAdmin(username) {
		cred = s.admin
	} else {
		s.mu.RLock()
		c, ok := s.state.Clients[username]
		cred = s.creds[username]
		s.mu.RUnlock()
		if !ok || cred == nil || (c.ClientID != "" && c.ClientID != clientID) {
			return false
		}
	}
	s.mu.RLock()
	ok, known := cred.quickMatch(&s.key, password)
	s.mu.RUnlock()
	if known {
		return ok
	}
	if !cred.slowMatch(password) {
		return false
	}
	s.mu.Lock()
	if cred.digest == nil {
		cred.digest = s.key.digest(cred.Salt, password)
	}
	s.mu.Unlock()
	return true
}

// Execute implements acl.Backend: each command has the effect, the reply
// text and the disconnects of its Mosquitto 2.0.11 dynsec counterpart.
// Only the objects the commands touch are recompiled.
func (s *Store) Execute(ctx context.Context, cmds []acl.Command) error {
	outs, err := s.execute(ctx, cmds)
	if err != nil {
		return err
	}
	return Errors(cmds, outs)
}

// execute runs cmds and returns each one's outcome; the error is the context's or the
// snapshot writer's (a command the store refuses is an outcome, not an error).
func (s *Store) execute(ctx context.Context, cmds []acl.Command) ([]Outcome, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("embedded: execute: %w", err)
	}
	s.trips.Add(1)
	s.mutations.Add(uint64(len(cmds)))
	// Credentials are cheap (see credential): made here, outside the lock.
	creds := map[int]*credential{}
	for i, c := range cmds {
		if (c.Op == acl.OpCreateClient || c.Op == acl.OpSetClientPassword || c.Op == acl.OpModifyClient) && c.Password != "" {
			cr, err := newCredential(&s.key, c.Password, s.snap != nil)
			if err != nil {
				return nil, fmt.Errorf("embedded: %s: %w", c, err)
			}
			cr.withHash(&s.key, c.Password, c.PasswordHash, s.cfg.Iterations)
			creds[i] = cr
		}
	}

	s.mu.Lock()
	touched := &touchSet{}
	kicks := make([]kickSet, len(cmds))
	outs := make([]Outcome, len(cmds))
	for i, c := range cmds {
		r := s.apply(c, creds[i], touched)
		kicks[i] = r.kick
		outs[i] = Outcome{Verdict: r.verdict, Message: r.msg}
	}
	for i, cr := range creds {
		if cr.pending != "" && s.creds[cmds[i].Username] == cr {
			s.unhashed = append(s.unhashed, unhashedCredential{cmds[i].Username, cr})
		}
	}
	names := touched.names()
	s.syncPolicy(touched)
	var targets [][]string
	if conns := s.conns.Load(); conns != nil {
		targets = make([][]string, len(cmds))
		for i, k := range kicks {
			if !k.empty() {
				targets[i] = k.live(*conns)
			}
		}
	}
	s.mu.Unlock()
	var err error
	if s.snap != nil {
		err = s.snap.changed()
	}
	if s.cfg.OnChange != nil {
		s.cfg.OnChange(names)
	}
	s.disconnect(ctx, cmds, targets, outs)
	return outs, err
}

// disconnect ends the sessions of every username a command kicked and
// reports each command's kicks.
func (s *Store) disconnect(ctx context.Context, cmds []acl.Command, targets [][]string, outs []Outcome) {
	all := map[string]struct{}{}
	for _, t := range targets {
		for _, u := range t {
			all[u] = struct{}{}
		}
	}
	if len(all) == 0 {
		return
	}
	var closed map[string][]string
	if conns := s.conns.Load(); conns != nil {
		closed = (*conns).kick(keys(all))
	}
	for i, t := range targets {
		k := acl.Kick{Command: cmds[i]}
		for _, u := range t {
			if ids := closed[u]; len(ids) > 0 {
				k.Usernames = append(k.Usernames, u)
				k.ClientIDs = append(k.ClientIDs, ids...)
			}
		}
		if len(k.Usernames) == 0 {
			continue
		}
		k.Command.Password, k.Command.PasswordHash = "", nil
		outs[i].Kicked, outs[i].ClientIDs = k.Usernames, k.ClientIDs
		s.kicks.Add(1)
		s.kickedUsernames.Add(uint64(len(k.Usernames)))
		acl.ReportKick(ctx, k)
		if s.cfg.OnKick != nil {
			s.cfg.OnKick(k)
		}
	}
}

// touchSet collects the names a batch changed, for the policy sync, and the
// roles changed only by splices, with their splices in order (the policy
// applies those in place).
type touchSet struct {
	roles, groups, clients map[string]struct{}
	splices                map[string][]acl.RoleSplice
}

func (t *touchSet) splice(n string, sp acl.RoleSplice) {
	if t.splices == nil {
		t.splices = map[string][]acl.RoleSplice{}
	}
	t.splices[n] = append(t.splices[n], sp)
}

func (t *touchSet) role(n string)   { t.roles = add(t.roles, n) }
func (t *touchSet) group(n string)  { t.groups = add(t.groups, n) }
func (t *touchSet) client(n string) { t.clients = add(t.clients, n) }

func add(m map[string]struct{}, n string) map[string]struct{} {
	if m == nil {
		m = map[string]struct{}{}
	}
	m[n] = struct{}{}
	return m
}

// names are every object the batch changed, spliced roles included.
func (t *touchSet) names() acl.Names {
	roles := t.roles
	if len(t.splices) > 0 {
		roles = maps.Clone(t.roles)
		for n := range t.splices {
			roles = add(roles, n)
		}
	}
	return acl.Names{Roles: keys(roles), Groups: keys(t.groups), Clients: keys(t.clients)}
}

// syncPolicy brings the policy up to date with the batch: the roles only
// spliced are edited in place (compiled whole when the policy cannot), the
// rest compiled from the state.
func (s *Store) syncPolicy(t *touchSet) {
	s.policy.Sync(s.state, acl.Names{Roles: keys(t.roles), Groups: keys(t.groups), Clients: keys(t.clients)})
	for _, n := range keys(t.splices) {
		if _, whole := t.roles[n]; whole {
			continue // compiled above from its final list
		}
		for _, sp := range t.splices[n] {
			if !s.policy.SpliceRole(n, sp) {
				s.policy.Sync(s.state, acl.Names{Roles: []string{n}})
				break
			}
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// holders are the usernames that hold role directly or through a group.
func (s *Store) holders(role string) kickSet {
	k := kickSet{sets: []map[string]struct{}{s.direct[role]}}
	for g := range s.roleGroups[role] {
		k.sets = append(k.sets, s.members[g])
	}
	return k
}

// memberSet are the usernames of a group's members.
func (s *Store) memberSet(group string) kickSet {
	return kickSet{sets: []map[string]struct{}{s.members[group]}}
}

func link(idx map[string]map[string]struct{}, key, val string) {
	m := idx[key]
	if m == nil {
		m = map[string]struct{}{}
		idx[key] = m
	}
	m[val] = struct{}{}
}

func unlink(idx map[string]map[string]struct{}, key, val string) {
	if m := idx[key]; m != nil {
		delete(m, val)
		if len(m) == 0 {
			delete(idx, key)
		}
	}
}

// refCmp is dynsec's order of role references (priority desc, name asc);
// lists are kept in it, as the plugin does.
func refCmp(a, b acl.RoleRef) int {
	if a.Priority != b.Priority {
		return cmp.Compare(b.Priority, a.Priority)
	}
	return strings.Compare(a.Name, b.Name)
}

func sortedRoleRefs(refs []acl.RoleRef) []acl.RoleRef {
	out := slices.Clone(refs)
	slices.SortFunc(out, refCmp)
	return slices.CompactFunc(out, func(a, b acl.RoleRef) bool { return a.Name == b.Name })
}

// putClient stores c (roles sorted, groups sorted) and updates the indexes.
func (s *Store) putClient(c acl.Client) {
	s.dropClientLinks(c.Username)
	c.Roles = sortedRoleRefs(c.Roles)
	c.Groups = slices.Compact(slices.Sorted(slices.Values(c.Groups)))
	for _, r := range c.Roles {
		link(s.direct, r.Name, c.Username)
	}
	for _, g := range c.Groups {
		link(s.members, g, c.Username)
	}
	s.state.Clients[c.Username] = c
}

func (s *Store) dropClientLinks(user string) {
	old, ok := s.state.Clients[user]
	if !ok {
		return
	}
	for _, r := range old.Roles {
		unlink(s.direct, r.Name, user)
	}
	for _, g := range old.Groups {
		unlink(s.members, g, user)
	}
}

// setGroupRoles replaces a group's role list (sorted) and the indexes.
func (s *Store) setGroupRoles(group string, refs []acl.RoleRef) {
	g := s.state.Groups[group]
	for _, r := range g.Roles {
		unlink(s.roleGroups, r.Name, group)
	}
	g.Roles = sortedRoleRefs(refs)
	for _, r := range g.Roles {
		link(s.roleGroups, r.Name, group)
	}
	s.state.Groups[group] = g
}

// reply is the embedded backend's verdict on one command, in the broker model's terms, with
// the text Mosquitto 2.0.11's dynsec answers in the same case (so that errors read the same on
// both brokers) and whom the command disconnects.
type reply struct {
	verdict acl.Verdict
	msg     string
	kick    kickSet
}

func done(k kickSet) reply                { return reply{verdict: acl.Applied, kick: k} }
func already(msg string, k kickSet) reply { return reply{verdict: acl.AlreadyDone, msg: msg, kick: k} }
func refused(msg string, k kickSet) reply { return reply{verdict: acl.Refused, msg: msg, kick: k} }

// handler runs one command (with mu held), as its dynsec counterpart does.
type handler func(s *Store, c acl.Command, cred *credential, t *touchSet) reply

// handlers are the store's commands. Most change one existing object through edit (the lookup,
// refusal, copy and store shape once); creations, deletions (which cascade through the indexes)
// and the commands whose checks come in another order are written out.
var handlers = map[acl.Op]handler{
	acl.OpSetDefaultACLAccess: (*Store).applySetDefaultACLAccess,
	acl.OpCreateRole:          (*Store).applyCreateRole,
	acl.OpModifyRole: edit(roles, editOptions{missing: "Role does not exist", noKick: true}, func(s *Store, c acl.Command, r *acl.Role) *reply {
		list := c.ACLs
		if c.Splice != nil && c.ACLs == nil {
			if !c.Splice.Fits(len(r.ACLs)) {
				return refusal("Role edit made for another list")
			}
			list = c.Splice.Apply(r.ACLs) // an edit that reorders the list: run as the whole list
		}
		nr := acl.Role{Name: c.Role, ACLs: acl.Canonical(list)}
		if err := nr.Validate(); err != nil {
			return refusal("Invalid ACL topic")
		}
		r.ACLs = nr.ACLs // like dynsec: no disconnects
		return nil
	}),
	acl.OpDeleteRole: (*Store).applyDeleteRole,
	acl.OpAddRoleACL: edit(roles, editOptions{}, func(s *Store, c acl.Command, r *acl.Role) *reply {
		if !c.ACL.Type.Valid() {
			return refusal("Unknown acltype")
		}
		if acl.ValidateFilter(c.ACL.Topic) != nil {
			return refusal("Invalid ACL topic")
		}
		if slices.ContainsFunc(r.ACLs, func(a acl.ACL) bool { return a.Type == c.ACL.Type && a.Topic == c.ACL.Topic }) {
			return alreadyDone("ACL with this topic already exists")
		}
		r.ACLs = acl.Canonical(append(slices.Clone(r.ACLs), c.ACL))
		return nil
	}),
	acl.OpRemoveRoleACL: edit(roles, editOptions{}, func(s *Store, c acl.Command, r *acl.Role) *reply {
		i := slices.IndexFunc(r.ACLs, func(a acl.ACL) bool { return a.Type == c.ACL.Type && a.Topic == c.ACL.Topic })
		if i < 0 {
			return alreadyDone("ACL not found")
		}
		r.ACLs = slices.Delete(slices.Clone(r.ACLs), i, i+1)
		return nil
	}),
	acl.OpCreateGroup: (*Store).applyCreateGroup,
	acl.OpDeleteGroup: (*Store).applyDeleteGroup,
	acl.OpAddGroupRole: edit(groups, editOptions{needs: roleNamed}, func(s *Store, c acl.Command, g *acl.Group) *reply {
		if slices.ContainsFunc(g.Roles, func(r acl.RoleRef) bool { return r.Name == c.Role }) {
			return alreadyDone("Group is already in this role")
		}
		ref := acl.RoleRef{Name: c.Role, Priority: c.Priority}
		at, _ := slices.BinarySearchFunc(g.Roles, ref, refCmp)
		g.Roles = slices.Insert(slices.Clone(g.Roles), at, ref)
		link(s.roleGroups, c.Role, c.Group)
		return nil
	}),
	acl.OpRemoveGroupRole: edit(groups, editOptions{needs: roleNamed}, func(s *Store, c acl.Command, g *acl.Group) *reply {
		g.Roles = slices.DeleteFunc(slices.Clone(g.Roles), func(r acl.RoleRef) bool { return r.Name == c.Role })
		unlink(s.roleGroups, c.Role, c.Group)
		return nil
	}),
	acl.OpCreateClient:      (*Store).applyCreateClient,
	acl.OpModifyClient:      (*Store).applyModifyClient,
	acl.OpDeleteClient:      (*Store).applyDeleteClient,
	acl.OpSetClientPassword: (*Store).applySetClientPassword,
	acl.OpSetClientID: edit(clients, editOptions{noTouch: true}, func(s *Store, c acl.Command, cl *acl.Client) *reply {
		cl.ClientID = c.ClientID
		return nil
	}),
	acl.OpAddClientRole: edit(clients, editOptions{needs: roleNamed}, func(s *Store, c acl.Command, cl *acl.Client) *reply {
		if slices.ContainsFunc(cl.Roles, func(r acl.RoleRef) bool { return r.Name == c.Role }) {
			return refusal("Internal error") // sic: dynsec 2.0.11's reply for a role the client already has
		}
		cl.Roles = append(slices.Clone(cl.Roles), acl.RoleRef{Name: c.Role, Priority: c.Priority})
		return nil
	}),
	acl.OpRemoveClientRole: edit(clients, editOptions{needs: roleNamed}, func(s *Store, c acl.Command, cl *acl.Client) *reply {
		cl.Roles = slices.DeleteFunc(slices.Clone(cl.Roles), func(r acl.RoleRef) bool { return r.Name == c.Role })
		return nil
	}),
	acl.OpAddGroupClient: edit(clients, editOptions{needs: groupNamed}, func(s *Store, c acl.Command, cl *acl.Client) *reply {
		if slices.Contains(cl.Groups, c.Group) {
			r := already("Client is already in this group", userKick(c.Username))
			return &r
		}
		cl.Groups = append(slices.Clone(cl.Groups), c.Group)
		return nil
	}),
	acl.OpRemoveGroupClient: edit(clients, editOptions{needs: groupNamed}, func(s *Store, c acl.Command, cl *acl.Client) *reply {
		cl.Groups = slices.DeleteFunc(slices.Clone(cl.Groups), func(g string) bool { return g == c.Group })
		return nil
	}),
}

// refusal and alreadyDone are the early replies of an edit, which disconnect nobody.
func refusal(msg string) *reply     { r := refused(msg, kickSet{}); return &r }
func alreadyDone(msg string) *reply { r := already(msg, kickSet{}); return &r }

// kind is how the store reads, writes and indexes one kind of object (role, group, client), for
// edit.
type kind[T any] struct {
	// name is the object a command names; notFound the refusal when it does not exist.
	name     func(acl.Command) string
	notFound string
	get      func(s *Store, name string) (T, bool)
	// put stores the object and updates the store's indexes.
	put   func(s *Store, name string, v T)
	touch func(t *touchSet, name string)
	// affected are the usernames whose sessions a change of the object ends.
	affected func(s *Store, name string) kickSet
}

var (
	roles = kind[acl.Role]{
		name: func(c acl.Command) string { return c.Role }, notFound: "Role not found",
		get:      func(s *Store, n string) (acl.Role, bool) { r, ok := s.state.Roles[n]; return r, ok },
		put:      func(s *Store, n string, r acl.Role) { s.state.Roles[n] = r; delete(s.roleKeys, n) },
		touch:    (*touchSet).role,
		affected: (*Store).holders,
	}
	groups = kind[acl.Group]{
		name: func(c acl.Command) string { return c.Group }, notFound: "Group not found",
		get:      func(s *Store, n string) (acl.Group, bool) { g, ok := s.state.Groups[n]; return g, ok },
		put:      func(s *Store, n string, g acl.Group) { s.state.Groups[n] = g },
		touch:    (*touchSet).group,
		affected: (*Store).memberSet,
	}
	clients = kind[acl.Client]{
		name: func(c acl.Command) string { return c.Username }, notFound: "Client not found",
		get:      func(s *Store, n string) (acl.Client, bool) { cl, ok := s.state.Clients[n]; return cl, ok },
		put:      func(s *Store, _ string, cl acl.Client) { s.putClient(cl) },
		touch:    (*touchSet).client,
		affected: func(_ *Store, n string) kickSet { return userKick(n) },
	}
)

// reference is an object a command refers to besides the one it changes, which must exist.
type reference func(s *Store, c acl.Command) (notFound string, ok bool)

func roleNamed(s *Store, c acl.Command) (string, bool) {
	_, ok := s.state.Roles[c.Role]
	return roles.notFound, ok
}

func groupNamed(s *Store, c acl.Command) (string, bool) {
	_, ok := s.state.Groups[c.Group]
	return groups.notFound, ok
}

// editOptions are how an edit departs from the common shape.
type editOptions struct {
	// missing replaces the kind's refusal for an object that does not exist.
	missing string
	// needs must exist too (checked after the object itself, as dynsec does).
	needs reference
	// noKick: the change disconnects nobody; noTouch: it does not change what the policy compiles.
	noKick, noTouch bool
}

// edit is the shape of a command that changes one existing object: look it up (refused when it
// does not exist), check what it refers to, let change edit a copy (change clones the slices it
// alters; a non-nil reply answers early and stores nothing), store the copy, mark it for the
// policy sync and disconnect whom it affects.
func edit[T any](k kind[T], o editOptions, change func(s *Store, c acl.Command, v *T) *reply) handler {
	missing := cmp.Or(o.missing, k.notFound)
	return func(s *Store, c acl.Command, _ *credential, t *touchSet) reply {
		name := k.name(c)
		v, ok := k.get(s, name)
		if !ok {
			return refused(missing, kickSet{})
		}
		if o.needs != nil {
			if msg, ok := o.needs(s, c); !ok {
				return refused(msg, kickSet{})
			}
		}
		if r := change(s, c, &v); r != nil {
			return *r
		}
		k.put(s, name, v)
		if !o.noTouch {
			k.touch(t, name)
		}
		if o.noKick {
			return done(kickSet{})
		}
		return done(k.affected(s, name))
	}
}

// apply runs one command (with mu held).
func (s *Store) apply(c acl.Command, cred *credential, t *touchSet) reply {
	if c.Op == acl.OpModifyRole && c.Splice != nil && c.ACLs == nil {
		if r, ok := s.spliceRole(c.Role, *c.Splice, t); ok {
			return r
		}
	}
	f, ok := handlers[c.Op]
	if !ok {
		return refused("Unknown command", kickSet{})
	}
	return f(s, c, cred, t)
}

func (s *Store) applySetDefaultACLAccess(c acl.Command, _ *credential, _ *touchSet) reply {
	d := c.Default
	s.state.DefaultACL = &d
	return done(kickSet{})
}

func (s *Store) applyCreateRole(c acl.Command, _ *credential, t *touchSet) reply {
	st := &s.state
	if _, ok := st.Roles[c.Role]; ok {
		if len(c.ACLs) > 0 {
			// The role stays as it is: what this create meant to write is not written.
			return reply{verdict: acl.LostContent, msg: "Role already exists"}
		}
		return already("Role already exists", kickSet{})
	}
	r := acl.Role{Name: c.Role, ACLs: acl.Canonical(c.ACLs)}
	if err := r.Validate(); err != nil {
		return refused("Invalid ACL topic", kickSet{})
	}
	st.Roles[c.Role] = r
	t.role(c.Role)
	return done(kickSet{})
}

func (s *Store) applyDeleteRole(c acl.Command, _ *credential, t *touchSet) reply {
	st := &s.state
	if _, ok := st.Roles[c.Role]; !ok {
		return already("Role not found", kickSet{})
	}
	kicked := s.holders(c.Role)
	delete(st.Roles, c.Role)
	delete(s.roleKeys, c.Role)
	t.role(c.Role)
	for u := range s.direct[c.Role] {
		cl := st.Clients[u]
		cl.Roles = slices.DeleteFunc(slices.Clone(cl.Roles), func(r acl.RoleRef) bool { return r.Name == c.Role })
		st.Clients[u] = cl
		t.client(u)
	}
	delete(s.direct, c.Role)
	for g := range s.roleGroups[c.Role] {
		gr := st.Groups[g]
		gr.Roles = slices.DeleteFunc(slices.Clone(gr.Roles), func(r acl.RoleRef) bool { return r.Name == c.Role })
		st.Groups[g] = gr
		t.group(g)
	}
	delete(s.roleGroups, c.Role)
	return done(kicked)
}

func (s *Store) applyCreateGroup(c acl.Command, _ *credential, t *touchSet) reply {
	st := &s.state
	if _, ok := st.Groups[c.Group]; ok {
		return already("Group already exists", kickSet{})
	}
	st.Groups[c.Group] = acl.Group{Name: c.Group}
	t.group(c.Group)
	return done(kickSet{})
}

func (s *Store) applyDeleteGroup(c acl.Command, _ *credential, t *touchSet) reply {
	st := &s.state
	if _, ok := st.Groups[c.Group]; !ok {
		return already("Group not found", kickSet{})
	}
	kicked := s.memberSet(c.Group)
	s.setGroupRoles(c.Group, nil)
	delete(st.Groups, c.Group)
	t.group(c.Group)
	for u := range s.members[c.Group] {
		cl := st.Clients[u]
		cl.Groups = slices.DeleteFunc(slices.Clone(cl.Groups), func(g string) bool { return g == c.Group })
		st.Clients[u] = cl
		t.client(u)
	}
	delete(s.members, c.Group)
	return done(kicked)
}

func (s *Store) applyCreateClient(c acl.Command, cred *credential, t *touchSet) reply {
	st := &s.state
	if _, ok := st.Clients[c.Username]; ok {
		return already("Client already exists", kickSet{})
	}
	for _, g := range c.Groups {
		if _, ok := st.Groups[g]; !ok {
			return refused("Group not found", kickSet{})
		}
	}
	s.putClient(acl.Client{Username: c.Username, ClientID: c.ClientID, Groups: c.Groups})
	if cred != nil {
		s.creds[c.Username] = cred
	}
	t.client(c.Username)
	return done(kickSet{})
}

// applyModifyClient is written out: dynsec changes the client ID and password before it looks
// at the roles, and keeps those changes when a role is missing.
func (s *Store) applyModifyClient(c acl.Command, cred *credential, t *touchSet) reply {
	st := &s.state
	cl, ok := st.Clients[c.Username]
	if !ok {
		return refused("Client not found", kickSet{})
	}
	cl.ClientID = c.ClientID
	if cred != nil {
		s.creds[c.Username] = cred
	}
	st.Clients[c.Username] = cl
	for _, r := range c.Roles {
		if _, ok := st.Roles[r.Name]; !ok {
			return refused("Role not found", userKick(c.Username))
		}
	}
	cl.Roles = c.Roles
	// dynsec skips unknown groups silently here
	cl.Groups = slices.DeleteFunc(slices.Clone(c.Groups), func(g string) bool { _, ok := st.Groups[g]; return !ok })
	s.putClient(cl)
	t.client(c.Username)
	return done(userKick(c.Username))
}

func (s *Store) applyDeleteClient(c acl.Command, _ *credential, t *touchSet) reply {
	st := &s.state
	if _, ok := st.Clients[c.Username]; !ok {
		return already("Client not found", kickSet{})
	}
	s.dropClientLinks(c.Username)
	delete(st.Clients, c.Username)
	delete(s.creds, c.Username)
	t.client(c.Username)
	return done(userKick(c.Username))
}

// applySetClientPassword is written out: dynsec refuses an empty password before it looks the
// client up.
func (s *Store) applySetClientPassword(c acl.Command, cred *credential, _ *touchSet) reply {
	if c.Password == "" {
		return refused("Empty password is not allowed", kickSet{})
	}
	if _, ok := s.state.Clients[c.Username]; !ok {
		return refused("Client not found", kickSet{})
	}
	s.creds[c.Username] = cred
	return done(userKick(c.Username))
}

var _ acl.Backend = (*Store)(nil)
