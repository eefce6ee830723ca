package a2amqtt

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/paho"
)

// referenceTopicMatches is MQTT filter matching as the specification states it, level by level
// on split strings: the reference topicMatches is held to.
func referenceTopicMatches(filter, topic string) bool {
	if filter == topic {
		return true
	}
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	fs := strings.Split(filter, "/")
	ts := strings.Split(topic, "/")
	for i, f := range fs {
		if f == "#" {
			return true
		}
		if i >= len(ts) {
			return false
		}
		if f != "+" && f != ts[i] {
			return false
		}
	}
	return len(fs) == len(ts)
}

var topicMatchSeeds = []struct {
	filter, topic string
	want          bool
}{
	{"a/b", "a/b", true},
	{"a/b", "a/c", false},
	{"a/+", "a/b", true},
	{"a/+", "a/", true},
	{"a/+", "a", false},
	{"a/+", "a/b/c", false},
	{"a/#", "a", true},
	{"a/#", "a/b/c", true},
	{"#", "a/b", true},
	{"#", "$a2a/v1/request/o/u/a", false},
	{"+/v1/#", "$a2a/v1/x", false},
	{"$a2a/v1/request/+/+/+", "$a2a/v1/request/o/u/a", true},
	{"$a2a/v1/request/+/+/+", "$a2a/v1/request/o/u", false},
	{"+/+", "/", true},
	{"/", "/", true},
	{"", "", true},
	{"+", "", true},
	{"a//b", "a//b", true},
	{"a/+/b", "a//b", true},
	{"a/b/#", "a/b", true},
	{"a/b/#", "a", false},
}

func TestTopicMatches(t *testing.T) {
	for _, c := range topicMatchSeeds {
		if got := TopicMatches(c.filter, c.topic); got != c.want {
			t.Errorf("TopicMatches(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
		}
		if ref := referenceTopicMatches(c.filter, c.topic); ref != c.want {
			t.Errorf("reference(%q, %q) = %v, want %v", c.filter, c.topic, ref, c.want)
		}
	}
}

func FuzzTopicMatches(f *testing.F) {
	for _, c := range topicMatchSeeds {
		f.Add(c.filter, c.topic)
	}
	f.Fuzz(func(t *testing.T, filter, topic string) {
		if got, want := TopicMatches(filter, topic), referenceTopicMatches(filter, topic); got != want {
			t.Errorf("TopicMatches(%q, %q) = %v, the reference says %v", filter, topic, got, want)
		}
	})
}

// TestSubIndexMatchesScan: after any sequence of adds and removes, the index finds exactly the
// entries a scan of every filter finds, for exact, shared and wildcard filters alike.
func TestSubIndexMatchesScan(t *testing.T) {
	levels := []string{"a", "b", "+", "#", "$x"}
	randomFilter := func(r *rand.Rand) string {
		n := 1 + r.IntN(3)
		parts := make([]string, n)
		for i := range parts {
			parts[i] = levels[r.IntN(len(levels))]
		}
		f := strings.Join(parts, "/")
		if r.IntN(4) == 0 {
			f = "$share/g" + fmt.Sprint(r.IntN(2)) + "/" + f
		}
		return f
	}
	var topics []string
	for _, x := range []string{"a", "b", "$x"} {
		topics = append(topics, x)
		for _, y := range []string{"a", "b", "$x"} {
			topics = append(topics, x+"/"+y)
			for _, z := range []string{"a", "b"} {
				topics = append(topics, x+"/"+y+"/"+z)
			}
		}
	}
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 7))
		x := newSubIndex()
		live := map[string]*subEntry{}
		for range 40 {
			f := randomFilter(r)
			if live[f] != nil && r.IntN(2) == 0 {
				x.remove(f)
				delete(live, f)
			} else if live[f] == nil {
				e := &subEntry{filter: f, match: stripShare(f)}
				x.add(e)
				live[f] = e
			}
			if x.len() != len(live) {
				t.Fatalf("seed %d: index holds %d filters, want %d", seed, x.len(), len(live))
			}
			for _, topic := range topics {
				var got, want []string
				x.each(topic, func(e *subEntry) { got = append(got, e.filter) })
				for f, e := range live {
					if referenceTopicMatches(e.match, topic) {
						want = append(want, f)
					}
				}
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d: topic %q matched %v, a scan finds %v", seed, topic, got, want)
				}
			}
		}
	}
}

// BenchmarkDispatchManySubscriptions: the receive goroutine's cost of routing one message to its
// handler while the connection holds n exact subscriptions (a conversation service gating n
// agents) and one wildcard subscription.
func BenchmarkDispatchManySubscriptions(b *testing.B) {
	for _, n := range []int{1, 100, 10000} {
		b.Run(fmt.Sprintf("subscriptions=%d", n), func(b *testing.B) {
			c := &Conn{subs: newSubIndex()}
			handled := 0
			h := func(*paho.Publish) { handled++ }
			for i := range n {
				f := fmt.Sprintf("$a2a/v1/request/org/unit/agent-%d", i)
				c.subs.add(&subEntry{filter: f, match: f, handlers: map[uint64]func(*paho.Publish){uint64(i): h}})
			}
			w := "$a2a/v1/reply/org/unit/svc/+"
			c.subs.add(&subEntry{filter: w, match: w, handlers: map[uint64]func(*paho.Publish){uint64(n): h}})
			p := &paho.Publish{Topic: fmt.Sprintf("$a2a/v1/request/org/unit/agent-%d", n/2), QoS: 1, Properties: &paho.PublishProperties{}}
			b.ReportAllocs()
			for b.Loop() {
				c.dispatch(p)
			}
			if handled != b.N {
				b.Fatalf("handled %d of %d messages", handled, b.N)
			}
		})
	}
}
