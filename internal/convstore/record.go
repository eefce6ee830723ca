package convstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// Records: a context is stored as one small header record plus one record
// per task, so a decision writes only what it changed (the header and the
// one or two tasks it touched), never the whole context re-encoded. The
// encoding is a versioned binary layout (uvarints, length-prefixed strings):
// encoding allocates one buffer, and decoding happens only on recovery.
//
// Messages and artifacts (history mode Messages) are further records, one
// per item under its context (content.go), bounded per context by the
// policy's byte budget.

const (
	headerVersion = 1
	// taskVersion 2 adds the continuation hint and the agent's ids; version
	// 1 records still decode.
	taskVersion = 2
)

var errRecord = errors.New("malformed conversation record")

// states maps task states to one byte and back.
var states = []a2a.TaskState{
	a2a.TaskStateUnspecified, a2a.TaskStateSubmitted, a2a.TaskStateWorking, a2a.TaskStateInputRequired,
	a2a.TaskStateAuthRequired, a2a.TaskStateCompleted, a2a.TaskStateFailed, a2a.TaskStateCanceled, a2a.TaskStateRejected,
}

func stateCode(s a2a.TaskState) byte {
	for i, v := range states {
		if v == s {
			return byte(i)
		}
	}
	return 0
}

type enc struct{ b []byte }

func (e *enc) u(v uint64)     { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) s(v string)     { e.u(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) bytes(v []byte) { e.u(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) byte(v byte)    { e.b = append(e.b, v) }
func (e *enc) time(t time.Time) {
	if t.IsZero() {
		e.u(0)
		return
	}
	// +1 keeps 0 for the zero time; times before 1970 are clamped.
	e.u(uint64(max(t.UnixNano(), 0)) + 1)
}

type dec struct {
	b   []byte
	err error
}

func (d *dec) u() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errRecord
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) raw() []byte {
	n := d.u()
	if d.err != nil || uint64(len(d.b)) < n {
		d.err = errRecord
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) s() string { return string(d.raw()) }

func (d *dec) bytes() []byte {
	v := d.raw()
	if len(v) == 0 {
		return nil
	}
	return append([]byte(nil), v...)
}

func (d *dec) byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = errRecord
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) time() time.Time {
	v := d.u()
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(v-1)).UTC()
}

// encodeHeader encodes everything of a context but its tasks.
func encodeHeader(c *conversation.Context) []byte {
	e := enc{b: make([]byte, 0, 96+len(c.Requester)+len(c.ID))}
	e.byte(headerVersion)
	e.time(c.CreatedAt)
	e.time(c.LastActivity)
	e.s(c.Requester)
	e.u(uint64(c.Working))
	if c.Expired != nil {
		e.byte(1)
		e.s(string(c.Expired.Reason))
		e.time(c.Expired.At)
	} else {
		e.byte(0)
	}
	e.u(uint64(len(c.ExpiredTasks)))
	for _, id := range c.ExpiredTasks {
		e.s(id)
	}
	e.time(c.ExpiresAt)
	e.time(c.NextDeadline)
	e.u(c.Deadlines)
	e.u(c.TaskSeq)
	return e.b
}

func decodeHeader(id string, b []byte) (*conversation.Context, error) {
	d := dec{b: b}
	if d.byte() != headerVersion {
		return nil, fmt.Errorf("context %s: header version: %w", id, errRecord)
	}
	c := &conversation.Context{ID: id}
	c.CreatedAt = d.time()
	c.LastActivity = d.time()
	c.Requester = d.s()
	c.Working = int(d.u())
	if d.byte() == 1 {
		c.Expired = &conversation.Expiry{Reason: conversation.ExpiryReason(d.s()), At: d.time()}
	}
	if n := d.u(); n > 0 && d.err == nil {
		c.ExpiredTasks = make([]string, 0, min(n, 1024))
		for range n {
			c.ExpiredTasks = append(c.ExpiredTasks, d.s())
		}
	}
	c.ExpiresAt = d.time()
	c.NextDeadline = d.time()
	c.Deadlines = d.u()
	c.TaskSeq = d.u()
	if d.err != nil {
		return nil, fmt.Errorf("context %s: %w", id, d.err)
	}
	return c, nil
}

func encodeStream(e *enc, s *conversation.Stream) {
	e.bytes(s.Correlation)
	e.s(s.ResponseTopic)
	e.s(s.Requester)
	e.s(string(s.Method))
	e.s(s.MessageID)
	e.time(s.Since)
}

func decodeStream(d *dec) conversation.Stream {
	return conversation.Stream{Correlation: d.bytes(), ResponseTopic: d.s(), Requester: d.s(),
		Method: conversation.Method(d.s()), MessageID: d.s(), Since: d.time()}
}

// encodeTask encodes a task summary (its id is the record's key).
func encodeTask(t *conversation.Task) []byte {
	e := enc{b: make([]byte, 0, 64+len(t.MessageID)+len(t.StatusMessage)+len(t.Streams)*128)}
	e.byte(taskVersion)
	e.u(t.Seq)
	e.byte(stateCode(t.State))
	e.byte(stateCode(t.PrevState))
	e.time(t.CreatedAt)
	e.time(t.UpdatedAt)
	e.time(t.WaitingSince)
	e.s(t.MessageID)
	e.s(t.StatusMessage)
	e.u(uint64(len(t.Streams)))
	for i := range t.Streams {
		encodeStream(&e, &t.Streams[i])
	}
	if t.Notify != nil {
		e.byte(1)
		encodeStream(&e, t.Notify)
	} else {
		e.byte(0)
	}
	if h := t.Continuation; h != nil {
		e.byte(1)
		e.s(h.ExpectedInput)
		e.s(h.ResumeScope)
		e.s(h.HistoryPolicy)
		e.s(h.AcceptedHistoryDigest)
	} else {
		e.byte(0)
	}
	e.s(t.AgentTaskID)
	e.s(t.AgentContextID)
	return e.b
}

func decodeTask(id string, b []byte) (*conversation.Task, error) {
	d := dec{b: b}
	version := d.byte()
	if version != 1 && version != taskVersion {
		return nil, fmt.Errorf("task %s: record version: %w", id, errRecord)
	}
	t := &conversation.Task{ID: id}
	t.Seq = d.u()
	st, prev := d.byte(), d.byte()
	if int(st) >= len(states) || int(prev) >= len(states) {
		return nil, fmt.Errorf("task %s: state code: %w", id, errRecord)
	}
	t.State, t.PrevState = states[st], states[prev]
	t.CreatedAt = d.time()
	t.UpdatedAt = d.time()
	t.WaitingSince = d.time()
	t.MessageID = d.s()
	t.StatusMessage = d.s()
	if n := d.u(); n > 0 && d.err == nil {
		t.Streams = make([]conversation.Stream, 0, min(n, 64))
		for range n {
			t.Streams = append(t.Streams, decodeStream(&d))
		}
	}
	if d.byte() == 1 {
		s := decodeStream(&d)
		t.Notify = &s
	}
	if version >= 2 {
		if d.byte() == 1 {
			t.Continuation = &conversation.Continuation{ExpectedInput: d.s(), ResumeScope: d.s(), HistoryPolicy: d.s(), AcceptedHistoryDigest: d.s()}
		}
		t.AgentTaskID = d.s()
		t.AgentContextID = d.s()
	}
	if d.err != nil {
		return nil, fmt.Errorf("task %s: %w", id, d.err)
	}
	return t, nil
}
