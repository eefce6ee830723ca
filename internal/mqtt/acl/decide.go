package acl

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Access is the kind of operation being checked.
type Access string

// The four operations dynsec distinguishes.
const (
	// Publish: the client sends PUBLISH (publishClientSend ACLs).
	Publish Access = "publish"
	// Receive: the broker delivers a message to the client
	// (publishClientReceive ACLs), after the subscription was granted.
	Receive Access = "receive"
	// Subscribe: the client sends SUBSCRIBE with this filter, checked as
	// written ("$share/group/..." included).
	Subscribe Access = "subscribe"
	// Unsubscribe: the client sends UNSUBSCRIBE with this filter.
	Unsubscribe Access = "unsubscribe"
)

// Valid reports whether a is one of the four accesses.
func (a Access) Valid() bool {
	switch a {
	case Publish, Receive, Subscribe, Unsubscribe:
		return true
	}
	return false
}

// Decision explains a Check result.
type Decision struct {
	Allow bool
	// Reason names what decided: the matching role and ACL, the default
	// access, or an unknown user.
	Reason string
}

func (d Decision) String() string {
	if d.Allow {
		return "allow: " + d.Reason
	}
	return "deny: " + d.Reason
}

// Policy is a State compiled into a decision table for fast, repeated
// checks (the embedded broker runs one per PUBLISH and per delivery). It is
// safe for concurrent use and incremental: Sync recompiles only the objects
// a change touched, so keeping it current costs what the change costs, not
// what the fleet costs.
//
// Clients, groups and roles are slots that refer to each other by pointer;
// a client's evaluation order (own roles by priority desc then name, then
// each group by name with its roles in the same order) is kept sorted per
// object and walked at check time, never flattened per client, so a group
// shared by thousands of clients is stored and sorted once.
type Policy struct {
	mu       sync.RWMutex
	defaults DefaultACLAccess
	roles    map[string]*roleSlot
	groups   map[string]*groupSlot
	clients  map[string]*clientSlot
}

// roleSlot is a role name that is defined or referenced; rp is nil while
// the role does not exist (dynsec cannot hold dangling references, but a
// slot may be referenced before its role is synced).
type roleSlot struct {
	name string
	rp   *rolePolicy
	refs int // references from groups and clients
}

type groupSlot struct {
	name   string
	exists bool
	roles  []slotRef // priority desc, name asc
	refs   int       // member clients
}

type slotRef struct {
	priority int
	role     *roleSlot
}

type clientSlot struct {
	roles  []slotRef    // priority desc, name asc
	groups []*groupSlot // membership priorities are all equal: name order
}

type rolePolicy struct {
	// per type, in priority order (equal priorities keep given order); the
	// literal subscribe/unsubscribe ACLs are looked up by topic first in each
	// role, before that role's patterns, whatever their priorities (dynsec
	// keys them by topic; the first in priority order wins).
	byType [len(aclTypeNames)]aclList
	// spliceable: byType holds every ACL of the role, so an edit of the
	// role's list maps onto edits of the per-type lists (splice.go).
	spliceable bool
}

// aclList is one type's ACLs of a role, in priority order. Most roles hold
// a handful and are scanned; a long list (the conversation service's gates
// role holds two ACLs per gated agent) also gets an index, so a check costs
// the same whatever the size of the fleet.
type aclList struct {
	acls []ACL
	// exact maps a topic to the first ACL whose filter is that very topic
	// (no wildcard; for the literal subscribe types, every ACL), and wild
	// holds the others, in order. Both are nil for a short list. Entries
	// carry the ACL's rank instead of its position, so that an edit of the
	// list (splice.go) inserts and removes entries without renumbering the
	// rest: ranks[i] is acls[i]'s, strictly increasing, with gaps.
	exact map[string]rankedACL
	wild  []rankedACL
	ranks []uint64
	// dups: two ACLs share a key of exact (possible in a compiled State,
	// never in a validated role); such a list is not spliced.
	dups bool
}

// rankedACL is an indexed ACL with its rank: a lower rank comes first.
type rankedACL struct {
	rank uint64
	acl  ACL
}

// indexFrom is the list length from which an aclList is indexed.
const indexFrom = 16

// rankStep is the gap between the ranks of neighbouring ACLs when a list is
// (re)indexed: an edit inserts between two ranks, and about twenty inserts
// at the same place go before the list is renumbered.
const rankStep = 1 << 20

func newACLList(acls []ACL, literal bool) aclList {
	l := aclList{acls: acls}
	if len(acls) >= indexFrom {
		l.index(literal)
	}
	return l
}

// index (re)builds the list's index with evenly spaced ranks.
func (l *aclList) index(literal bool) {
	l.exact = make(map[string]rankedACL, len(l.acls))
	l.wild, l.dups = nil, false
	l.ranks = slices.Grow(l.ranks[:0], len(l.acls))[:len(l.acls)]
	for i, a := range l.acls {
		e := rankedACL{rank: uint64(i+1) * rankStep, acl: a}
		l.ranks[i] = e.rank
		if !literal && strings.ContainsAny(a.Topic, "+#") {
			l.wild = append(l.wild, e)
			continue
		}
		if _, seen := l.exact[a.Topic]; seen {
			l.dups = true
			continue
		}
		l.exact[a.Topic] = e
	}
}

// first is the first ACL of the list that decides topic: literal lists
// compare topics, the others match filters with matches.
func (l *aclList) first(topic string, literal bool, matches func(filter, topic string) bool) (ACL, bool) {
	if l.exact == nil {
		for _, a := range l.acls {
			if literal && a.Topic == topic || !literal && matches(a.Topic, topic) {
				return a, true
			}
		}
		return ACL{}, false
	}
	hit, found := l.exact[topic]
	if found && !literal && !matches(hit.acl.Topic, topic) {
		found = false // an invalid filter (or topic) never matches
	}
	for _, w := range l.wild {
		if found && w.rank > hit.rank {
			break
		}
		if matches(w.acl.Topic, topic) {
			return w.acl, true
		}
	}
	if found {
		return hit.acl, true
	}
	return ACL{}, false
}

// aclTypeNames indexes rolePolicy.byType (aclTypeOrder gives the index).
var aclTypeNames = [...]ACLType{PublishClientSend, PublishClientReceive, SubscribeLiteral, SubscribePattern, UnsubscribeLiteral, UnsubscribePattern}

func compileRole(r Role) *rolePolicy {
	rp := &rolePolicy{}
	acls := Canonical(r.ACLs) // one allocation; the per-type slices share it
	kept := 0
	for i := 0; i < len(acls); {
		j := i
		for j < len(acls) && acls[j].Type == acls[i].Type {
			j++
		}
		if t, ok := aclTypeOrder[acls[i].Type]; ok {
			list := acls[i:j:j]
			if typ := acls[i].Type; typ == PublishClientSend || typ == PublishClientReceive {
				// A filter that is not valid never matches a topic: checked
				// here once, not at every message.
				invalid := func(a ACL) bool { return !filterValid(a.Topic) }
				if slices.ContainsFunc(list, invalid) {
					list = slices.DeleteFunc(slices.Clone(list), invalid)
				}
			}
			literal := acls[i].Type == SubscribeLiteral || acls[i].Type == UnsubscribeLiteral
			rp.byType[t] = newACLList(list, literal)
			kept += len(list)
		}
		i = j
	}
	// Positions of the role's list are those of the per-type lists only when
	// nothing was left out (an invalid filter, an unknown type).
	rp.spliceable = kept == len(acls)
	return rp
}

// NewPolicy returns an empty policy with the default access DenyByDefault.
func NewPolicy() *Policy {
	return &Policy{defaults: DenyByDefault, roles: map[string]*roleSlot{}, groups: map[string]*groupSlot{}, clients: map[string]*clientSlot{}}
}

// Compile prepares s for Check. Dangling references (a role that does not
// exist) are skipped, as they cannot exist in dynsec.
func Compile(s State) *Policy {
	p := NewPolicy()
	p.Sync(s, Names{Roles: sortedKeys(s.Roles), Groups: sortedKeys(s.Groups), Clients: sortedKeys(s.Clients)})
	return p
}

// Sync makes the policy reflect s for the named objects (an absent name is
// removed) and for the default access. Objects not named are assumed
// unchanged. Cost: the size of the named objects, plus O(roles of a
// changed group) for each changed group.
func (p *Policy) Sync(s State, touched Names) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.defaults = DenyByDefault
	if s.DefaultACL != nil {
		p.defaults = *s.DefaultACL
	}
	for _, name := range touched.Roles {
		slot := p.roleSlot(name)
		if r, ok := s.Roles[name]; ok {
			slot.rp = compileRole(r)
		} else {
			slot.rp = nil
		}
		p.releaseRole(slot)
	}
	for _, name := range touched.Groups {
		g, ok := s.Groups[name]
		slot := p.groupSlot(name)
		slot.exists = ok
		slot.roles = p.mergeRefs(slot.roles, g.Roles)
		p.releaseGroup(slot)
	}
	for _, user := range touched.Clients {
		c, ok := s.Clients[user]
		old := p.clients[user]
		if !ok {
			if old != nil {
				p.dropRefs(old.roles)
				for _, g := range old.groups {
					g.refs--
					p.releaseGroup(g)
				}
				delete(p.clients, user)
			}
			continue
		}
		cs := &clientSlot{}
		if old != nil {
			cs.roles = old.roles
		}
		cs.roles = p.mergeRefs(cs.roles, c.Roles)
		names := append([]string(nil), c.Groups...)
		sort.Strings(names)
		names = slices.Compact(names)
		for _, gn := range names {
			g := p.groupSlot(gn)
			g.refs++
			cs.groups = append(cs.groups, g)
		}
		if old != nil {
			for _, g := range old.groups {
				g.refs--
				p.releaseGroup(g)
			}
		}
		p.clients[user] = cs
	}
}

func (p *Policy) roleSlot(name string) *roleSlot {
	slot := p.roles[name]
	if slot == nil {
		slot = &roleSlot{name: name}
		p.roles[name] = slot
	}
	return slot
}

func (p *Policy) groupSlot(name string) *groupSlot {
	slot := p.groups[name]
	if slot == nil {
		slot = &groupSlot{name: name}
		p.groups[name] = slot
	}
	return slot
}

// releaseRole forgets a slot nobody defines or references.
func (p *Policy) releaseRole(slot *roleSlot) {
	if slot.rp == nil && slot.refs <= 0 {
		delete(p.roles, slot.name)
	}
}

func (p *Policy) releaseGroup(slot *groupSlot) {
	if !slot.exists && slot.refs <= 0 && len(slot.roles) == 0 {
		delete(p.groups, slot.name)
	}
}

func (p *Policy) dropRefs(refs []slotRef) {
	for _, r := range refs {
		r.role.refs--
		p.releaseRole(r.role)
	}
}

// refLess orders role references as dynsec does: priority descending, then
// name ascending.
func refLess(aPrio int, aName string, bPrio int, bName string) int {
	if aPrio != bPrio {
		return bPrio - aPrio
	}
	return strings.Compare(aName, bName)
}

// mergeRefs turns the sorted list old into want's references, sorted by
// priority desc then name asc. When want is already in that order (the
// embedded store and dynsec keep lists sorted) it is one linear merge
// without allocation beyond the result; otherwise the changed references
// are found with a map and only they are sorted. Large shared groups are
// never re-sorted as a whole.
func (p *Policy) mergeRefs(old []slotRef, want []RoleRef) []slotRef {
	if refsSorted(want) {
		return p.mergeSorted(old, want)
	}
	wanted := make(map[string]int, len(want))
	for _, r := range want {
		if _, dup := wanted[r.Name]; !dup {
			wanted[r.Name] = r.Priority
		}
	}
	kept := make([]slotRef, 0, len(want))
	have := make(map[string]bool, len(old))
	for _, r := range old {
		if prio, ok := wanted[r.role.name]; ok && prio == r.priority && !have[r.role.name] {
			kept = append(kept, r)
			have[r.role.name] = true
			continue
		}
		r.role.refs--
		p.releaseRole(r.role)
	}
	var added []RoleRef
	for _, r := range want {
		if have[r.Name] {
			continue
		}
		have[r.Name] = true
		added = append(added, RoleRef{Name: r.Name, Priority: wanted[r.Name]})
	}
	slices.SortFunc(added, func(a, b RoleRef) int { return refLess(a.Priority, a.Name, b.Priority, b.Name) })
	return p.mergeSorted(kept, append(refsOf(kept), added...))
}

func refsOf(in []slotRef) []RoleRef {
	out := make([]RoleRef, len(in))
	for i, r := range in {
		out[i] = RoleRef{Name: r.role.name, Priority: r.priority}
	}
	return out
}

// refsSorted reports whether refs are strictly in dynsec order (no
// duplicates).
func refsSorted(refs []RoleRef) bool {
	for i := 1; i < len(refs); i++ {
		if refLess(refs[i-1].Priority, refs[i-1].Name, refs[i].Priority, refs[i].Name) >= 0 {
			return false
		}
	}
	return true
}

// mergeSorted walks old and want (both sorted, want possibly unsorted only
// in its tail when called from mergeRefs, which is why the tail is sorted
// in place first) and keeps, adds and drops slots in one pass.
func (p *Policy) mergeSorted(old []slotRef, want []RoleRef) []slotRef {
	if !refsSorted(want) {
		want = slices.Clone(want)
		slices.SortFunc(want, func(a, b RoleRef) int { return refLess(a.Priority, a.Name, b.Priority, b.Name) })
	}
	out := make([]slotRef, 0, len(want))
	i, j := 0, 0
	for i < len(old) || j < len(want) {
		var c int
		switch {
		case i == len(old):
			c = 1
		case j == len(want):
			c = -1
		default:
			c = refLess(old[i].priority, old[i].role.name, want[j].Priority, want[j].Name)
		}
		switch {
		case c == 0: // unchanged
			out = append(out, old[i])
			i++
			j++
		case c < 0: // old reference no longer wanted
			old[i].role.refs--
			p.releaseRole(old[i].role)
			i++
		default: // new reference
			slot := p.roleSlot(want[j].Name)
			slot.refs++
			out = append(out, slotRef{priority: want[j].Priority, role: slot})
			j++
		}
	}
	return out
}

// Check decides like dynsec 2.0.11 whether username may perform access on
// topic (a topic name for Publish/Receive, a subscription filter for
// Subscribe/Unsubscribe). An unknown username is denied (dynsec defers and
// the broker then refuses).
func (p *Policy) Check(username string, access Access, topic string) Decision {
	m := p.match(username, access, topic)
	switch m.how {
	case matchUnknownUser:
		return Decision{Reason: fmt.Sprintf("unknown user %q", username)}
	case matchUnknownAccess:
		return Decision{Reason: fmt.Sprintf("unknown access %q", access)}
	case matchACL:
		return Decision{Allow: m.acl.Allow, Reason: fmt.Sprintf("role %q: %s", m.role, m.acl)}
	case matchControl:
		return Decision{Reason: "default access never covers $CONTROL"}
	}
	return Decision{Allow: m.allow, Reason: fmt.Sprintf("default %s access", access)}
}

// Allows is Check without the explanation: no allocation, for the broker's
// per-message path.
func (p *Policy) Allows(username string, access Access, topic string) bool {
	return p.match(username, access, topic).allow
}

type matchKind int

const (
	matchDefault matchKind = iota
	matchACL
	matchControl
	matchUnknownUser
	matchUnknownAccess
)

type matchResult struct {
	how   matchKind
	allow bool
	acl   ACL
	role  string
}

func (p *Policy) match(username string, access Access, topic string) matchResult {
	p.mu.RLock()
	defer p.mu.RUnlock()
	cs, ok := p.clients[username]
	if !ok {
		return matchResult{how: matchUnknownUser}
	}
	for _, ref := range cs.roles {
		if rp := ref.role.rp; rp != nil {
			if a, ok := rp.check(access, topic); ok {
				return matchResult{how: matchACL, allow: a.Allow, acl: a, role: ref.role.name}
			}
		}
	}
	for _, g := range cs.groups {
		if !g.exists {
			continue
		}
		for _, ref := range g.roles {
			if rp := ref.role.rp; rp != nil {
				if a, ok := rp.check(access, topic); ok {
					return matchResult{how: matchACL, allow: a.Allow, acl: a, role: ref.role.name}
				}
			}
		}
	}
	var def bool
	switch access {
	case Publish:
		def = p.defaults.PublishClientSend
	case Receive:
		def = p.defaults.PublishClientReceive
	case Subscribe:
		def = p.defaults.Subscribe
	case Unsubscribe:
		def = p.defaults.Unsubscribe
	default:
		return matchResult{how: matchUnknownAccess}
	}
	// dynsec never grants $CONTROL topics by fall-through.
	if def && strings.HasPrefix(topic, "$CONTROL") {
		return matchResult{how: matchControl}
	}
	return matchResult{allow: def}
}

// check returns the first ACL of the role that matches, if any.
func (rp *rolePolicy) check(access Access, topic string) (ACL, bool) {
	switch access {
	case Publish, Receive:
		t := PublishClientSend
		if access == Receive {
			t = PublishClientReceive
		}
		if !topicValid(topic) {
			return ACL{}, false
		}
		return rp.byType[aclTypeOrder[t]].first(topic, false, validMatches)
	case Subscribe, Unsubscribe:
		lit, pat := SubscribeLiteral, SubscribePattern
		if access == Unsubscribe {
			lit, pat = UnsubscribeLiteral, UnsubscribePattern
		}
		if a, ok := rp.byType[aclTypeOrder[lit]].first(topic, true, nil); ok {
			return a, true
		}
		return rp.byType[aclTypeOrder[pat]].first(topic, false, SubscriptionCovered)
	}
	return ACL{}, false
}

// Check compiles s and decides one access; use Compile for repeated checks.
func (s State) Check(username string, access Access, topic string) Decision {
	return Compile(s).Check(username, access, topic)
}
