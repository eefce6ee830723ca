package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// discardWriter is a ResponseWriter that keeps nothing: the SSE writer's own work alone.
type discardWriter struct {
	h       http.Header
	written int
	flushes int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Write(p []byte) (int, error) { d.written += len(p); return len(p), nil }
func (d *discardWriter) Flush()                      { d.flushes++ }

// BenchmarkSSEEvent is the gateway's work to frame one stream event (an artifact update as an
// SDK agent encodes it) for SSE, without the socket.
func BenchmarkSSEEvent(b *testing.B) {
	result := []byte(`{"artifactUpdate":{"taskId":"0f9b6c2e-3c55-4a4e-9d0e-1f1c2b3a4d5e","contextId":"6a7b8c9d-0e1f-4a2b-8c3d-4e5f6a7b8c9d","artifact":{"artifactId":"5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a","parts":[{"text":"chunk 17"}]}}}`)
	w := &discardWriter{h: http.Header{}}
	s := newSSEStream(w, time.Hour)
	defer s.close()
	id := json.RawMessage(`42`)
	b.ReportAllocs()
	for i := range b.N {
		if err := s.event(id, result, i%16 != 15); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSSEEventFrames: every event is one frame of its own id and one data line carrying the
// caller's JSON-RPC id and the result; ids differ from event to event and from stream to stream;
// a flush follows only an event with nothing behind it.
func TestSSEEventFrames(t *testing.T) {
	ids := map[string]bool{}
	for stream := range 2 {
		var buf bytes.Buffer
		w := &recordingWriter{discardWriter: discardWriter{h: http.Header{}}, buf: &buf}
		s := newSSEStream(w, time.Hour)
		for i := range 3 {
			if err := s.event(json.RawMessage(`"call-1"`), []byte(fmt.Sprintf(`{"artifactUpdate":{"n":%d}}`, i)), i < 2); err != nil {
				t.Fatal(err)
			}
		}
		s.close()
		if w.flushes != 1 {
			t.Fatalf("stream %d: %d flushes, want 1 (after the last event only)", stream, w.flushes)
		}
		frames := bytes.Split(bytes.TrimSuffix(buf.Bytes(), []byte("\n\n")), []byte("\n\n"))
		if len(frames) != 3 {
			t.Fatalf("stream %d: %d frames, want 3: %q", stream, len(frames), buf.String())
		}
		for i, f := range frames {
			lines := bytes.Split(f, []byte("\n"))
			id, ok := bytes.CutPrefix(lines[0], []byte("id: "))
			if len(lines) != 2 || !ok || len(id) == 0 {
				t.Fatalf("stream %d frame %d: %q", stream, i, f)
			}
			if ids[string(id)] {
				t.Fatalf("stream %d frame %d: id %s used before", stream, i, id)
			}
			ids[string(id)] = true
			want := fmt.Sprintf(`data: {"jsonrpc":"2.0","id":"call-1","result":{"artifactUpdate":{"n":%d}}}`, i)
			if string(lines[1]) != want {
				t.Fatalf("stream %d frame %d: %s, want %s", stream, i, lines[1], want)
			}
		}
	}
}

// recordingWriter keeps what is written.
type recordingWriter struct {
	discardWriter
	buf *bytes.Buffer
}

func (r *recordingWriter) Write(p []byte) (int, error) { return r.buf.Write(p) }
