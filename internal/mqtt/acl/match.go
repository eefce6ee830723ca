package acl

import (
	"strings"
	"unicode/utf8"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TopicMatches reports whether a topic name matches a filter the way
// Mosquitto's mosquitto_topic_matches_sub does; dynsec uses it for the
// publishClientSend/publishClientReceive ACLs:
//
//   - "+" matches exactly one level (which may be empty), "#" the rest
//     including none ("a/#" matches "a");
//   - a topic starting with "$" only matches a filter starting with "$" and
//     vice versa, so "#" or "+/x" never grant "$a2a/..." topics.
//
// Invalid inputs (empty, wildcards in the topic, malformed filter) never
// match, which is the safe reading of Mosquitto's MOSQ_ERR_INVAL.
func TopicMatches(filter, topic string) bool {
	if !filterValid(filter) || !topicValid(topic) {
		return false
	}
	return validMatches(filter, topic)
}

// topicValid: a topic name is not empty and holds no wildcard.
func topicValid(topic string) bool { return topic != "" && !strings.ContainsAny(topic, "+#") }

// validMatches is TopicMatches for a valid filter and a valid topic (a
// compiled role checks its filters once, and a message's topic once).
func validMatches(filter, topic string) bool {
	if (filter[0] == '$') != (topic[0] == '$') {
		return false
	}
	return a2amqtt.TopicMatches(filter, topic)
}

// filterValid is ValidateFilter(filter) == nil without building an error
// or splitting the filter.
func filterValid(filter string) bool {
	if filter == "" || len(filter) > 65535 || !utf8.ValidString(filter) || strings.IndexByte(filter, 0) >= 0 {
		return false
	}
	for {
		level, rest, more := strings.Cut(filter, "/")
		if strings.ContainsAny(level, "+#") && len(level) != 1 {
			return false
		}
		if level == "#" && more {
			return false
		}
		if !more {
			return true
		}
		filter = rest
	}
}

// SubscriptionCovered reports whether a subscribePattern/unsubscribePattern
// ACL filter covers a subscription filter; it is a port of dynsec 2.0's
// sub_acl_check:
//
//   - ACL "#" covers everything, including "$" filters and "$share/...";
//   - a subscription ending in "#" needs an ACL ending in "#";
//   - "+" in the ACL covers any one level of the subscription, including a
//     literal "+" level; a "+" in the subscription is only covered by "+";
//   - there is no "$" rule and no $share handling: the full filter as sent,
//     "$share/group/..." included, is what is checked.
func SubscriptionCovered(aclFilter, sub string) bool {
	if aclFilter == "#" {
		return true
	}
	acl, aclHash := stripHash(aclFilter)
	s, subHash := stripHash(sub)
	if subHash && !aclHash {
		return false
	}
	al := strings.Split(acl, "/")
	sl := strings.Split(s, "/")
	if len(al) > len(sl) {
		return false
	}
	if len(sl) > len(al) && !aclHash {
		return false
	}
	for i, tok := range sl {
		switch {
		case i < len(al) && (al[i] == "+" || al[i] == tok):
		case i >= len(al) && aclHash:
		default:
			return false
		}
	}
	return true
}

// stripHash removes a trailing "#" level the way dynsec's hash_check does:
// "#" becomes "" and "a/#" becomes "a".
func stripHash(f string) (string, bool) {
	if f == "#" {
		return "", true
	}
	if strings.HasSuffix(f, "/#") {
		return f[:len(f)-2], true
	}
	return f, false
}
