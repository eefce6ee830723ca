package a2amqtt

import "strings"

// subIndex finds the subscriptions of a Conn whose filters match a topic. Filters without
// wildcards are found by one map lookup and only the (few) wildcard filters are scanned: a
// conversation service consumes one exact request topic per gated agent, and scanning every
// filter for every message would make each message cost more as the fleet grows.
type subIndex struct {
	byFilter map[string]*subEntry   // by full filter (incl. $share prefix)
	exact    map[string][]*subEntry // wildcard-free filters, by the topic they match
	wild     []*subEntry            // filters with + or #
}

func newSubIndex() subIndex {
	return subIndex{byFilter: map[string]*subEntry{}, exact: map[string][]*subEntry{}}
}

func (x *subIndex) get(filter string) *subEntry { return x.byFilter[filter] }

func (x *subIndex) len() int { return len(x.byFilter) }

// add indexes a new entry (its filter must not be indexed yet).
func (x *subIndex) add(e *subEntry) {
	x.byFilter[e.filter] = e
	if isWildcard(e.match) {
		x.wild = append(x.wild, e)
		return
	}
	x.exact[e.match] = append(x.exact[e.match], e)
}

// remove drops the entry of filter, if any.
func (x *subIndex) remove(filter string) {
	e := x.byFilter[filter]
	if e == nil {
		return
	}
	delete(x.byFilter, filter)
	if isWildcard(e.match) {
		x.wild = deleteEntry(x.wild, e)
		return
	}
	if rest := deleteEntry(x.exact[e.match], e); len(rest) > 0 {
		x.exact[e.match] = rest
	} else {
		delete(x.exact, e.match)
	}
}

// each calls fn for every entry whose filter matches topic.
func (x *subIndex) each(topic string, fn func(*subEntry)) {
	for _, e := range x.exact[topic] {
		fn(e)
	}
	for _, e := range x.wild {
		if TopicMatches(e.match, topic) {
			fn(e)
		}
	}
}

// all calls fn for every entry.
func (x *subIndex) all(fn func(*subEntry)) {
	for _, e := range x.byFilter {
		fn(e)
	}
}

func deleteEntry(s []*subEntry, e *subEntry) []*subEntry {
	for i, v := range s {
		if v == e {
			s[i] = s[len(s)-1]
			s[len(s)-1] = nil
			return s[:len(s)-1]
		}
	}
	return s
}

func isWildcard(filter string) bool { return strings.ContainsAny(filter, "+#") }

// TopicMatches reports whether an MQTT topic name matches a subscription filter (+ and #),
// level by level without splitting either string. Topics that start with '$' are not matched
// by a leading wildcard (MQTT-4.7.2-1). The filter is taken as valid: a malformed one (a
// wildcard that does not fill its level, # before the last level) is matched as written.
func TopicMatches(filter, topic string) bool {
	if filter == topic {
		return true
	}
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	topicEnded := false
	for {
		f, filterRest, moreFilter := strings.Cut(filter, "/")
		if f == "#" {
			return true // also matches the parent level ("a/#" matches "a")
		}
		if topicEnded {
			return false
		}
		t, topicRest, moreTopic := strings.Cut(topic, "/")
		if f != "+" && f != t {
			return false
		}
		if !moreFilter {
			return !moreTopic
		}
		filter, topic, topicEnded = filterRest, topicRest, !moreTopic
	}
}
