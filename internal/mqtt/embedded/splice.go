package embedded

import (
	"slices"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// ruleKey is what dynsec keys a role's rules by: no two rules of a role share one.
type ruleKey struct {
	typ   acl.ACLType
	topic string
}

// spliceRole runs a modifyRole whose list is given as an edit of the role's (acl.RoleSplice)
// in the time of the edit: the inserted rules are validated against the role's key set, the
// list is edited in place and the policy will be too (syncPolicy). It reports false, having
// changed nothing, when the edit is not one it applies this way (the role is missing, the edit
// does not fit it, or the new list would not be in canonical order): the whole-list modifyRole
// then runs, with the same replies.
func (s *Store) spliceRole(name string, sp acl.RoleSplice, t *touchSet) (reply, bool) {
	r, ok := s.state.Roles[name]
	if !ok || !sp.Fits(len(r.ACLs)) || !sp.KeepsCanonical(r.ACLs) {
		return reply{}, false
	}
	set := s.roleKeys[name]
	if set == nil {
		set = make(map[ruleKey]struct{}, len(r.ACLs)+len(sp.Insert))
		for _, a := range r.ACLs {
			set[ruleKey{a.Type, a.Topic}] = struct{}{}
		}
		if len(set) != len(r.ACLs) {
			return reply{}, false // two rules on one key (an imported table): the whole list decides
		}
		s.roleKeys[name] = set
	}
	from, to := sp.Removed()
	removed := make(map[ruleKey]struct{}, to-from)
	for _, a := range r.ACLs[from:to] {
		removed[ruleKey{a.Type, a.Topic}] = struct{}{}
	}
	inserted := make(map[ruleKey]struct{}, len(sp.Insert))
	for _, a := range sp.Insert {
		// The checks of acl.Role.Validate, on the new rules only: the kept ones passed them.
		k := ruleKey{a.Type, a.Topic}
		_, kept := set[k]
		if _, gone := removed[k]; gone {
			kept = false
		}
		_, twice := inserted[k]
		if !a.Type.Valid() || acl.ValidateFilter(a.Topic) != nil || kept || twice {
			return refused("Invalid ACL topic", kickSet{}), true
		}
		inserted[k] = struct{}{}
	}
	for k := range removed {
		delete(set, k)
	}
	for k := range inserted {
		set[k] = struct{}{}
	}
	// In place: readers copy the state under the store's lock (Observe, ExportTable, the
	// snapshot), and the policy holds its own lists.
	r.ACLs = slices.Replace(r.ACLs, from, to, sp.Insert...)
	s.state.Roles[name] = r
	t.splice(name, sp)
	return done(kickSet{}), true
}
