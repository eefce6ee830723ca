package acl

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// referenceTopicMatches is the filter match stated on split levels, as
// mosquitto_topic_matches_sub reads: the reference TopicMatches is held to.
func referenceTopicMatches(filter, topic string) bool {
	if filter == "" || topic == "" || strings.ContainsAny(topic, "+#") || ValidateFilter(filter) != nil {
		return false
	}
	if (filter[0] == '$') != (topic[0] == '$') {
		return false
	}
	f := strings.Split(filter, "/")
	t := strings.Split(topic, "/")
	for i, fl := range f {
		if fl == "#" {
			return true
		}
		if i >= len(t) {
			return false
		}
		if fl != "+" && fl != t[i] {
			return false
		}
	}
	return len(f) == len(t)
}

var matchSeeds = [][2]string{
	{"a/b", "a/b"}, {"a/+", "a/"}, {"a/#", "a"}, {"#", "$SYS/x"}, {"$a2a/#", "$a2a/v1"}, {"+/+", "/"},
	{"a/#/b", "a/x/b"}, {"a+/b", "a+/b"}, {"", ""}, {"a", "a/b"}, {"a/b/c", "a/b"}, {"a\x00", "a\x00"},
	{"+", "+"}, {"\xff", "\xff"}, {"a//#", "a//"},
}

func FuzzTopicMatches(f *testing.F) {
	for _, s := range matchSeeds {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, filter, topic string) {
		if got, want := TopicMatches(filter, topic), referenceTopicMatches(filter, topic); got != want {
			t.Errorf("TopicMatches(%q, %q) = %v, the reference says %v", filter, topic, got, want)
		}
		if got, want := filterValid(filter), ValidateFilter(filter) == nil; got != want {
			t.Errorf("filterValid(%q) = %v, ValidateFilter says %v", filter, got, want)
		}
	})
}

// referenceCheck is a role's decision by a plain scan of its ACLs in
// priority order, the way dynsec walks them (literal subscribe rules of the
// role before its patterns).
func referenceCheck(r Role, access Access, topic string) (ACL, bool) {
	acls := Canonical(r.ACLs)
	scan := func(typ ACLType, match func(ACL) bool) (ACL, bool) {
		for _, a := range acls {
			if a.Type == typ && match(a) {
				return a, true
			}
		}
		return ACL{}, false
	}
	switch access {
	case Publish:
		return scan(PublishClientSend, func(a ACL) bool { return referenceTopicMatches(a.Topic, topic) })
	case Receive:
		return scan(PublishClientReceive, func(a ACL) bool { return referenceTopicMatches(a.Topic, topic) })
	case Subscribe, Unsubscribe:
		lit, pat := SubscribeLiteral, SubscribePattern
		if access == Unsubscribe {
			lit, pat = UnsubscribeLiteral, UnsubscribePattern
		}
		if a, ok := scan(lit, func(a ACL) bool { return a.Topic == topic }); ok {
			return a, true
		}
		return scan(pat, func(a ACL) bool { return SubscriptionCovered(a.Topic, topic) })
	}
	return ACL{}, false
}

// TestIndexedRoleMatchesScan: a role long enough to be indexed decides every
// access on every topic as a scan of its ACLs does, with exact and wildcard
// filters, invalid ones, duplicates and priorities mixed.
func TestIndexedRoleMatchesScan(t *testing.T) {
	levels := []string{"a", "b", "$x", "+", "#", "", "a+"}
	types := []ACLType{PublishClientSend, PublishClientReceive, SubscribeLiteral, SubscribePattern, UnsubscribeLiteral, UnsubscribePattern}
	randomFilter := func(r *rand.Rand) string {
		parts := make([]string, 1+r.IntN(3))
		for i := range parts {
			parts[i] = levels[r.IntN(len(levels))]
		}
		return strings.Join(parts, "/")
	}
	var topics []string
	for range 200 {
		topics = append(topics, randomFilter(rand.New(rand.NewPCG(uint64(len(topics)), 3))))
	}
	indexed := 0
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 5))
		role := Role{Name: "r"}
		// Two types share most ACLs, so their lists are often long enough to be indexed
		// while the others stay scanned.
		long := [2]ACLType{types[r.IntN(len(types))], types[r.IntN(len(types))]}
		for range indexFrom + r.IntN(4*indexFrom) {
			typ := long[r.IntN(2)]
			if r.IntN(4) == 0 {
				typ = types[r.IntN(len(types))]
			}
			role.ACLs = append(role.ACLs, ACL{Type: typ, Topic: randomFilter(r), Priority: r.IntN(3) - 1, Allow: r.IntN(2) == 0})
		}
		rp := compileRole(role)
		for _, l := range rp.byType {
			if l.exact != nil {
				indexed++
			}
		}
		for _, access := range []Access{Publish, Receive, Subscribe, Unsubscribe} {
			for _, topic := range topics {
				got, gotOK := rp.check(access, topic)
				want, wantOK := referenceCheck(role, access, topic)
				if got != want || gotOK != wantOK {
					t.Fatalf("seed %d: %s %q decided by %v (%v), a scan says %v (%v)", seed, access, topic, got, gotOK, want, wantOK)
				}
			}
		}
	}
	if indexed < 100 {
		t.Fatalf("only %d lists were long enough to be indexed", indexed)
	}
	t.Logf("%d indexed lists", indexed)
}

// gatesRole is the conversation service's gates role with n gated agents:
// a publish grant to each one's delivery topic, a subscribe grant to its
// request topic.
func gatesRole(n int) Role {
	gates := Role{Name: "a2a:gates"}
	for i := range n {
		gates.ACLs = append(gates.ACLs,
			allow(PublishClientSend, fmt.Sprintf("$a2a/v1/delivery/acme/unit%d/agent-%d", i%10, i), 0),
			allow(SubscribeLiteral, fmt.Sprintf("$a2a/v1/request/acme/unit%d/agent-%d", i%10, i), 0))
	}
	return gates
}

// BenchmarkGatesRoleCheck: the embedded broker's check of one PUBLISH by the
// conversation service, whose gates role holds two ACLs per gated agent.
func BenchmarkGatesRoleCheck(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("gated=%d", n), func(b *testing.B) {
			gates := gatesRole(n)
			own := Role{Name: "a2a:service", ACLs: []ACL{allow(PublishClientSend, "$a2a/v1/reply/#", 0)}}
			p := Compile(NewState([]Role{gates, own}, []Group{{Name: "a2a:service-group", Roles: []RoleRef{{Name: "a2a:gates"}}}},
				[]Client{{Username: "svc", Roles: []RoleRef{{Name: "a2a:service"}}, Groups: []string{"a2a:service-group"}}}))
			topic := fmt.Sprintf("$a2a/v1/delivery/acme/unit%d/agent-%d", (n/2)%10, n/2)
			b.ReportAllocs()
			for b.Loop() {
				if !p.Allows("svc", Publish, topic) {
					b.Fatal("denied")
				}
			}
		})
	}
}

// BenchmarkCompileGatesRole: what the index costs when the gates role
// changes (the operator paces shared applies at least 250 ms apart).
func BenchmarkCompileGatesRole(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("gated=%d", n), func(b *testing.B) {
			gates := gatesRole(n)
			b.ReportAllocs()
			for b.Loop() {
				compileRole(gates)
			}
		})
	}
}
