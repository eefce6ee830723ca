package acl

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// spliceWorld is one random sequence's vocabulary: long lists of few types
// (so that they are indexed), literal and wildcard filters, and a few
// priorities (so that edits land between equal and different ones).
type spliceWorld struct {
	rng    *rand.Rand
	types  []ACLType
	topics []string // checked topics and subscription filters
}

// spliceTopics is how many numbered topics the rules name.
const spliceTopics = 40

func newSpliceWorld(seed uint64) *spliceWorld {
	w := &spliceWorld{rng: rand.New(rand.NewPCG(seed, 7)),
		types: []ACLType{PublishClientSend, SubscribePattern, SubscribeLiteral, PublishClientReceive, UnsubscribePattern}}
	for i := range spliceTopics {
		w.topics = append(w.topics, fmt.Sprintf("t/%d", i), fmt.Sprintf("t/%d/x", i))
	}
	w.topics = append(w.topics, "t/+", "t/#", "#", "t/+/x", "u", "$CONTROL/x")
	return w
}

func (w *spliceWorld) filter() string {
	switch w.rng.IntN(8) {
	case 0:
		return []string{"t/+", "t/#", "#", "t/+/x", "t/+/+"}[w.rng.IntN(5)]
	case 1:
		return fmt.Sprintf("t/%d/+", w.rng.IntN(spliceTopics))
	case 2:
		return fmt.Sprintf("t/%d/x", w.rng.IntN(spliceTopics))
	}
	return fmt.Sprintf("t/%d", w.rng.IntN(spliceTopics))
}

func (w *spliceWorld) acl() ACL {
	typ := w.types[w.rng.IntN(2)] // most rules of two types: long lists
	if w.rng.IntN(4) == 0 {
		typ = w.types[w.rng.IntN(len(w.types))]
	}
	return ACL{Type: typ, Topic: w.filter(), Priority: w.rng.IntN(3) - 1, Allow: w.rng.IntN(2) == 0}
}

// edited is current with a random range replaced by random rules, in
// canonical order, without two rules of a type on a topic (a validated
// role) unless dups.
func (w *spliceWorld) edited(current []ACL, dups bool) []ACL {
	from := w.rng.IntN(len(current) + 1)
	to := from + w.rng.IntN(min(len(current)-from, 3)+1)
	var ins []ACL
	for range w.rng.IntN(5) {
		ins = append(ins, w.acl())
	}
	out := Canonical(slices.Concat(current[:from], ins, current[to:]))
	if dups {
		return out
	}
	seen := map[[2]string]bool{}
	return slices.DeleteFunc(out, func(a ACL) bool {
		k := [2]string{string(a.Type), a.Topic}
		dup := seen[k]
		seen[k] = true
		return dup
	})
}

// policyFor is a policy with role r held by a client directly and by one
// through a group, under a second role the first one outranks.
func stateFor(r Role) State {
	other := Role{Name: "other", ACLs: []ACL{{Type: PublishClientSend, Topic: "t/#", Allow: true}, {Type: SubscribePattern, Topic: "#", Allow: true}}}
	return NewState([]Role{r, other}, []Group{{Name: "g", Roles: []RoleRef{{Name: r.Name, Priority: 1}, {Name: "other"}}}},
		[]Client{{Username: "direct", Roles: []RoleRef{{Name: r.Name}}}, {Username: "member", Groups: []string{"g"}}})
}

// sameDecisions compares every decision of got and want.
func sameDecisions(t *testing.T, w *spliceWorld, got, want *Policy, what string) {
	t.Helper()
	for _, user := range []string{"direct", "member"} {
		for _, access := range []Access{Publish, Receive, Subscribe, Unsubscribe} {
			for _, topic := range w.topics {
				if g, x := got.Check(user, access, topic), want.Check(user, access, topic); g != x {
					t.Fatalf("%s: %s %s %q: the spliced policy says %v, compiled from scratch %v", what, user, access, topic, g, x)
				}
			}
		}
	}
}

// A role edited again and again in place (Policy.SpliceRole) decides every
// check exactly as the same role compiled from its whole list: edits in
// the middle, at the ends, across types and priorities, lists growing past
// the index threshold and shrinking below it, ranks running out. An edit
// it refuses changes nothing.
func TestSpliceRoleMatchesCompile(t *testing.T) {
	var applied, refused, indexed int
	for seed := range uint64(100) {
		w := newSpliceWorld(seed)
		role := Role{Name: "shared"}
		for range 30 + w.rng.IntN(80) {
			role.ACLs = append(role.ACLs, w.acl())
		}
		role.ACLs = w.edited(Canonical(role.ACLs), false)
		p := Compile(stateFor(role))
		for step := range 40 {
			var want []ACL
			var sp RoleSplice
			switch w.rng.IntN(10) {
			case 0: // an edit that breaks the canonical order (the store sends it whole)
				sp = RoleSplice{Had: len(role.ACLs), Keep: w.rng.IntN(len(role.ACLs) + 1)}
				sp.Insert = []ACL{w.acl(), w.acl()}
				sp.Insert[0].Priority, sp.Insert[1].Priority = -5, 5
				want = sp.Apply(role.ACLs)
			case 1: // may hold two rules of a type on a topic
				want = w.edited(role.ACLs, true)
				sp, _ = SpliceOf(role.ACLs, want)
			default:
				want = w.edited(role.ACLs, false)
				sp, _ = SpliceOf(role.ACLs, want)
			}
			what := fmt.Sprintf("seed %d step %d: %d rules, edit %+v", seed, step, len(role.ACLs), sp)
			if !p.SpliceRole(role.Name, sp) {
				refused++
				sameDecisions(t, w, p, Compile(stateFor(role)), what+" (refused)")
				role.ACLs = Canonical(want)
				p.Sync(stateFor(role), Names{Roles: []string{role.Name}})
				continue
			}
			if !slices.Equal(Canonical(want), want) {
				t.Fatalf("%s: a splice that breaks the canonical order was applied", what)
			}
			applied++
			role.ACLs = want
			if slices.ContainsFunc(p.roles[role.Name].rp.byType[:], func(l aclList) bool { return l.exact != nil }) {
				indexed++
			}
			sameDecisions(t, w, p, Compile(stateFor(role)), what)
		}
	}
	t.Logf("%d edits applied in place (%d of a role with an indexed list), %d refused", applied, indexed, refused)
	if applied < 5*refused || 3*indexed < applied {
		t.Fatalf("too few in-place edits of indexed lists: %d applied, %d of them with an index, %d refused", applied, indexed, refused)
	}
}

// Inserting again and again at one place uses up the gap between two
// ranks; the list is renumbered and keeps deciding as compiled.
func TestSpliceRoleRenumbers(t *testing.T) {
	w := newSpliceWorld(1)
	role := Role{Name: "shared"}
	for i := range 20 {
		role.ACLs = append(role.ACLs, ACL{Type: PublishClientSend, Topic: fmt.Sprintf("t/%d", i), Allow: true})
	}
	p := Compile(stateFor(role))
	for i := range 100 {
		a := ACL{Type: PublishClientSend, Topic: fmt.Sprintf("t/%d/x", i%12), Allow: i%2 == 0}
		if i >= 12 {
			a.Topic = fmt.Sprintf("t/%d/+", i)
		}
		sp := RoleSplice{Had: len(role.ACLs), Keep: 1, KeepEnd: len(role.ACLs) - 1, Insert: []ACL{a}}
		if !p.SpliceRole(role.Name, sp) {
			t.Fatalf("insert %d refused", i)
		}
		role.ACLs = sp.Apply(role.ACLs)
		sameDecisions(t, w, p, Compile(stateFor(role)), fmt.Sprintf("insert %d", i))
	}
}

// The edit of a list that is canonical keeps it canonical exactly when
// Canonical would leave the new list as it is.
func TestKeepsCanonical(t *testing.T) {
	w := newSpliceWorld(3)
	for range 2000 {
		var cur []ACL
		for range w.rng.IntN(8) {
			cur = append(cur, w.acl())
		}
		cur = Canonical(cur)
		sp := RoleSplice{Had: len(cur), Keep: w.rng.IntN(len(cur) + 1)}
		sp.KeepEnd = w.rng.IntN(len(cur) - sp.Keep + 1)
		for range w.rng.IntN(3) {
			sp.Insert = append(sp.Insert, w.acl())
		}
		next := sp.Apply(cur)
		if got, want := sp.KeepsCanonical(cur), slices.Equal(Canonical(next), next); got != want {
			t.Fatalf("%v edited by %+v: KeepsCanonical %v, Canonical leaves it as it is: %v", cur, sp, got, want)
		}
	}
}
