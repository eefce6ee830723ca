package acl

import "testing"

func TestTopicMatches(t *testing.T) {
	cases := []struct {
		filter, topic string
		want          bool
	}{
		{"a/b", "a/b", true},
		{"a/b", "a/c", false},
		{"a/+", "a/b", true},
		{"a/+", "a/", true}, // "+" matches an empty level
		{"a/+", "a", false},
		{"a/+", "a/b/c", false},
		{"a/#", "a", true}, // "#" includes the parent level
		{"a/#", "a/b/c", true},
		{"a/+/#", "a/b", true},
		{"#", "a/b", true},
		{"+/+", "a/b", true},
		{"/+", "/a", true},
		// "$" topics only match filters that start with "$".
		{"#", "$a2a/v1/request/acme/x", false},
		{"+/v1/#", "$a2a/v1/x", false},
		{"$a2a/#", "$a2a/v1/request/acme/x", true},
		{"$a2a/v1/request/acme/#", "$a2a/v1/request/acme/x", true},
		{"$a2a/v1/request/acme/#", "$a2a/v1/request/other/x", false},
		{"$SYS/#", "$SYS/broker/uptime", true},
		{"$a2a/#", "a2a/x", false},
		// invalid input never matches
		{"a/b#", "a/b", false},
		{"a/#/b", "a/x/b", false},
		{"a/+", "a/+", false},
		{"", "a", false},
		{"a", "", false},
	}
	for _, c := range cases {
		if got := TopicMatches(c.filter, c.topic); got != c.want {
			t.Errorf("TopicMatches(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
		}
	}
}

// The cases of dynsec 2.0's own sub_matches_sub.c test main, plus the ones
// this project relies on ($share and $ prefixes).
func TestSubscriptionCovered(t *testing.T) {
	cases := []struct {
		acl, sub string
		want     bool
	}{
		{"foo/+/bar", "foo/#", false},
		{"foo/+/ba℞/#", "foo/baz/ba℞", true},
		{"foo/+/ba℞/#", "foo/baz/ba℞/+", true},
		{"foo/+/ba℞/#", "foo/baz/ba℞/#", true},
		{"foo/+/ba℞/#", "foo/baz/+/#", false},
		{"/+//#", "/foo///#", true},
		{"#", "#", true},
		{"#", "+", true},
		{"/#", "+", false},
		{"/#", "/+", true},
		{"/+", "#", false},
		{"/+", "+", false},
		{"+/+", "topic/topic", true},
		{"+/+", "topic/topic/", false},
		{"+", "#", false},
		{"+", "+", true},
		{"a/b/c/d/e", "a/b/c/d/e", true},
		{"a/b/ /d/e", "a/b/c/d/e", false},
		// No "$" rule: "#" covers every filter.
		{"#", "$a2a/v1/request/acme/x", true},
		{"#", "$share/g/$a2a/v1/request/acme/x", true},
		{"+/#", "$a2a/v1", true},
		// $share is not stripped: the ACL must spell it out.
		{"$a2a/v1/request/acme/#", "$share/g/$a2a/v1/request/acme/x", false},
		{"$share/+/$a2a/v1/request/acme/#", "$share/g/$a2a/v1/request/acme/x", true},
		{"$share/g/$a2a/v1/request/acme/#", "$share/h/$a2a/v1/request/acme/x", false},
		{"$a2a/v1/request/acme/#", "$a2a/v1/request/acme", true},
		{"$a2a/v1/request/acme/#", "$a2a/v1/request/acme/#", true},
		{"$a2a/v1/request/acme/+", "$a2a/v1/request/acme/#", false},
	}
	for _, c := range cases {
		if got := SubscriptionCovered(c.acl, c.sub); got != c.want {
			t.Errorf("SubscriptionCovered(%q, %q) = %v, want %v", c.acl, c.sub, got, c.want)
		}
	}
}

func TestValidateFilter(t *testing.T) {
	for _, ok := range []string{"a", "a/b", "+", "#", "a/+/#", "$share/g/a", "/", "a//b"} {
		if err := ValidateFilter(ok); err != nil {
			t.Errorf("ValidateFilter(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a/b#", "a/#/b", "a+", "+a/b", "a/\x00", string([]byte{0xff})} {
		if err := ValidateFilter(bad); err == nil {
			t.Errorf("ValidateFilter(%q) accepted", bad)
		}
	}
}
