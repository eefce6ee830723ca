package embedded

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// A modifyRole given as a splice of the role (acl.Command.Splice, applied in place) has the
// reply, the stored list and the decisions of the same modifyRole carrying the whole list,
// edit after edit: rules inserted and dropped anywhere, edits that reorder the list, and
// refused ones (two rules of a type on a topic, an invalid filter, an unknown type).
func TestSplicedModifyRoleMatchesWholeList(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(4, 2))
	types := []acl.ACLType{acl.PublishClientSend, acl.SubscribePattern, acl.SubscribeLiteral}
	rule := func() acl.ACL {
		a := acl.ACL{Type: types[rng.IntN(len(types))], Topic: fmt.Sprintf("rpc/%d", rng.IntN(60)), Priority: rng.IntN(2), Allow: rng.IntN(4) > 0}
		switch rng.IntN(12) {
		case 0:
			a.Topic = fmt.Sprintf("rpc/%d/+", rng.IntN(60))
		case 1:
			a.Topic = "rpc/#/bad" // refused
		case 2:
			a.Type = "publishSomething" // refused
		}
		return a
	}
	var topics []string
	for i := range 60 {
		topics = append(topics, fmt.Sprintf("rpc/%d", i), fmt.Sprintf("rpc/%d/x", i))
	}
	newStore := func() *Store {
		s, err := NewStore(StoreConfig{})
		if err != nil {
			t.Fatal(err)
		}
		var initial []acl.ACL
		for i := range 30 {
			initial = append(initial, acl.ACL{Type: acl.PublishClientSend, Topic: fmt.Sprintf("rpc/%d", i), Allow: true})
		}
		if err := s.Execute(ctx, []acl.Command{{Op: acl.OpCreateRole, Role: "a2a:org:o", ACLs: initial},
			{Op: acl.OpCreateClient, Username: "a2a:caller", Password: "p"}, {Op: acl.OpAddClientRole, Username: "a2a:caller", Role: "a2a:org:o"}}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	whole, spliced := newStore(), newStore()
	var inPlace, refusedEdits int
	for step := range 1500 {
		have, _ := whole.Observe(ctx, &acl.Names{Roles: []string{"a2a:org:o"}})
		cur := have.Roles["a2a:org:o"].ACLs
		from := rng.IntN(len(cur) + 1)
		to := from + rng.IntN(min(len(cur)-from, 2)+1)
		var ins []acl.ACL
		for range rng.IntN(3) {
			ins = append(ins, rule())
		}
		if rng.IntN(3) > 0 {
			ins = acl.Canonical(ins)
		}
		sp := acl.RoleSplice{Had: len(cur), Keep: from, KeepEnd: len(cur) - to, Insert: ins}
		list := sp.Apply(cur)
		wo, err := whole.ExecuteEach(ctx, []acl.Command{{Op: acl.OpModifyRole, Role: "a2a:org:o", ACLs: list}})
		if err != nil {
			t.Fatal(err)
		}
		so, err := spliced.ExecuteEach(ctx, []acl.Command{{Op: acl.OpModifyRole, Role: "a2a:org:o", Splice: &sp}})
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("step %d: %+v on %d rules", step, sp, len(cur))
		if wo[0].Verdict != so[0].Verdict || wo[0].Message != so[0].Message {
			t.Fatalf("%s: the whole list is answered %+v, the splice %+v", what, wo[0], so[0])
		}
		if so[0].Verdict != acl.Applied {
			refusedEdits++
		} else if sp.KeepsCanonical(cur) {
			inPlace++
		}
		a, _ := whole.Observe(ctx, nil)
		b, _ := spliced.Observe(ctx, nil)
		if !slices.Equal(a.Roles["a2a:org:o"].ACLs, b.Roles["a2a:org:o"].ACLs) {
			t.Fatalf("%s: the whole list stores\n%v\nthe splice\n%v", what, a.Roles["a2a:org:o"].ACLs, b.Roles["a2a:org:o"].ACLs)
		}
		for _, access := range []acl.Access{acl.Publish, acl.Subscribe} {
			for _, topic := range topics {
				x, _ := whole.Check(ctx, "a2a:caller", access, topic)
				y, _ := spliced.Check(ctx, "a2a:caller", access, topic)
				if x != y {
					t.Fatalf("%s: %s %q: %v after the whole list, %v after the splice", what, access, topic, x, y)
				}
			}
		}
	}
	t.Logf("%d edits applied in place, %d refused", inPlace, refusedEdits)
	if inPlace < 500 || refusedEdits < 100 {
		t.Fatalf("the sequence did not exercise both paths: %d in place, %d refused", inPlace, refusedEdits)
	}
}

// BenchmarkModifyRoleByRules is what a new member of a shared role costs the store (the
// store's command, its key set and the policy's index), as a splice and as the whole list, by
// the size of the role: the splice's cost does not grow with the role, the whole list's does.
//
//	go test ./internal/mqtt/embedded -run '^$' -bench ModifyRoleByRules -benchtime 200x
func BenchmarkModifyRoleByRules(b *testing.B) {
	for _, rules := range []int{300, 3000, 30000} {
		for _, how := range []string{"splice", "whole"} {
			b.Run(fmt.Sprintf("%s/%d", how, rules), func(b *testing.B) {
				ctx := context.Background()
				s, err := NewStore(StoreConfig{})
				if err != nil {
					b.Fatal(err)
				}
				member := func(i int) acl.ACL {
					return acl.ACL{Type: acl.PublishClientSend, Topic: fmt.Sprintf("rpc/o/u%d/agent-%06d/request", i%10, i), Allow: true}
				}
				list := make([]acl.ACL, 0, rules+b.N)
				for i := range rules {
					list = append(list, member(i))
				}
				if err := s.Execute(ctx, []acl.Command{{Op: acl.OpCreateRole, Role: "a2a:org:o", ACLs: slices.Clone(list)},
					{Op: acl.OpCreateClient, Username: "a2a:c", Password: "p"}, {Op: acl.OpAddClientRole, Username: "a2a:c", Role: "a2a:org:o"}}); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := range b.N {
					a := member(rules + i)
					c := acl.Command{Op: acl.OpModifyRole, Role: "a2a:org:o"}
					if how == "splice" {
						c.Splice = &acl.RoleSplice{Had: len(list), Keep: len(list), Insert: []acl.ACL{a}}
					} else {
						c.ACLs = append(slices.Clone(list), a) // the decoded request's list
					}
					list = append(list, a)
					if err := s.Execute(ctx, []acl.Command{c}); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if d, _ := s.Check(ctx, "a2a:c", acl.Publish, list[len(list)-1].Topic); !d.Allow {
					b.Fatalf("the last member is not granted: %v", d)
				}
			})
		}
	}
}
