package acl

import (
	"fmt"
	"sort"
	"strings"
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

// Policy is a State compiled for fast, repeated checks (the embedded broker
// runs one per PUBLISH). Build it with Compile; it is immutable.
type Policy struct {
	clients  map[string]*clientPolicy
	defaults DefaultACLAccess
}

type clientPolicy struct {
	// roles in evaluation order: the client's own roles (priority desc,
	// name asc), then each group (membership priority desc, name asc) with
	// its roles in the same order. dynsec checks all of the client's own
	// roles before any group role, whatever the numbers.
	roles []*rolePolicy
}

type rolePolicy struct {
	name string
	// per type, in priority order (equal priorities keep given order)
	byType map[ACLType][]ACL
	// literal subscribe/unsubscribe ACLs by topic: dynsec looks these up
	// first in each role, before that role's patterns, whatever their
	// priorities
	literal map[ACLType]map[string]ACL
}

// Compile prepares s for Check. Dangling references (a role that does not
// exist) are skipped, as they cannot exist in dynsec.
func Compile(s State) *Policy {
	p := &Policy{clients: make(map[string]*clientPolicy, len(s.Clients)), defaults: DenyByDefault}
	if s.DefaultACL != nil {
		p.defaults = *s.DefaultACL
	}
	roles := make(map[string]*rolePolicy, len(s.Roles))
	for name, r := range s.Roles {
		rp := &rolePolicy{name: name, byType: map[ACLType][]ACL{}, literal: map[ACLType]map[string]ACL{}}
		for _, a := range Canonical(r.ACLs) {
			if a.Type == SubscribeLiteral || a.Type == UnsubscribeLiteral {
				if rp.literal[a.Type] == nil {
					rp.literal[a.Type] = map[string]ACL{}
				}
				if _, dup := rp.literal[a.Type][a.Topic]; !dup {
					rp.literal[a.Type][a.Topic] = a
				}
				continue
			}
			rp.byType[a.Type] = append(rp.byType[a.Type], a)
		}
		roles[name] = rp
	}
	add := func(cp *clientPolicy, refs []RoleRef) {
		for _, ref := range sortedRefs(refs) {
			if rp, ok := roles[ref.Name]; ok {
				cp.roles = append(cp.roles, rp)
			}
		}
	}
	for user, c := range s.Clients {
		cp := &clientPolicy{}
		add(cp, c.Roles)
		// Membership priorities are all GroupMembershipPriority, so groups
		// are checked in name order (dynsec's tie-break).
		groups := append([]string(nil), c.Groups...)
		sort.Strings(groups)
		for _, gn := range groups {
			if g, ok := s.Groups[gn]; ok {
				add(cp, g.Roles)
			}
		}
		p.clients[user] = cp
	}
	return p
}

// Check decides like dynsec 2.0.11 whether username may perform access on
// topic (a topic name for Publish/Receive, a subscription filter for
// Subscribe/Unsubscribe). An unknown username is denied (dynsec defers and
// the broker then refuses).
func (p *Policy) Check(username string, access Access, topic string) Decision {
	cp, ok := p.clients[username]
	if !ok {
		return Decision{Reason: fmt.Sprintf("unknown user %q", username)}
	}
	for _, rp := range cp.roles {
		if d, ok := rp.check(access, topic); ok {
			return d
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
		return Decision{Reason: fmt.Sprintf("unknown access %q", access)}
	}
	// dynsec never grants $CONTROL topics by fall-through.
	if def && strings.HasPrefix(topic, "$CONTROL") {
		return Decision{Reason: "default access never covers $CONTROL"}
	}
	return Decision{Allow: def, Reason: fmt.Sprintf("default %s access", access)}
}

func (rp *rolePolicy) check(access Access, topic string) (Decision, bool) {
	decide := func(a ACL) (Decision, bool) {
		return Decision{Allow: a.Allow, Reason: fmt.Sprintf("role %q: %s", rp.name, a)}, true
	}
	switch access {
	case Publish, Receive:
		t := PublishClientSend
		if access == Receive {
			t = PublishClientReceive
		}
		for _, a := range rp.byType[t] {
			if TopicMatches(a.Topic, topic) {
				return decide(a)
			}
		}
	case Subscribe, Unsubscribe:
		lit, pat := SubscribeLiteral, SubscribePattern
		if access == Unsubscribe {
			lit, pat = UnsubscribeLiteral, UnsubscribePattern
		}
		if a, ok := rp.literal[lit][topic]; ok {
			return decide(a)
		}
		for _, a := range rp.byType[pat] {
			if SubscriptionCovered(a.Topic, topic) {
				return decide(a)
			}
		}
	}
	return Decision{}, false
}

// Check compiles s and decides one access; use Compile for repeated checks.
func (s State) Check(username string, access Access, topic string) Decision {
	return Compile(s).Check(username, access, topic)
}
