package acl

import (
	"context"
	"slices"
)

// Kick is what one command disconnected: dynsec ends every session of the
// usernames its "enforce any changes" rules name (Command.Kicks), and the
// embedded broker does the same.
type Kick struct {
	Command Command
	// Usernames whose sessions the command ended, sorted. On Mosquitto these
	// are the usernames the plugin's rules name (whether one of them was
	// connected at that moment only the broker knows); on the embedded broker
	// only usernames with a live connection are listed.
	Usernames []string
	// ClientIDs are the live connections closed, when the broker can say
	// (embedded broker); nil otherwise.
	ClientIDs []string
}

// Others returns the usernames of k other than subject: the collateral
// disconnects of a change made for subject (e.g. one Agent's broker user).
func (k Kick) Others(subject string) []string {
	return slices.DeleteFunc(slices.Clone(k.Usernames), func(u string) bool { return u == subject })
}

// Trace observes the side effects of the backend calls made with a context
// (see WithTrace), like net/http/httptrace: a reconcile can attribute the
// disconnects of the commands it sent to itself.
type Trace struct {
	// Kicked is called once per executed command that disconnected at least
	// one username, after the command ran. It must not block.
	Kicked func(Kick)
}

type traceKey struct{}

// WithTrace returns a context whose backend calls report to t.
func WithTrace(ctx context.Context, t *Trace) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// ReportKick tells the context's Trace (if any) about k; backends call it.
func ReportKick(ctx context.Context, k Kick) {
	if t, _ := ctx.Value(traceKey{}).(*Trace); t != nil && t.Kicked != nil {
		t.Kicked(k)
	}
}

// KickTargets returns who a command disconnects according to dynsec
// 2.0.11's rules, given the broker state just before it runs: the client
// for client-level commands, the members of the group for group-level
// ones, and every holder (directly or through a group) for role-level ones.
// Commands that do not kick return nil.
func KickTargets(st State, c Command) []string {
	if !c.Kicks() {
		return nil
	}
	var out []string
	switch c.Op {
	case OpDeleteGroup, OpAddGroupRole, OpRemoveGroupRole:
		out = st.Members(c.Group)
	case OpDeleteRole, OpAddRoleACL, OpRemoveRoleACL:
		out = st.Holders(c.Role)
	default:
		if c.Username != "" {
			out = []string{c.Username}
		}
	}
	slices.Sort(out)
	return out
}

// Members lists the usernames of a group's members.
func (s State) Members(group string) []string {
	var out []string
	for u, c := range s.Clients {
		if slices.Contains(c.Groups, group) {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// Holders lists the usernames that hold role directly or through a group.
func (s State) Holders(role string) []string {
	has := func(refs []RoleRef) bool {
		return slices.ContainsFunc(refs, func(r RoleRef) bool { return r.Name == role })
	}
	var out []string
	for u, c := range s.Clients {
		if has(c.Roles) || slices.ContainsFunc(c.Groups, func(g string) bool { return has(s.Groups[g].Roles) }) {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}
