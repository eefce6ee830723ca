package acl

import (
	"slices"
	"sort"
)

// RoleSplice is a role's new ACL list given as an edit of its current one
// (in canonical order): the current list's first Keep rules, then Insert,
// then its last KeepEnd rules; Had is the current list's length. A shared
// role (one rule per member of a unit or an org) changes by a rule or two
// at a time, and applying the edit costs what the edit holds, where the
// whole list costs what the role holds (validation, canonical order and the
// compiled index of thousands of rules).
type RoleSplice struct {
	Had     int   `json:"had"`
	Keep    int   `json:"keep"`
	KeepEnd int   `json:"keepEnd"`
	Insert  []ACL `json:"insert,omitempty"`
}

// SpliceOf is want as an edit of had: the rules both lists start with and end with are kept,
// the ones between are inserted (a copy). pays reports whether the insert is at most half of
// want: a larger edit is as long as the whole list, which is then sent or stored instead.
func SpliceOf(had, want []ACL) (sp RoleSplice, pays bool) {
	keep := 0
	for keep < len(had) && keep < len(want) && had[keep] == want[keep] {
		keep++
	}
	end := 0
	for end < len(had)-keep && end < len(want)-keep && had[len(had)-1-end] == want[len(want)-1-end] {
		end++
	}
	insert := want[keep : len(want)-end]
	return RoleSplice{Had: len(had), Keep: keep, KeepEnd: end, Insert: slices.Clone(insert)}, len(insert) <= keep+end
}

// Fits reports whether sp is an edit of a list of n rules.
func (sp RoleSplice) Fits(n int) bool {
	return sp.Had == n && sp.Keep >= 0 && sp.KeepEnd >= 0 && sp.Keep+sp.KeepEnd <= sp.Had
}

// Removed is the range of the current list the edit replaces by Insert.
func (sp RoleSplice) Removed() (from, to int) { return sp.Keep, sp.Had - sp.KeepEnd }

// Apply returns the new list (a new slice; current is not changed).
func (sp RoleSplice) Apply(current []ACL) []ACL {
	from, to := sp.Removed()
	out := make([]ACL, 0, from+len(sp.Insert)+len(current)-to)
	out = append(out, current[:from]...)
	out = append(out, sp.Insert...)
	return append(out, current[to:]...)
}

// KeepsCanonical reports whether the new list is in canonical order, given
// that current (which sp must fit) is: only the rules next to or inside the
// edit are compared. A list that is not would be reordered by Canonical,
// so its edit is applied as the whole list instead.
func (sp RoleSplice) KeepsCanonical(current []ACL) bool {
	from, to := sp.Removed()
	prev, hasPrev := ACL{}, from > 0
	if hasPrev {
		prev = current[from-1]
	}
	for _, a := range sp.Insert {
		if hasPrev && canonicalLess(a, prev) {
			return false
		}
		prev, hasPrev = a, true
	}
	return !hasPrev || to == len(current) || !canonicalLess(current[to], prev)
}

// SpliceRole applies sp to the compiled role name, in place and in the time
// of the edit: the per-type lists and their indexes are edited, never
// rebuilt (but when an edit makes a list long enough to be indexed, or its
// ranks run out). It reports false, and changes nothing, when it cannot:
// the role is not compiled, sp does not fit it, the new list would not be
// canonical, would hold a filter compileRole leaves out, or two rules with
// the same index key; the caller then compiles the role from its whole list
// (Sync). Checks running meanwhile see the role before or after the edit.
func (p *Policy) SpliceRole(name string, sp RoleSplice) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	slot := p.roles[name]
	if slot == nil || slot.rp == nil || !slot.rp.spliceable {
		return false
	}
	plans, ok := slot.rp.plan(sp)
	if !ok {
		return false
	}
	for t, pl := range plans {
		typ := aclTypeNames[t]
		slot.rp.byType[t].splice(pl, typ == SubscribeLiteral || typ == UnsubscribeLiteral)
	}
	return true
}

// listSplice is a role edit's part in one per-type list: keep its first
// keep rules and last keepEnd ones, with insert between.
type listSplice struct {
	keep, keepEnd int
	insert        []ACL
}

// plan maps sp onto the per-type lists (canonical order groups the role's
// list by type, in aclTypeNames order) and checks each part; nothing is
// changed.
func (rp *rolePolicy) plan(sp RoleSplice) ([len(aclTypeNames)]listSplice, bool) {
	var plans [len(aclTypeNames)]listSplice
	total := 0
	for t := range rp.byType {
		total += len(rp.byType[t].acls)
	}
	if !sp.Fits(total) {
		return plans, false
	}
	from, to := sp.Removed()
	ins := sp.Insert
	off := 0
	for t := range rp.byType {
		l := &rp.byType[t]
		n := len(l.acls)
		pl := listSplice{keep: min(max(from-off, 0), n), keepEnd: min(max(off+n-to, 0), n)}
		k := 0
		for k < len(ins) && ins[k].Type == aclTypeNames[t] {
			k++
		}
		pl.insert, ins = ins[:k], ins[k:]
		if k > 0 && (from > off+n || to < off) {
			return plans, false // inserted among the rules of another type
		}
		off += n
		if !l.fits(pl, aclTypeNames[t]) {
			return plans, false
		}
		plans[t] = pl
	}
	// An inserted rule of an unknown type, or out of type order, is left.
	return plans, len(ins) == 0
}

// fits checks that pl keeps the list in priority order, adds no filter
// compileRole would leave out, and no second rule under a key of the index.
func (l *aclList) fits(pl listSplice, typ ACLType) bool {
	if l.dups {
		return false
	}
	from, to := pl.keep, len(l.acls)-pl.keepEnd
	prio, hasPrev := 0, from > 0
	if hasPrev {
		prio = l.acls[from-1].Priority
	}
	for _, a := range pl.insert {
		if hasPrev && a.Priority > prio || (typ == PublishClientSend || typ == PublishClientReceive) && !filterValid(a.Topic) {
			return false
		}
		prio, hasPrev = a.Priority, true
	}
	if hasPrev && to < len(l.acls) && l.acls[to].Priority > prio {
		return false
	}
	literal := typ == SubscribeLiteral || typ == UnsubscribeLiteral
	if len(l.acls)-(to-from)+len(pl.insert) < indexFrom || l.exact == nil {
		return true // a short list is scanned (or indexed anew): duplicates are resolved by order
	}
	var fresh map[string]bool
	if len(pl.insert) > 1 {
		fresh = make(map[string]bool, len(pl.insert))
	}
	for _, a := range pl.insert {
		if !literal && isWild(a.Topic) {
			continue
		}
		if e, ok := l.exact[a.Topic]; ok && !(from < to && e.rank >= l.ranks[from] && e.rank <= l.ranks[to-1]) {
			return false // a rule with this key stays
		}
		if fresh != nil {
			if fresh[a.Topic] {
				return false
			}
			fresh[a.Topic] = true
		}
	}
	return true
}

func isWild(topic string) bool {
	for i := 0; i < len(topic); i++ {
		if topic[i] == '+' || topic[i] == '#' {
			return true
		}
	}
	return false
}

// splice applies pl (checked by fits) to the list and its index.
func (l *aclList) splice(pl listSplice, literal bool) {
	from, to := pl.keep, len(l.acls)-pl.keepEnd
	if from == to && len(pl.insert) == 0 {
		return
	}
	n := len(l.acls) - (to - from) + len(pl.insert)
	if n < indexFrom || l.exact == nil {
		l.acls = slices.Replace(l.acls, from, to, pl.insert...)
		l.exact, l.wild, l.ranks, l.dups = nil, nil, nil, false
		if n >= indexFrom {
			l.index(literal)
		}
		return
	}
	for i := from; i < to; i++ {
		if a := l.acls[i]; !literal && isWild(a.Topic) {
			w, _ := slices.BinarySearchFunc(l.wild, l.ranks[i], func(e rankedACL, r uint64) int { return cmpRank(e.rank, r) })
			l.wild = slices.Delete(l.wild, w, w+1)
		} else {
			delete(l.exact, a.Topic)
		}
	}
	ranks, ok := l.ranksBetween(from, to, len(pl.insert))
	l.acls = slices.Replace(l.acls, from, to, pl.insert...)
	if !ok {
		l.index(literal) // the gap is used up: renumber the whole list
		return
	}
	l.ranks = slices.Replace(l.ranks, from, to, ranks...)
	for i, a := range pl.insert {
		e := rankedACL{rank: ranks[i], acl: a}
		if !literal && isWild(a.Topic) {
			w := sort.Search(len(l.wild), func(j int) bool { return l.wild[j].rank > e.rank })
			l.wild = slices.Insert(l.wild, w, e)
			continue
		}
		l.exact[a.Topic] = e
	}
}

// ranksBetween returns m ranks, increasing, between those of the rules
// before from and at to (the ones the edit keeps around it); false when the
// gap is too small.
func (l *aclList) ranksBetween(from, to, m int) ([]uint64, bool) {
	if m == 0 {
		return nil, true
	}
	var lo uint64
	if from > 0 {
		lo = l.ranks[from-1]
	}
	step := uint64(rankStep)
	if to < len(l.ranks) {
		step = (l.ranks[to] - lo) / uint64(m+1)
	} else if lo > ^uint64(0)-uint64(m+1)*rankStep {
		return nil, false
	}
	if step == 0 {
		return nil, false
	}
	out := make([]uint64, m)
	for i := range out {
		out[i] = lo + uint64(i+1)*step
	}
	return out, true
}

func cmpRank(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
