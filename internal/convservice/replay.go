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

// replayWindow is how long a replica remembers the routes it finished.
const replayWindow = time.Hour

// maxFinishedRoutes bounds that memory (the oldest are forgotten first).
const maxFinishedRoutes = 1 << 20

// finishedRoutes remembers the routes whose last reply was relayed, by their seal's nonce.
type finishedRoutes struct {
	mu    sync.Mutex
	at    map[string]time.Time
	order []string // insertion order, for expiry
}

func newFinishedRoutes() *finishedRoutes { return &finishedRoutes{at: map[string]time.Time{}} }

// routeNonce identifies a sealed route (its AEAD nonce, unique per seal).
func routeNonce(sealed []byte) string {
	if len(sealed) < 1+nonceLen {
		return ""
	}
	return string(sealed[1 : 1+nonceLen])
}

func (f *finishedRoutes) finish(sealed []byte, now time.Time) {
	key := routeNonce(sealed)
	if key == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.order) > 0 && (len(f.order) >= maxFinishedRoutes || now.Sub(f.at[f.order[0]]) > replayWindow) {
		delete(f.at, f.order[0])
		f.order = f.order[1:]
	}
	if _, ok := f.at[key]; !ok {
		f.order = append(f.order, key)
	}
	f.at[key] = now
}

func (f *finishedRoutes) finished(sealed []byte, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.at[routeNonce(sealed)]
	return ok && now.Sub(at) <= replayWindow
}

// replayed reports whether a reply on rt (sealed as corr) comes after its route finished.
func (s *replies) replayed(rt route, corr []byte) bool {
	if s.finished.finished(corr, time.Now()) {
		return true
	}
	if rt.Internal || rt.Retry || rt.TaskID == "" || (rt.Method != conversation.MethodSendMessage && rt.Method != conversation.MethodSendStreamingMessage) {
		return false
	}
	_, t := s.mem.Task(rt.Agent, rt.TaskID)
	return t != nil && !t.Tracks(rt.Correlation)
}
