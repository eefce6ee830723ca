package a2amqtt

import (
	"sync"
)

// maxRecentRequests bounds how many requests a responder remembers to recognise a copy of one
// it already took. A redelivery follows its original within the reconnect that caused it
// (seconds); at the SDK's measured rates this many requests span minutes.
const maxRecentRequests = 16384

// recentRequests remembers the requests a responder took, by Response Topic and Correlation
// Data, so a second copy of one is dropped instead of answered again (the bridge's Task.id
// deduplication already keeps it from running twice, protocol.md). A copy arrives when the
// broker resends a persistent session's unacknowledged message after a reconnect (the process
// had already received it, but the PUBACK never reached the broker: a kick, a cut connection),
// or when a publisher resends after its own reconnect. Each attempt of a requester carries new
// Correlation Data (the profile's retry rules, the SDK's Requester, the conversation service's
// sealed routes), so a retry is never mistaken for a copy. A request without Correlation Data
// cannot be answered and is not remembered. The memory is bounded (oldest forgotten first).
type recentRequests struct {
	mu   sync.Mutex
	keys map[string]struct{}
	ring []string // insertion order, maxRecentRequests long once full
	next int
}

// firstTime records the request and says whether it is the first copy seen.
func (s *recentRequests) firstTime(responseTopic string, correlation []byte) bool {
	if len(correlation) == 0 {
		return true
	}
	key := string(correlation) + "\x00" + responseTopic
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, seen := s.keys[key]; seen {
		return false
	}
	if s.keys == nil {
		s.keys = make(map[string]struct{})
	}
	if len(s.ring) < maxRecentRequests {
		s.ring = append(s.ring, key)
	} else {
		delete(s.keys, s.ring[s.next])
		s.ring[s.next] = key
		s.next = (s.next + 1) % maxRecentRequests
	}
	s.keys[key] = struct{}{}
	return true
}
