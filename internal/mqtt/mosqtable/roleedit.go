package mosqtable

import (
	"fmt"
	"slices"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
)

// A shared role (a unit's or an org's, internal/registration) holds one rule per member of its
// scope and is changed by modifyRole carrying the full list (the one role command that kicks
// nobody): at 10 000 Agents an org's role is thousands of rules, and a new member would send
// and decode all of them (hundreds of KiB of JSON) for one rule more. The operator's mirror
// holds the role the plugin holds, so the wire carries the list as an edit of it instead: the
// rules kept at the start and at the end, and the ones between. The plugin rebuilds the same
// full list and runs the same modifyRole, so the decisions and the kicks are those of the
// command; it refuses every edit of a request made against another generation of its table
// (ErrStaleEdit, nothing applied), and the operator sends the lists whole again.

// RoleEdit is the ACL list of the modifyRole at Request.Commands[Command], as an edit of the
// role's current list: its first Keep rules, then Insert, then its last KeepEnd rules. Had is
// the current list's length.
type RoleEdit struct {
	Command int       `json:"command"`
	Had     int       `json:"had"`
	Keep    int       `json:"keep"`
	KeepEnd int       `json:"keepEnd"`
	Insert  []acl.ACL `json:"insert,omitempty"`
}

// ErrStaleEdit is the plugin's refusal of a request whose role edits were made against another
// generation of its table (or another content of the role): nothing of it was applied.
const ErrStaleEdit = "role edits against another generation of the table"

// minEditRules is the smallest list sent as an edit: below it the whole list is as short.
const minEditRules = 16

// roleEdits returns cmds with each large modifyRole's list replaced by an edit of the role in
// current (nil ACLs on the wire), and the edits; edits is nil when none pays off. A role that
// an earlier command of the batch touches is sent whole (the edit is of the batch's start).
func roleEdits(current *embedded.Store, cmds []acl.Command) ([]acl.Command, []RoleEdit) {
	var edits []RoleEdit
	var wire []acl.Command
	touched := map[string]bool{}
	for i, c := range cmds {
		if c.Op == acl.OpModifyRole && len(c.ACLs) >= minEditRules && !touched[c.Role] {
			if e, ok := editOf(current, c); ok {
				if wire == nil {
					wire = append([]acl.Command(nil), cmds...)
				}
				e.Command = i
				wire[i].ACLs = nil
				edits = append(edits, e)
			}
		}
		if c.Role != "" {
			touched[c.Role] = true
		}
	}
	if edits == nil {
		return cmds, nil
	}
	return wire, edits
}

// editOf is c's list as an edit of the role in current, when that is at most half as long.
func editOf(current *embedded.Store, c acl.Command) (RoleEdit, bool) {
	sp, ok := current.RoleEditTo(c.Role, c.ACLs)
	return roleEditOf(sp), ok
}

// roleEditOf is sp as the wire's and the disk's record.
func roleEditOf(sp acl.RoleSplice) RoleEdit {
	return RoleEdit{Had: sp.Had, Keep: sp.Keep, KeepEnd: sp.KeepEnd, Insert: sp.Insert}
}

// applyEdits turns req's edits into splices of its modifyRoles (acl.Command.Splice), which the
// store applies in the time of the edit, checked against the table in store, which must be at
// generation gen and hold each edited role with the length the edit was made for; an error
// leaves the request unapplied. A role named by an earlier command of the request is never sent
// as an edit (roleEdits): such an edit is refused too, so that every edit applies to the list it
// was made against.
func applyEdits(store *embedded.Store, req *Request, gen uint64) error {
	if len(req.Edits) == 0 {
		return nil
	}
	if req.Base != gen {
		return fmt.Errorf("edits made at generation %d, the table is at %d", req.Base, gen)
	}
	cmds := append([]acl.Command(nil), req.Commands...)
	for _, e := range req.Edits {
		if e.Command < 0 || e.Command >= len(cmds) || cmds[e.Command].Op != acl.OpModifyRole || cmds[e.Command].ACLs != nil || cmds[e.Command].Splice != nil {
			return fmt.Errorf("edit of command %d: not a modifyRole without rules", e.Command)
		}
		c := &cmds[e.Command]
		if slices.ContainsFunc(cmds[:e.Command], func(o acl.Command) bool { return o.Role == c.Role }) {
			return fmt.Errorf("edit of role %q: an earlier command of the request names it", c.Role)
		}
		sp := acl.RoleSplice{Had: e.Had, Keep: e.Keep, KeepEnd: e.KeepEnd, Insert: e.Insert}
		if n, ok := store.RoleLen(c.Role); !ok || !sp.Fits(n) {
			return fmt.Errorf("edit of role %q: it has %d rules, the edit was made for %d", c.Role, n, e.Had)
		}
		c.Splice = &sp
	}
	req.Commands = cmds
	return nil
}
