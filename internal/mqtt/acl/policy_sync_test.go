package acl

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// An incrementally synced Policy decides exactly like one compiled from
// scratch, after any sequence of changes (roles, groups, memberships,
// deletions, dangling references), for every user, access and topic.
func TestPolicySyncMatchesCompile(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	roleNames := []string{"r0", "r1", "r2", "r3", "r4", "r5"}
	groupNames := []string{"g0", "g1", "g2"}
	users := []string{"u0", "u1", "u2", "u3"}
	topics := []string{"a/x", "a/y", "b/x", "a/#", "b/+", "$CONTROL/x", "c"}
	filters := []string{"a/#", "a/x", "b/+", "#", "c"}
	types := []ACLType{PublishClientSend, PublishClientReceive, SubscribeLiteral, SubscribePattern, UnsubscribeLiteral, UnsubscribePattern}

	randomRole := func(name string) Role {
		r := Role{Name: name}
		seen := map[[2]string]bool{}
		for range rng.IntN(4) {
			a := ACL{Type: types[rng.IntN(len(types))], Topic: filters[rng.IntN(len(filters))], Priority: rng.IntN(3) - 1, Allow: rng.IntN(2) == 0}
			if k := [2]string{string(a.Type), a.Topic}; !seen[k] {
				seen[k] = true
				r.ACLs = append(r.ACLs, a)
			}
		}
		return r
	}
	randomRefs := func() []RoleRef {
		var out []RoleRef
		for _, n := range roleNames {
			if rng.IntN(3) == 0 {
				out = append(out, RoleRef{Name: n, Priority: rng.IntN(3) - 1})
			}
		}
		rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		return out
	}

	for run := range 200 {
		st := NewState(nil, nil, nil)
		p := NewPolicy()
		for step := range 40 {
			var touched Names
			switch rng.IntN(7) {
			case 0, 1:
				n := roleNames[rng.IntN(len(roleNames))]
				st.Roles[n] = randomRole(n)
				touched.Roles = append(touched.Roles, n)
			case 2:
				n := roleNames[rng.IntN(len(roleNames))]
				delete(st.Roles, n)
				touched.Roles = append(touched.Roles, n)
			case 3:
				n := groupNames[rng.IntN(len(groupNames))]
				st.Groups[n] = Group{Name: n, Roles: randomRefs()}
				touched.Groups = append(touched.Groups, n)
			case 4:
				n := groupNames[rng.IntN(len(groupNames))]
				delete(st.Groups, n)
				touched.Groups = append(touched.Groups, n)
			case 5:
				u := users[rng.IntN(len(users))]
				c := Client{Username: u, Roles: randomRefs()}
				for _, g := range groupNames {
					if rng.IntN(2) == 0 {
						c.Groups = append(c.Groups, g)
					}
				}
				st.Clients[u] = c
				touched.Clients = append(touched.Clients, u)
			case 6:
				u := users[rng.IntN(len(users))]
				delete(st.Clients, u)
				touched.Clients = append(touched.Clients, u)
			}
			if rng.IntN(10) == 0 {
				d := DefaultACLAccess{PublishClientSend: rng.IntN(2) == 0, PublishClientReceive: true, Subscribe: rng.IntN(2) == 0, Unsubscribe: true}
				st.DefaultACL = &d
			}
			p.Sync(st, touched)
			fresh := Compile(st)
			for _, u := range append(slices.Clone(users), "nobody") {
				for _, acc := range []Access{Publish, Receive, Subscribe, Unsubscribe} {
					for _, topic := range topics {
						got, want := p.Check(u, acc, topic), fresh.Check(u, acc, topic)
						if got != want {
							t.Fatalf("run %d step %d: %s %s %q: incremental %v, compiled %v\nstate %+v", run, step, u, acc, topic, got, want, st)
						}
						if p.Allows(u, acc, topic) != want.Allow {
							t.Fatalf("run %d step %d: Allows disagrees with Check", run, step)
						}
					}
				}
			}
		}
		// Nothing leaks: slots exist only for what is defined or referenced.
		for name, slot := range p.roles {
			if slot.rp == nil && slot.refs <= 0 {
				t.Fatalf("run %d: role slot %q kept without role or references", run, name)
			}
		}
	}
}

// A shared group with thousands of roles is synced in time proportional to
// the change, not re-sorted per member or per change.
func BenchmarkPolicySyncSharedGroup(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st := NewState(nil, nil, nil)
			g := Group{Name: "unit"}
			for i := range n {
				name := fmt.Sprintf("callers-%05d", i)
				st.Roles[name] = Role{Name: name, ACLs: []ACL{{Type: PublishClientSend, Topic: "t/" + name, Allow: true}}}
				g.Roles = append(g.Roles, RoleRef{Name: name})
				st.Clients["u"+name] = Client{Username: "u" + name, Groups: []string{"unit"}}
			}
			st.Groups["unit"] = g
			p := Compile(st)
			b.ResetTimer()
			for i := range b.N {
				name := fmt.Sprintf("new-%d", i)
				st.Roles[name] = Role{Name: name}
				g := st.Groups["unit"]
				// The embedded store keeps lists in dynsec order, as dynsec does.
				at, _ := slices.BinarySearchFunc(g.Roles, name, func(r RoleRef, n string) int { return strings.Compare(r.Name, n) })
				g.Roles = slices.Insert(g.Roles, at, RoleRef{Name: name})
				st.Groups["unit"] = g
				st.Clients["u"+name] = Client{Username: "u" + name, Groups: []string{"unit"}}
				p.Sync(st, Names{Roles: []string{name}, Groups: []string{"unit"}, Clients: []string{"u" + name}})
			}
		})
	}
}
