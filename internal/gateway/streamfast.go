package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// SendStreamingMessage skips a2a-go's JSON-RPC server too: its SSE writer takes each event from
// a goroutine of its own over a channel and flushes every event, so each event cost two
// goroutine wake-ups and a write to the socket on top of the MQTT side's, and each event was
// decoded into a2a-go types and encoded again. The gateway writes the events from the handler's
// goroutine as the caller's requester hands them on, each as the agent encoded it
// (a2amqtt.Transport.SendStreamingMessageJSON), in the frames a2a-go writes ("id: <uuid>",
// "data: <JSON-RPC response>"), and flushes only when no further
// reply of the stream has arrived already (a2amqtt.StreamItem.More): a burst of events leaves in
// one write, a lone event at once (docs/benchmarks.md, streaming through the gateway). A failed
// call, before or after its first event, is a2a-go's to answer (its error event, the bus's error
// object restored by errorWriter), as on the server's own path.

// sseStream writes one SSE response: events from the handler's goroutine, keep-alives from a
// timer while the stream is idle (net/http's ResponseWriter is not safe for concurrent use).
type sseStream struct {
	w         http.ResponseWriter
	flusher   http.Flusher
	keepAlive time.Duration

	mu      sync.Mutex
	started bool // headers written
	wrote   bool // an event written since the last keep-alive tick
	done    bool
	timer   *time.Timer
	frame   []byte
	// idBase and seq make the events' ids: the stream's own UUID and the event's number, so
	// that an id is unique without a random UUID drawn for every event.
	idBase []byte
	seq    uint64
}

func newSSEStream(w http.ResponseWriter, keepAlive time.Duration) *sseStream {
	s := &sseStream{w: w, keepAlive: keepAlive}
	s.flusher, _ = w.(http.Flusher)
	s.timer = time.AfterFunc(keepAlive, s.tick)
	return s
}

// startLocked writes the SSE headers a2a-go's server writes.
func (s *sseStream) startLocked() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
}

// tick writes a keep-alive comment when no event went out for a whole interval.
func (s *sseStream) tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return
	}
	if !s.wrote {
		s.startLocked()
		if _, err := s.w.Write([]byte(": keep-alive\n\n")); err == nil {
			s.flusher.Flush()
		}
	}
	s.wrote = false
	s.timer.Reset(s.keepAlive)
}

// event writes one JSON-RPC response carrying result, flushed unless more follows at once.
func (s *sseStream) event(id json.RawMessage, result []byte, more bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startLocked()
	s.wrote = true
	if s.idBase == nil {
		s.idBase = append([]byte(uuid.NewString()), '-')
	}
	s.seq++
	f := append(s.frame[:0], "id: "...)
	f = append(f, s.idBase...)
	f = strconv.AppendUint(f, s.seq, 10)
	f = append(f, "\ndata: "...)
	f = append(f, `{"jsonrpc":"2.0","id":`...)
	f = append(f, id...)
	f = append(f, `,"result":`...)
	if bytes.ContainsAny(result, "\r\n") {
		// An agent's encoder may indent: a line break would end the SSE data line.
		var compact bytes.Buffer
		if err := json.Compact(&compact, result); err != nil {
			return err
		}
		result = compact.Bytes()
	}
	f = append(f, result...)
	f = append(f, "}\n\n"...)
	s.frame = f
	if _, err := s.w.Write(f); err != nil {
		return err
	}
	if !more {
		s.flusher.Flush()
	}
	return nil
}

// close stops the keep-alives; after it nothing is written.
func (s *sseStream) close() (started bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	s.timer.Stop()
	return s.started
}

// streamFast answers a SendStreamingMessage request. answered false: the request is a2a-go's to
// answer, with callErr (when not nil) as the call's outcome; started: the response's headers
// (and maybe events) went out already.
func (in *Inbound) streamFast(ctx context.Context, w http.ResponseWriter, t *a2amqtt.Transport, env *rpcEnvelope, req *a2a.SendMessageRequest) (answered, started bool, callErr error) {
	if _, ok := w.(http.Flusher); !ok {
		return false, false, nil
	}
	s := newSSEStream(w, in.cfg.KeepAlive)
	for item, err := range t.SendStreamingMessageJSON(ctx, nil, req) {
		if err != nil {
			callErr = err
			break
		}
		result := item.JSON
		if result == nil {
			if result, err = json.Marshal(a2a.StreamResponse{Event: item.Event}); err != nil {
				callErr = err
				break
			}
		}
		if s.event(env.ID, result, item.More) != nil {
			break // the caller went away: its context ends the call
		}
	}
	started = s.close()
	if callErr != nil {
		return false, started, callErr
	}
	if !started {
		// A stream that ended without an event still answers as a2a-go's server does.
		s.mu.Lock()
		s.startLocked()
		s.mu.Unlock()
	}
	return true, true, nil
}

// headersSent is a ResponseWriter whose headers went out: a2a-go's server, writing the error
// event of a stream the fast path started, sets them again, which would only log a warning.
type headersSent struct{ http.ResponseWriter }

func (headersSent) WriteHeader(int) {}

// Flush keeps SSE streaming through the wrapper.
func (h headersSent) Flush() {
	if f, ok := h.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (h headersSent) Unwrap() http.ResponseWriter { return h.ResponseWriter }
