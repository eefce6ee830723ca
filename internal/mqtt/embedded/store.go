// Package embedded is the local-run acl.Backend: an in-process mochi-mqtt v2
// broker whose authentication and ACL hook enforces the same model with the
// same decisions as Mosquitto's dynamic-security plugin (acl.Policy), and a
// Store that executes the same dynsec commands in memory with the plugin's
// replies and disconnect ("kick") behaviour.
//
// Limits: one process, state in memory, optionally persisted to a JSON
// snapshot file rewritten after every change (password hashes only, never
// plaintext); no $CONTROL API (manage it through the Store); UNSUBSCRIBE is
// never refused (mochi has no hook for it; dynsec's default allows it too).
// docs/broker.md lists the remaining differences.
package embedded

import (
	"context"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// DefaultIterations is the PBKDF2-SHA512 work factor for stored passwords:
// ten times dynsec 2.0's 101, about 0.5 ms per hash here. Hashing runs for
// every created client and every CONNECT, and dominated the embedded
// broker's CPU in the fleet benchmark at 10 000; raise it with
// StoreConfig.Iterations for a broker reachable beyond loopback.
const DefaultIterations = 1000

// StoreConfig configures NewStore.
type StoreConfig struct {
	// Prefix of the managed names (default acl.DefaultPrefix).
	Prefix string
	// AdminUsername/AdminPassword: a user that may connect and do anything
	// (all ACL checks pass), like a superuser. Empty disables it.
	AdminUsername string
	AdminPassword string
	// SnapshotPath, when set, is loaded at start (if it exists) and
	// rewritten atomically after every change.
	SnapshotPath string
	// Iterations for new password hashes (default DefaultIterations).
	Iterations int
}

// credential is a PBKDF2-SHA512 hash (the same scheme dynsec stores).
type credential struct {
	Salt       []byte `json:"salt"`
	Iterations int    `json:"iterations"`
	Hash       []byte `json:"hash"`
}

func newCredential(password string, iterations int) (credential, error) {
	salt := make([]byte, 12)
	if _, err := rand.Read(salt); err != nil {
		return credential{}, fmt.Errorf("password salt: %w", err)
	}
	h, err := pbkdf2.Key(sha512.New, password, salt, iterations, 64)
	if err != nil {
		return credential{}, fmt.Errorf("password hash: %w", err)
	}
	return credential{Salt: salt, Iterations: iterations, Hash: h}, nil
}

func (c credential) matches(password string) bool {
	if len(c.Hash) == 0 || c.Iterations < 1 {
		return false
	}
	h, err := pbkdf2.Key(sha512.New, password, c.Salt, c.Iterations, len(c.Hash))
	return err == nil && subtle.ConstantTimeCompare(h, c.Hash) == 1
}

// Store holds the broker's identities and implements acl.Backend.
type Store struct {
	cfg   StoreConfig
	admin *credential

	mu       sync.Mutex // serialises changes and snapshot writes
	state    acl.State  // all objects (any names); Observe filters by prefix
	creds    map[string]credential
	policy   atomic.Pointer[acl.Policy]
	kick     atomic.Pointer[func(usernames []string)]
	mutation atomic.Uint64
	reads    atomic.Uint64
	trips    atomic.Uint64
}

// snapshot is the JSON file format.
type snapshot struct {
	Version     int                   `json:"version"`
	State       acl.State             `json:"state"`
	Credentials map[string]credential `json:"credentials"`
}

// NewStore creates a store, loading the snapshot file when configured.
func NewStore(cfg StoreConfig) (*Store, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = acl.DefaultPrefix
	}
	if cfg.Iterations <= 0 {
		cfg.Iterations = DefaultIterations
	}
	s := &Store{cfg: cfg, state: acl.NewState(nil, nil, nil), creds: map[string]credential{}}
	d := acl.DenyByDefault
	s.state.DefaultACL = &d
	if cfg.AdminUsername != "" {
		if cfg.AdminPassword == "" {
			return nil, errors.New("embedded: admin user needs a password")
		}
		c, err := newCredential(cfg.AdminPassword, cfg.Iterations)
		if err != nil {
			return nil, fmt.Errorf("embedded: admin: %w", err)
		}
		s.admin = &c
	}
	if cfg.SnapshotPath != "" {
		if err := s.load(); err != nil {
			return nil, err
		}
	}
	s.policy.Store(acl.Compile(s.state))
	return s, nil
}

func (s *Store) load() error {
	data, err := os.ReadFile(s.cfg.SnapshotPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("embedded: read snapshot: %w", err)
	}
	var snap snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return fmt.Errorf("embedded: decode snapshot %s: %w", s.cfg.SnapshotPath, err)
	}
	if snap.Version != 1 {
		return fmt.Errorf("embedded: snapshot %s has unknown version %d", s.cfg.SnapshotPath, snap.Version)
	}
	st := acl.NewState(nil, nil, nil)
	for k, v := range snap.State.Roles {
		st.Roles[k] = v
	}
	for k, v := range snap.State.Groups {
		st.Groups[k] = v
	}
	for k, v := range snap.State.Clients {
		st.Clients[k] = v
	}
	st.DefaultACL = s.state.DefaultACL
	if snap.State.DefaultACL != nil {
		st.DefaultACL = snap.State.DefaultACL
	}
	s.state = st
	if snap.Credentials != nil {
		s.creds = snap.Credentials
	}
	return nil
}

// save writes the snapshot atomically (temp file + rename). Called with mu.
func (s *Store) save() error {
	if s.cfg.SnapshotPath == "" {
		return nil
	}
	data, err := json.MarshalIndent(snapshot{Version: 1, State: s.state, Credentials: s.creds}, "", "  ")
	if err != nil {
		return fmt.Errorf("embedded: encode snapshot: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.cfg.SnapshotPath), ".snapshot-*")
	if err != nil {
		return fmt.Errorf("embedded: write snapshot: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("embedded: write snapshot: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("embedded: sync snapshot: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("embedded: write snapshot: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.cfg.SnapshotPath); err != nil {
		return fmt.Errorf("embedded: replace snapshot: %w", err)
	}
	return nil
}

// setKicker installs the function that disconnects clients by username.
func (s *Store) setKicker(f func(usernames []string)) { s.kick.Store(&f) }

// Prefix implements acl.Backend.
func (s *Store) Prefix() string { return s.cfg.Prefix }

// Stats implements acl.Backend.
func (s *Store) Stats() acl.Stats {
	return acl.Stats{Mutations: s.mutation.Load(), Reads: s.reads.Load(), RoundTrips: s.trips.Load()}
}

// Observe implements acl.Backend.
func (s *Store) Observe(ctx context.Context, only *acl.Names) (acl.State, error) {
	if err := ctx.Err(); err != nil {
		return acl.State{}, fmt.Errorf("embedded: observe: %w", err)
	}
	s.trips.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
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
	return s.decide(username, access, topic), nil
}

// decide is the hook's decision: the admin may do anything, everyone else
// gets dynsec's answer.
func (s *Store) decide(username string, access acl.Access, topic string) acl.Decision {
	if s.admin != nil && username == s.cfg.AdminUsername {
		return acl.Decision{Allow: true, Reason: "admin user"}
	}
	return s.policy.Load().Check(username, access, topic)
}

// authenticate mirrors dynsec's basic auth: known user, client ID equal to
// the configured one when set, password hash match.
func (s *Store) authenticate(username, password, clientID string) bool {
	if s.admin != nil && username == s.cfg.AdminUsername {
		return s.admin.matches(password)
	}
	s.mu.Lock()
	c, ok := s.state.Clients[username]
	cred, hasPW := s.creds[username]
	s.mu.Unlock()
	if !ok || !hasPW {
		return false
	}
	if c.ClientID != "" && c.ClientID != clientID {
		return false
	}
	return cred.matches(password)
}

// Execute implements acl.Backend: each command has the effect, the reply
// text and the disconnects of its Mosquitto 2.0.11 dynsec counterpart.
func (s *Store) Execute(ctx context.Context, cmds []acl.Command) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("embedded: execute: %w", err)
	}
	s.trips.Add(1)
	s.mutation.Add(uint64(len(cmds)))
	// Hash outside the lock: PBKDF2 is deliberately slow.
	creds := map[int]credential{}
	for i, c := range cmds {
		if (c.Op == acl.OpCreateClient || c.Op == acl.OpSetClientPassword || c.Op == acl.OpModifyClient) && c.Password != "" {
			cr, err := newCredential(c.Password, s.cfg.Iterations)
			if err != nil {
				return fmt.Errorf("embedded: %s: %w", c, err)
			}
			creds[i] = cr
		}
	}

	s.mu.Lock()
	kicks := map[string]bool{}
	var errs []error
	for i, c := range cmds {
		msg := s.apply(c, creds[i], kicks)
		if msg != "" && !acl.Benign(c.Op, msg) {
			errs = append(errs, &acl.CommandError{Command: c, Message: msg})
		}
	}
	s.policy.Store(acl.Compile(s.state))
	if err := s.save(); err != nil {
		errs = append(errs, err)
	}
	s.mu.Unlock()

	if len(kicks) > 0 {
		if f := s.kick.Load(); f != nil {
			users := make([]string, 0, len(kicks))
			for u := range kicks {
				users = append(users, u)
			}
			(*f)(users)
		}
	}
	return errors.Join(errs...)
}

// holders lists the usernames that hold role directly or through a group.
func (s *Store) holders(role string) []string {
	var out []string
	for u, c := range s.state.Clients {
		if slices.ContainsFunc(c.Roles, func(r acl.RoleRef) bool { return r.Name == role }) {
			out = append(out, u)
			continue
		}
		for _, g := range c.Groups {
			if slices.ContainsFunc(s.state.Groups[g].Roles, func(r acl.RoleRef) bool { return r.Name == role }) {
				out = append(out, u)
				break
			}
		}
	}
	return out
}

func (s *Store) members(group string) []string {
	var out []string
	for u, c := range s.state.Clients {
		if slices.Contains(c.Groups, group) {
			out = append(out, u)
		}
	}
	return out
}

func kickAll(kicks map[string]bool, users []string) {
	for _, u := range users {
		kicks[u] = true
	}
}

// apply runs one command (with mu held) and returns dynsec's error text, or
// "" on success.
func (s *Store) apply(c acl.Command, cred credential, kicks map[string]bool) string {
	st := &s.state
	switch c.Op {
	case acl.OpSetDefaultACLAccess:
		d := c.Default
		st.DefaultACL = &d

	case acl.OpCreateRole:
		if _, ok := st.Roles[c.Role]; ok {
			return "Role already exists"
		}
		r := acl.Role{Name: c.Role, ACLs: acl.Canonical(c.ACLs)}
		if err := r.Validate(); err != nil {
			return "Invalid ACL topic"
		}
		st.Roles[c.Role] = r
	case acl.OpModifyRole:
		r, ok := st.Roles[c.Role]
		if !ok {
			return "Role does not exist"
		}
		nr := acl.Role{Name: c.Role, ACLs: acl.Canonical(c.ACLs)}
		if err := nr.Validate(); err != nil {
			return "Invalid ACL topic"
		}
		r.ACLs = nr.ACLs
		st.Roles[c.Role] = r // like dynsec: no disconnects
	case acl.OpDeleteRole:
		if _, ok := st.Roles[c.Role]; !ok {
			return "Role not found"
		}
		kickAll(kicks, s.holders(c.Role))
		delete(st.Roles, c.Role)
		for u, cl := range st.Clients {
			cl.Roles = slices.DeleteFunc(slices.Clone(cl.Roles), func(r acl.RoleRef) bool { return r.Name == c.Role })
			st.Clients[u] = cl
		}
		for n, g := range st.Groups {
			g.Roles = slices.DeleteFunc(slices.Clone(g.Roles), func(r acl.RoleRef) bool { return r.Name == c.Role })
			st.Groups[n] = g
		}
	case acl.OpAddRoleACL:
		r, ok := st.Roles[c.Role]
		if !ok {
			return "Role not found"
		}
		if !c.ACL.Type.Valid() {
			return "Unknown acltype"
		}
		if acl.ValidateFilter(c.ACL.Topic) != nil {
			return "Invalid ACL topic"
		}
		if slices.ContainsFunc(r.ACLs, func(a acl.ACL) bool { return a.Type == c.ACL.Type && a.Topic == c.ACL.Topic }) {
			return "ACL with this topic already exists"
		}
		r.ACLs = acl.Canonical(append(slices.Clone(r.ACLs), c.ACL))
		st.Roles[c.Role] = r
		kickAll(kicks, s.holders(c.Role))
	case acl.OpRemoveRoleACL:
		r, ok := st.Roles[c.Role]
		if !ok {
			return "Role not found"
		}
		i := slices.IndexFunc(r.ACLs, func(a acl.ACL) bool { return a.Type == c.ACL.Type && a.Topic == c.ACL.Topic })
		if i < 0 {
			return "ACL not found"
		}
		r.ACLs = slices.Delete(slices.Clone(r.ACLs), i, i+1)
		st.Roles[c.Role] = r
		kickAll(kicks, s.holders(c.Role))

	case acl.OpCreateGroup:
		if _, ok := st.Groups[c.Group]; ok {
			return "Group already exists"
		}
		st.Groups[c.Group] = acl.Group{Name: c.Group}
	case acl.OpDeleteGroup:
		if _, ok := st.Groups[c.Group]; !ok {
			return "Group not found"
		}
		kickAll(kicks, s.members(c.Group))
		delete(st.Groups, c.Group)
		for u, cl := range st.Clients {
			cl.Groups = slices.DeleteFunc(slices.Clone(cl.Groups), func(g string) bool { return g == c.Group })
			st.Clients[u] = cl
		}
	case acl.OpAddGroupRole:
		g, ok := st.Groups[c.Group]
		if !ok {
			return "Group not found"
		}
		if _, ok := st.Roles[c.Role]; !ok {
			return "Role not found"
		}
		if slices.ContainsFunc(g.Roles, func(r acl.RoleRef) bool { return r.Name == c.Role }) {
			return "Group is already in this role"
		}
		g.Roles = append(slices.Clone(g.Roles), acl.RoleRef{Name: c.Role, Priority: c.Priority})
		st.Groups[c.Group] = g
		kickAll(kicks, s.members(c.Group))
	case acl.OpRemoveGroupRole:
		g, ok := st.Groups[c.Group]
		if !ok {
			return "Group not found"
		}
		if _, ok := st.Roles[c.Role]; !ok {
			return "Role not found"
		}
		g.Roles = slices.DeleteFunc(slices.Clone(g.Roles), func(r acl.RoleRef) bool { return r.Name == c.Role })
		st.Groups[c.Group] = g
		kickAll(kicks, s.members(c.Group))

	case acl.OpCreateClient:
		if _, ok := st.Clients[c.Username]; ok {
			return "Client already exists"
		}
		for _, g := range c.Groups {
			if _, ok := st.Groups[g]; !ok {
				return "Group not found"
			}
		}
		st.Clients[c.Username] = acl.Client{Username: c.Username, ClientID: c.ClientID, Groups: slices.Clone(c.Groups)}
		if c.Password != "" {
			s.creds[c.Username] = cred
		}
	case acl.OpModifyClient:
		cl, ok := st.Clients[c.Username]
		if !ok {
			return "Client not found"
		}
		// dynsec changes the client ID and password before it looks at the
		// roles, and keeps those changes when a role is missing.
		cl.ClientID = c.ClientID
		if c.Password != "" {
			s.creds[c.Username] = cred
		}
		st.Clients[c.Username] = cl
		for _, r := range c.Roles {
			if _, ok := st.Roles[r.Name]; !ok {
				kicks[c.Username] = true
				return "Role not found"
			}
		}
		cl.Roles = slices.Clone(c.Roles)
		// dynsec skips unknown groups silently here
		cl.Groups = slices.DeleteFunc(slices.Clone(c.Groups), func(g string) bool { _, ok := st.Groups[g]; return !ok })
		st.Clients[c.Username] = cl
		kicks[c.Username] = true
	case acl.OpDeleteClient:
		if _, ok := st.Clients[c.Username]; !ok {
			return "Client not found"
		}
		delete(st.Clients, c.Username)
		delete(s.creds, c.Username)
		kicks[c.Username] = true
	case acl.OpSetClientPassword:
		if c.Password == "" {
			return "Empty password is not allowed"
		}
		if _, ok := st.Clients[c.Username]; !ok {
			return "Client not found"
		}
		s.creds[c.Username] = cred
		kicks[c.Username] = true
	case acl.OpSetClientID:
		cl, ok := st.Clients[c.Username]
		if !ok {
			return "Client not found"
		}
		cl.ClientID = c.ClientID
		st.Clients[c.Username] = cl
		kicks[c.Username] = true
	case acl.OpAddClientRole:
		cl, ok := st.Clients[c.Username]
		if !ok {
			return "Client not found"
		}
		if _, ok := st.Roles[c.Role]; !ok {
			return "Role not found"
		}
		if slices.ContainsFunc(cl.Roles, func(r acl.RoleRef) bool { return r.Name == c.Role }) {
			return "Internal error" // sic: dynsec 2.0.11's reply for a role the client already has
		}
		cl.Roles = append(slices.Clone(cl.Roles), acl.RoleRef{Name: c.Role, Priority: c.Priority})
		st.Clients[c.Username] = cl
		kicks[c.Username] = true
	case acl.OpRemoveClientRole:
		cl, ok := st.Clients[c.Username]
		if !ok {
			return "Client not found"
		}
		if _, ok := st.Roles[c.Role]; !ok {
			return "Role not found"
		}
		cl.Roles = slices.DeleteFunc(slices.Clone(cl.Roles), func(r acl.RoleRef) bool { return r.Name == c.Role })
		st.Clients[c.Username] = cl
		kicks[c.Username] = true
	case acl.OpAddGroupClient:
		cl, ok := st.Clients[c.Username]
		if !ok {
			return "Client not found"
		}
		if _, ok := st.Groups[c.Group]; !ok {
			return "Group not found"
		}
		kicks[c.Username] = true
		if slices.Contains(cl.Groups, c.Group) {
			return "Client is already in this group"
		}
		cl.Groups = append(slices.Clone(cl.Groups), c.Group)
		st.Clients[c.Username] = cl
	case acl.OpRemoveGroupClient:
		cl, ok := st.Clients[c.Username]
		if !ok {
			return "Client not found"
		}
		if _, ok := st.Groups[c.Group]; !ok {
			return "Group not found"
		}
		cl.Groups = slices.DeleteFunc(slices.Clone(cl.Groups), func(g string) bool { return g == c.Group })
		st.Clients[c.Username] = cl
		kicks[c.Username] = true
	default:
		return "Unknown command"
	}
	return ""
}

var _ acl.Backend = (*Store)(nil)
