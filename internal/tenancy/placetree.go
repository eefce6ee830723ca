package tenancy

import (
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// agentPlace is what the order of an Agent within its namespace depends on (all immutable).
type agentPlace struct {
	created time.Time
	name    string
	uid     types.UID
}

// comparePlace orders places of one namespace as AgentPrecedes orders their Agents: by creation
// time, then name.
func comparePlace(a *agentPlace, created time.Time, name string) int {
	if !a.created.Equal(created) {
		return a.created.Compare(created)
	}
	return strings.Compare(a.name, name)
}

// placeTree is one namespace's Agents in AgentPrecedes order: a treap (a binary search tree kept
// balanced by random priorities) whose nodes know the size of their subtree, so that inserting,
// removing and counting the places before a key are O(log n) whatever the place (a deletion of
// the oldest Agent moves nothing).
type placeTree struct {
	root *placeNode
}

type placeNode struct {
	place       agentPlace
	priority    uint64
	size        int
	left, right *placeNode
}

func (n *placeNode) count() int {
	if n == nil {
		return 0
	}
	return n.size
}

func (n *placeNode) resize() *placeNode {
	n.size = 1 + n.left.count() + n.right.count()
	return n
}

// split cuts n into the places that before reports true for (a prefix: before is monotone in the
// order) and the rest.
func split(n *placeNode, before func(*agentPlace) bool) (*placeNode, *placeNode) {
	if n == nil {
		return nil, nil
	}
	if before(&n.place) {
		l, r := split(n.right, before)
		n.right = l
		return n.resize(), r
	}
	l, r := split(n.left, before)
	n.left = r
	return l, n.resize()
}

// merge joins a and b, every place of a before every place of b.
func merge(a, b *placeNode) *placeNode {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.priority > b.priority:
		a.right = merge(a.right, b)
		return a.resize()
	default:
		b.left = merge(a, b.left)
		return b.resize()
	}
}

func (t *placeTree) len() int { return t.root.count() }

// countBefore is how many places before reports true for (a prefix of the order).
func (t *placeTree) countBefore(before func(*agentPlace) bool) int {
	total := 0
	for n := t.root; n != nil; {
		if before(&n.place) {
			total += n.left.count() + 1
			n = n.right
		} else {
			n = n.left
		}
	}
	return total
}

// find is the place with created and name and its index in the order (nil: none).
func (t *placeTree) find(created time.Time, name string) (*agentPlace, int) {
	index := 0
	for n := t.root; n != nil; {
		switch c := comparePlace(&n.place, created, name); {
		case c == 0:
			return &n.place, index + n.left.count()
		case c < 0:
			index += n.left.count() + 1
			n = n.right
		default:
			n = n.left
		}
	}
	return nil, 0
}

// put adds p, or replaces the place with its creation time and name.
func (t *placeTree) put(p agentPlace, priority uint64) {
	if q, _ := t.find(p.created, p.name); q != nil {
		*q = p
		return
	}
	l, r := split(t.root, func(q *agentPlace) bool { return comparePlace(q, p.created, p.name) < 0 })
	t.root = merge(merge(l, &placeNode{place: p, priority: priority, size: 1}), r)
}

// remove removes the place with created and name if it is uid's.
func (t *placeTree) remove(created time.Time, name string, uid types.UID) {
	if q, _ := t.find(created, name); q == nil || q.uid != uid {
		return
	}
	l, rest := split(t.root, func(q *agentPlace) bool { return comparePlace(q, created, name) < 0 })
	_, r := split(rest, func(q *agentPlace) bool { return comparePlace(q, created, name) <= 0 })
	t.root = merge(l, r)
}
