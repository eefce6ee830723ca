// Package acl is the backend-neutral desired-state model of broker
// identities: roles made of ACLs, groups of roles, and clients (username,
// optional fixed client ID, roles, groups). It mirrors Mosquitto's
// dynamic-security plugin (2.0.x) closely enough that the same state means
// the same decisions on Mosquitto and on the embedded mochi broker:
//
//   - Diff turns (observed, desired) into the minimal list of dynsec-named
//     Commands; Backends execute them (Mosquitto over $CONTROL, the embedded
//     broker in memory).
//   - Policy/State.Check reproduce dynsec's ACL decision exactly (priority
//     order, literal-before-pattern subscribe lookup, $-topic rules, $share
//     filters checked as written).
//
// Only objects whose names carry the backend's prefix (default "a2a:") are
// observed or changed, so hand-made clients and roles (the dynsec admin) are
// never touched.
package acl

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// DefaultPrefix marks every broker object (client, role, group) the operator owns, so hand-made
// broker objects (the dynsec admin, say) are never touched. It lives here, with the broker
// model, so that the model needs nothing from Kubernetes; internal/identity names agents'
// objects under it (identity.BrokerPrefix).
const DefaultPrefix = "a2a:"

// ACLType is a dynsec ACL type; the values are the plugin's JSON names.
type ACLType string

// The six dynsec ACL types.
const (
	// PublishClientSend: the client may publish to topics matching the filter.
	PublishClientSend ACLType = "publishClientSend"
	// PublishClientReceive: the broker may deliver messages on matching topics
	// to the client (checked at delivery time, after the subscription).
	PublishClientReceive ACLType = "publishClientReceive"
	// SubscribeLiteral: the subscription filter must equal Topic exactly
	// ("+"/"#" are plain characters here).
	SubscribeLiteral ACLType = "subscribeLiteral"
	// SubscribePattern: the subscription filter must be covered by Topic
	// ("+"/"#" in Topic are wildcards over the filter's levels).
	SubscribePattern ACLType = "subscribePattern"
	// UnsubscribeLiteral and UnsubscribePattern mirror the subscribe types.
	UnsubscribeLiteral ACLType = "unsubscribeLiteral"
	UnsubscribePattern ACLType = "unsubscribePattern"
)

// aclTypeOrder is the order in which dynsec lists a role's ACLs (it keeps
// one hash per type); canonical forms follow it so observed and desired
// roles compare equal.
var aclTypeOrder = map[ACLType]int{
	PublishClientSend:    0,
	PublishClientReceive: 1,
	SubscribeLiteral:     2,
	SubscribePattern:     3,
	UnsubscribeLiteral:   4,
	UnsubscribePattern:   5,
}

// Valid reports whether t is one of the six dynsec types.
func (t ACLType) Valid() bool { _, ok := aclTypeOrder[t]; return ok }

// isSubscribe reports whether t governs SUBSCRIBE (used to decide when a
// role change revokes existing subscriptions).
func (t ACLType) isSubscribe() bool { return t == SubscribeLiteral || t == SubscribePattern }

// ACL is one rule of a role. Higher Priority is checked first; among equal
// priorities the order given is kept (dynsec inserts in order).
type ACL struct {
	Type     ACLType `json:"acltype"`
	Topic    string  `json:"topic"`
	Priority int     `json:"priority"`
	Allow    bool    `json:"allow"`
}

func (a ACL) String() string {
	verb := "deny"
	if a.Allow {
		verb = "allow"
	}
	return fmt.Sprintf("%s %s %q prio %d", verb, a.Type, a.Topic, a.Priority)
}

// PasswordHash is a password's at-rest form: PBKDF2-SHA512 of the password
// with Salt and Iterations (dynsec's scheme, the decision table's on disk).
type PasswordHash struct {
	Salt       []byte `json:"salt"`
	Iterations int    `json:"iterations"`
	Hash       []byte `json:"hash"`
}

// Role is a named, ordered set of ACLs.
type Role struct {
	Name string `json:"rolename"`
	ACLs []ACL  `json:"acls"`
}

// RoleRef attaches a role to a client or group. Higher Priority is checked
// first; equal priorities are ordered by role name (as dynsec does).
type RoleRef struct {
	Name     string `json:"rolename"`
	Priority int    `json:"priority"`
}

// Group is a named set of roles that clients can join.
type Group struct {
	Name  string    `json:"groupname"`
	Roles []RoleRef `json:"roles"`
}

// Client is one broker identity.
type Client struct {
	Username string `json:"username"`
	// ClientID, when set, is the only MQTT Client ID this username may
	// connect with (dynsec refuses others at CONNECT).
	ClientID string    `json:"clientid,omitempty"`
	Roles    []RoleRef `json:"roles"`
	// Groups are joined with dynsec's default membership priority (-1), so
	// a client's groups are checked in name order after its own roles.
	Groups []string `json:"groups"`
}

// GroupMembershipPriority is the priority every membership gets (dynsec's
// default when none is given).
const GroupMembershipPriority = -1

// DefaultACLAccess is what applies when no ACL of a client matches.
type DefaultACLAccess struct {
	PublishClientSend    bool `json:"publishClientSend"`
	PublishClientReceive bool `json:"publishClientReceive"`
	Subscribe            bool `json:"subscribe"`
	Unsubscribe          bool `json:"unsubscribe"`
}

// DenyByDefault is the least-privilege default: nothing may be published or
// subscribed unless granted. Receiving stays allowed (it needs a granted
// subscription first) and so does unsubscribing. These are also dynsec's own
// defaults; setting them explicitly repairs hand-made changes.
var DenyByDefault = DefaultACLAccess{PublishClientReceive: true, Unsubscribe: true}

// State is a set of broker objects, keyed by name (clients by username).
type State struct {
	Roles   map[string]Role   `json:"roles"`
	Groups  map[string]Group  `json:"groups"`
	Clients map[string]Client `json:"clients"`
	// DefaultACL is nil when unknown or not to be managed.
	DefaultACL *DefaultACLAccess `json:"defaultACLAccess,omitempty"`
}

// NewState builds a State from lists (later duplicates win).
func NewState(roles []Role, groups []Group, clients []Client) State {
	s := State{Roles: map[string]Role{}, Groups: map[string]Group{}, Clients: map[string]Client{}}
	for _, r := range roles {
		s.Roles[r.Name] = r
	}
	for _, g := range groups {
		s.Groups[g.Name] = g
	}
	for _, c := range clients {
		s.Clients[c.Username] = c
	}
	return s
}

// Clone deep-copies s so callers can keep a snapshot.
func (s State) Clone() State {
	out := State{Roles: make(map[string]Role, len(s.Roles)), Groups: make(map[string]Group, len(s.Groups)), Clients: make(map[string]Client, len(s.Clients))}
	for k, r := range s.Roles {
		r.ACLs = append([]ACL(nil), r.ACLs...)
		out.Roles[k] = r
	}
	for k, g := range s.Groups {
		g.Roles = append([]RoleRef(nil), g.Roles...)
		out.Groups[k] = g
	}
	for k, c := range s.Clients {
		c.Roles = append([]RoleRef(nil), c.Roles...)
		c.Groups = append([]string(nil), c.Groups...)
		out.Clients[k] = c
	}
	if s.DefaultACL != nil {
		d := *s.DefaultACL
		out.DefaultACL = &d
	}
	return out
}

// Names selects objects by name.
type Names struct {
	Roles   []string `json:"roles,omitempty"`
	Groups  []string `json:"groups,omitempty"`
	Clients []string `json:"clients,omitempty"`
}

// Empty reports whether no name is selected.
func (n Names) Empty() bool { return len(n.Roles)+len(n.Groups)+len(n.Clients) == 0 }

// Desired is what Apply should make true on the broker.
type Desired struct {
	// State holds the objects that must exist exactly as given. DefaultACL,
	// when set, is enforced too.
	State
	// Passwords are used when a client has to be created (first time, or
	// after someone deleted it by hand). They are never compared with the
	// broker (dynsec does not reveal hashes) and never set on an existing
	// client: rotate with SetPassword.
	Passwords map[string]string
	// Delete lists objects to remove; absent ones are fine. A name that is
	// also desired is kept.
	Delete Names
	// CreateRoles are roles created, empty, when they are missing and never
	// changed when they exist: roles whose content another writer owns (the
	// shared unit/org/gates roles), which this Apply only needs to exist
	// because a group or client it writes references them. Naming such a
	// role in State instead would overwrite what the owner wrote between
	// this Apply's observations.
	CreateRoles []string
	// Prune also removes every observed object (with the prefix) that is not
	// in State: the full-fleet sync mode.
	Prune bool
}

// Canonical returns the ACLs in dynsec's listing order: grouped by type,
// each group stably sorted by descending priority (equal priorities keep
// their relative order, which is what dynsec's ordered insert does).
func Canonical(acls []ACL) []ACL {
	out := append([]ACL(nil), acls...)
	less := canonicalLess
	// A stable sort leaves a sorted list as it is: a list already in order (a role as stored,
	// with a rule more) costs one pass instead of a sort.
	sorted := true
	for i := 1; i < len(out) && sorted; i++ {
		sorted = !less(out[i], out[i-1])
	}
	if !sorted {
		sort.SliceStable(out, func(i, j int) bool { return less(out[i], out[j]) })
	}
	return out
}

// canonicalLess is the order of Canonical: type (dynsec's listing order),
// then descending priority.
func canonicalLess(a, b ACL) bool {
	ta, tb := aclTypeOrder[a.Type], aclTypeOrder[b.Type]
	if ta != tb {
		return ta < tb
	}
	return a.Priority > b.Priority
}

// sortedRefs orders role references as dynsec does: priority descending,
// then name ascending.
func sortedRefs(refs []RoleRef) []RoleRef {
	out := append([]RoleRef(nil), refs...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Priority != out[j].Priority {
			return out[i].Priority > out[j].Priority
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// ValidateName checks a role/group/user name: dynsec only requires UTF-8,
// we additionally refuse empty names and control characters so names are
// safe in logs and JSON.
func ValidateName(kind, name string) error {
	if name == "" {
		return fmt.Errorf("%s name is empty", kind)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("%s name %q is not valid UTF-8", kind, name)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%s name %q contains a control character", kind, name)
		}
	}
	return nil
}

// ValidateFilter checks an ACL topic the way mosquitto_sub_topic_check
// does: "+" and "#" must fill a whole level and "#" must be last. MQTT also
// limits topics to 65535 bytes of UTF-8 without NUL.
func ValidateFilter(filter string) error {
	if filter == "" {
		return errors.New("topic filter is empty")
	}
	if len(filter) > 65535 {
		return errors.New("topic filter longer than 65535 bytes")
	}
	if !utf8.ValidString(filter) || strings.ContainsRune(filter, 0) {
		return fmt.Errorf("topic filter %q is not valid UTF-8 without NUL", filter)
	}
	// Level by level without splitting (no allocation: a large role validates thousands).
	for rest, more := filter, true; more; {
		var l string
		l, rest, more = strings.Cut(rest, "/")
		if strings.ContainsAny(l, "+#") && len(l) != 1 {
			return fmt.Errorf("topic filter %q: wildcard must fill a whole level", filter)
		}
		if l == "#" && more {
			return fmt.Errorf("topic filter %q: '#' must be the last level", filter)
		}
	}
	return nil
}

// Validate checks one role: types, filters, and no two ACLs of the same
// type on the same topic (dynsec keys a role's ACLs by type and topic, so a
// duplicate would be silently shadowed).
func (r Role) Validate() error {
	if err := ValidateName("role", r.Name); err != nil {
		return err
	}
	seen := make(map[[2]string]bool, len(r.ACLs))
	for _, a := range r.ACLs {
		if !a.Type.Valid() {
			return fmt.Errorf("role %q: unknown ACL type %q", r.Name, a.Type)
		}
		if err := ValidateFilter(a.Topic); err != nil {
			return fmt.Errorf("role %q: %w", r.Name, err)
		}
		k := [2]string{string(a.Type), a.Topic}
		if seen[k] {
			return fmt.Errorf("role %q: two %s ACLs for topic %q", r.Name, a.Type, a.Topic)
		}
		seen[k] = true
	}
	return nil
}

func validateRefs(owner string, refs []RoleRef) error {
	seen := map[string]bool{}
	for _, ref := range refs {
		if err := ValidateName("role", ref.Name); err != nil {
			return fmt.Errorf("%s: %w", owner, err)
		}
		if seen[ref.Name] {
			return fmt.Errorf("%s: role %q listed twice", owner, ref.Name)
		}
		seen[ref.Name] = true
	}
	return nil
}

// Validate checks a group's name and role references.
func (g Group) Validate() error {
	if err := ValidateName("group", g.Name); err != nil {
		return err
	}
	return validateRefs(fmt.Sprintf("group %q", g.Name), g.Roles)
}

// Validate checks a client's names and references.
func (c Client) Validate() error {
	if err := ValidateName("user", c.Username); err != nil {
		return err
	}
	if c.ClientID != "" && !utf8.ValidString(c.ClientID) {
		return fmt.Errorf("client %q: client ID is not valid UTF-8", c.Username)
	}
	if err := validateRefs(fmt.Sprintf("client %q", c.Username), c.Roles); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, g := range c.Groups {
		if err := ValidateName("group", g); err != nil {
			return fmt.Errorf("client %q: %w", c.Username, err)
		}
		if seen[g] {
			return fmt.Errorf("client %q: group %q listed twice", c.Username, g)
		}
		seen[g] = true
	}
	return nil
}

// Validate checks d against the objects observed on the broker: every name
// carries prefix (so foreign objects can never be touched), every object is
// well-formed, map keys match names, and every reference resolves to a role
// or group that is desired or already present and not being deleted.
func (d Desired) Validate(prefix string, observed State) error {
	var errs []error
	owned := func(kind, name string) {
		if !strings.HasPrefix(name, prefix) {
			errs = append(errs, fmt.Errorf("%s %q does not carry the managed prefix %q", kind, name, prefix))
		}
	}
	for k, r := range d.Roles {
		owned("role", r.Name)
		if k != r.Name {
			errs = append(errs, fmt.Errorf("role map key %q differs from name %q", k, r.Name))
		}
		if err := r.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	for k, g := range d.Groups {
		owned("group", g.Name)
		if k != g.Name {
			errs = append(errs, fmt.Errorf("group map key %q differs from name %q", k, g.Name))
		}
		if err := g.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	for k, c := range d.Clients {
		owned("client", c.Username)
		if k != c.Username {
			errs = append(errs, fmt.Errorf("client map key %q differs from username %q", k, c.Username))
		}
		if err := c.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, n := range d.Delete.Roles {
		owned("role", n)
	}
	for _, n := range d.CreateRoles {
		owned("role", n)
	}
	for _, n := range d.Delete.Groups {
		owned("group", n)
	}
	for _, n := range d.Delete.Clients {
		owned("client", n)
	}
	// References must survive this Apply.
	plan := planned(observed, d)
	for _, g := range d.Groups {
		for _, ref := range g.Roles {
			if _, ok := plan.Roles[ref.Name]; !ok {
				errs = append(errs, fmt.Errorf("group %q references role %q, which is neither desired nor present", g.Name, ref.Name))
			}
		}
	}
	for _, c := range d.Clients {
		for _, ref := range c.Roles {
			if _, ok := plan.Roles[ref.Name]; !ok {
				errs = append(errs, fmt.Errorf("client %q references role %q, which is neither desired nor present", c.Username, ref.Name))
			}
		}
		for _, g := range c.Groups {
			if _, ok := plan.Groups[g]; !ok {
				errs = append(errs, fmt.Errorf("client %q references group %q, which is neither desired nor present", c.Username, g))
			}
		}
	}
	return errors.Join(errs...)
}

// planned is the state Diff aims for: observed, minus deletions (explicit or
// pruned), plus desired objects.
func planned(observed State, d Desired) State {
	out := State{Roles: map[string]Role{}, Groups: map[string]Group{}, Clients: map[string]Client{}}
	if !d.Prune {
		for k, v := range observed.Roles {
			out.Roles[k] = v
		}
		for k, v := range observed.Groups {
			out.Groups[k] = v
		}
		for k, v := range observed.Clients {
			out.Clients[k] = v
		}
	}
	for _, n := range d.Delete.Roles {
		delete(out.Roles, n)
	}
	for _, n := range d.Delete.Groups {
		delete(out.Groups, n)
	}
	for _, n := range d.Delete.Clients {
		delete(out.Clients, n)
	}
	for _, n := range d.CreateRoles {
		if _, ok := out.Roles[n]; !ok {
			out.Roles[n] = Role{Name: n}
		}
	}
	for k, v := range d.Roles {
		out.Roles[k] = v
	}
	for k, v := range d.Groups {
		out.Groups[k] = v
	}
	for k, v := range d.Clients {
		out.Clients[k] = v
	}
	out.DefaultACL = observed.DefaultACL
	if d.DefaultACL != nil {
		out.DefaultACL = d.DefaultACL
	}
	return out
}

// Planned returns the state the broker will be in after a successful Apply
// of d over observed (useful for Check-style previews and tests).
func Planned(observed State, d Desired) State { return planned(observed, d).Clone() }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
