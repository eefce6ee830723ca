package convservice

import (
	"sync"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// Replayed replies. Whoever may publish to the service's reply topic (a gated agent) could send
// a reply it sent before again, sealed route and all; the route is authentic, so the service
// would relay it to the requester a second time. A reply is dropped instead (replies_total
// outcome dropped_replay) when its route is finished:
//
//   - for a message (SendMessage, SendStreamingMessage) of a task the engine tracks, when the
//     task no longer tracks the route's stream: the run ended or paused (durable state, so on
//     any replica and after a restart, for as long as the context lives);
//   - for any route, when this replica relayed its last reply within replayWindow (memory):
//     reads, retries, and tasks the engine no longer knows.
//
// A retry (the requester repeats the message of a task, with fresh correlation data, because
// it got no answer) is the exception to the first rule: the task may have finished before the
// retry was forwarded (its last reply was lost on the way, e.g. with a broker's state), and the
// agent answers the repeat with the finished task. That answer is the requester's only one, so
// it is judged by its own route's end alone. Found on kind: a broker restarted on an empty
// volume lost two relayed replies, and the retries' answers were dropped as replays.

// replayWindow is how long a replica remembers the routes it saw.
const replayWindow = time.Hour

// maxRoutes bounds that memory (the oldest are forgotten first).
const maxRoutes = 1 << 20

// routeLog remembers, by their seal's nonce, the routes a reply arrived on (whether the next
// reply is the first, which decides how a Task reply is read: EndsReplies) and the routes whose
// last reply was relayed (replays). A route's replies all come to the replica that sealed it
// (its reply topic), in order (one worker per correlation).
type routeLog struct {
	mu     sync.Mutex
	routes map[string]*routeSeen
	order  []string // first sight, for expiry
}

type routeSeen struct {
	at    time.Time
	ended bool
}

func newRouteLog() *routeLog { return &routeLog{routes: map[string]*routeSeen{}} }

// routeNonce identifies a sealed route (its AEAD nonce, unique per seal).
func routeNonce(sealed []byte) string {
	if len(sealed) < 1+nonceLen {
		return ""
	}
	return string(sealed[1 : 1+nonceLen])
}

// seen records a reply on the route and reports whether it is the route's first. A route
// forgotten (past replayWindow, or a restart) reads as new: its next Task reply is taken as
// the first.
func (f *routeLog) seen(sealed []byte, now time.Time) (first bool) {
	key := routeNonce(sealed)
	if key == "" {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.routes[key]; ok {
		return false
	}
	f.expire(now)
	f.routes[key] = &routeSeen{at: now}
	f.order = append(f.order, key)
	return true
}

// finish records that the route's last reply was relayed.
func (f *routeLog) finish(sealed []byte, now time.Time) {
	key := routeNonce(sealed)
	if key == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.routes[key]
	if !ok {
		f.expire(now)
		r = &routeSeen{}
		f.routes[key] = r
		f.order = append(f.order, key)
	}
	r.at, r.ended = now, true
}

// expire forgets the oldest routes past the window or the bound; f.mu is held.
func (f *routeLog) expire(now time.Time) {
	for len(f.order) > 0 {
		r := f.routes[f.order[0]]
		if len(f.order) < maxRoutes && now.Sub(r.at) <= replayWindow {
			return
		}
		delete(f.routes, f.order[0])
		f.order = f.order[1:]
	}
}

func (f *routeLog) finished(sealed []byte, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.routes[routeNonce(sealed)]
	return ok && r.ended && now.Sub(r.at) <= replayWindow
}

// replayed reports whether a reply on rt (sealed as corr) comes after its route finished.
func (s *replies) replayed(rt route, corr []byte) bool {
	if s.routes.finished(corr, time.Now()) {
		return true
	}
	if rt.Internal || rt.Retry || rt.TaskID == "" || (rt.Method != conversation.MethodSendMessage && rt.Method != conversation.MethodSendStreamingMessage) {
		return false
	}
	_, t := s.mem.Task(rt.Agent, rt.TaskID)
	return t != nil && !t.Tracks(rt.Correlation)
}
