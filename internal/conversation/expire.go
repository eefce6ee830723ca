package conversation

import (
	"fmt"
	"slices"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// TimedOut is a task the engine failed because it waited for input longer
// than Policy.InputRequiredTimeout. The agent still believes the task waits:
// the service should cancel it at the agent (CancelTask) so it frees what it
// holds.
type TimedOut struct {
	TaskID       string        `json:"taskId"`
	PrevState    a2a.TaskState `json:"prevState"`
	WaitingSince time.Time     `json:"waitingSince"`
	Deadline     time.Time     `json:"deadline"`
	// StatusMessage is the reason the task failed (its new StatusMessage).
	StatusMessage string `json:"statusMessage"`
	// Notify is where the requester got the input-required (nil when
	// unknown): the service tells it there that the task failed.
	Notify *Stream `json:"notify,omitempty"`
}

// Unacknowledged is a run (a new task or a resume) that got no event from
// the agent within Policy.FirstEventTimeout: no agent took the request. The
// engine undid it (a new task is removed, a resumed task waits again) and the
// service answers the requester on Streams that the agent is unavailable.
type Unacknowledged struct {
	TaskID    string
	MessageID string
	// Removed: the task was new and is gone; otherwise it waits again in
	// its previous state.
	Removed bool
	Streams []Stream
	Since   time.Time
}

// Expiration is what Expire did to one context.
type Expiration struct {
	ContextID string
	// Context is the state after expiry; nil when Delete.
	Context *Context
	// Changed: persist Context (or delete the record when Delete).
	Changed bool
	// Delete: the tombstone's retention ended; remove the record.
	Delete bool
	// TimedOut lists tasks failed by the input-required timeout.
	TimedOut []TimedOut
	// Unacknowledged lists runs undone by the first-event timeout.
	Unacknowledged []Unacknowledged
	// Expired is set when the context expired in this call: it is now a
	// tombstone and Dropped holds the tasks it had.
	Expired *Expiry
	// Dropped are the tasks of a context that just expired. Unfinished ones
	// may still run at the agent; the service may cancel them there.
	Dropped []Task
	// Forgotten are task ids the engine no longer knows: finished tasks
	// evicted from the history, or the tasks of a tombstone that was
	// deleted. A later request may reuse them as new tasks.
	Forgotten []string
}

// Expire applies time to one context: tasks waiting for input past the
// timeout fail, a context past its idle TTL or max age becomes a tombstone,
// and a tombstone past its retention is deleted. It is idempotent and cheap
// when nothing is due (c.NextDeadline tells when to call it next; Decide and
// Observe also apply it lazily, so correctness never depends on a sweeper's
// timing, only memory does).
func Expire(p Policy, now time.Time, c *Context) Expiration {
	x := Expiration{Context: c}
	if c == nil {
		return x
	}
	x.ContextID = c.ID
	if c.Expired != nil {
		x.endTombstone(p, now, c)
		return x
	}
	// Fast path: the stored deadlines were computed under p's durations
	// and none has passed (NextDeadline is the earliest of them all).
	fresh := c.Deadlines == p.fingerprint()
	if fresh && (c.NextDeadline.IsZero() || now.Before(c.NextDeadline)) {
		return x
	}
	n := x.timeOutInputs(p, now, c, nil) // copy-on-write: nil until something changes
	n = x.undoUnacknowledged(p, now, c, n)
	if x.Delete {
		return x
	}
	if n = x.expireContext(p, now, c, n); x.Delete {
		return x
	}
	if n == nil {
		// Nothing is due, but the policy changed since the context was
		// stored: keep its indexed deadlines truthful.
		if fresh {
			return x
		}
		n = c.Clone()
	}
	x.Forgotten = n.evict(p)
	n.refresh(p)
	x.Context, x.Changed = n, true
	return x
}

// endTombstone deletes a tombstone past its retention.
func (x *Expiration) endTombstone(p Policy, now time.Time, c *Context) {
	if !now.Before(c.Expired.At.Add(p.tombstoneTTL())) {
		x.Context, x.Changed, x.Delete = nil, true, true
		x.Forgotten = c.ExpiredTasks
	}
}

// timeOutInputs fails the tasks that waited for input past the policy's timeout. n is the
// copy of c being written (nil: none yet); it returns the copy, made if a task timed out.
func (x *Expiration) timeOutInputs(p Policy, now time.Time, c, n *Context) *Context {
	if p.InputRequiredTimeout <= 0 {
		return n
	}
	for i, t := range c.Tasks {
		if !interrupted(t.State) {
			continue
		}
		deadline := t.WaitingSince.Add(p.InputRequiredTimeout)
		if now.Before(deadline) {
			continue
		}
		if n == nil {
			n = c.Clone()
		}
		nt := n.own(i)
		nt.State = a2a.TaskStateFailed
		nt.StatusMessage = fmt.Sprintf("input-required timeout: no input within %s (waiting in %s since %s)",
			p.InputRequiredTimeout, t.State, t.WaitingSince.UTC().Format(time.RFC3339))
		x.TimedOut = append(x.TimedOut, TimedOut{TaskID: t.ID, PrevState: t.State, WaitingSince: t.WaitingSince,
			Deadline: deadline, StatusMessage: nt.StatusMessage, Notify: t.Notify})
		nt.Notify = nil
		nt.UpdatedAt = now
		nt.WaitingSince = time.Time{}
		nt.Streams = nil
	}
	return n
}

// undoUnacknowledged undoes the runs no agent acknowledged within the first-event timeout: a
// task that never ran is removed, a resumed one goes back to the state it was resumed from.
// It returns the copy of c being written; when the context is left empty it sets x.Delete.
func (x *Expiration) undoUnacknowledged(p Policy, now time.Time, c, n *Context) *Context {
	if p.FirstEventTimeout <= 0 || c.Working == 0 {
		return n
	}
	for i := 0; i < len(c.Tasks); i++ {
		t := c.Tasks[i]
		if n != nil {
			t = n.Tasks[i]
		}
		if t.State != a2a.TaskStateSubmitted || now.Before(t.UpdatedAt.Add(p.FirstEventTimeout)) {
			continue
		}
		if n == nil {
			n = c.Clone()
		}
		u := Unacknowledged{TaskID: t.ID, MessageID: t.MessageID, Streams: t.Streams, Since: t.UpdatedAt}
		n.Working--
		if t.PrevState == a2a.TaskStateUnspecified {
			u.Removed = true
			n.Tasks = slices.Delete(n.Tasks, i, i+1)
			i--
			if c != n && len(c.Tasks) != len(n.Tasks) {
				// indexes of c and n no longer line up: read n only
				c = n
			}
		} else {
			nt := n.own(i)
			nt.State, nt.PrevState = t.PrevState, a2a.TaskStateUnspecified
			nt.Streams = nil
			nt.UpdatedAt = now
		}
		x.Unacknowledged = append(x.Unacknowledged, u)
	}
	if n != nil && len(n.Tasks) == 0 {
		// Only a never-acknowledged first task leaves a context empty:
		// it never started, so it must not count as active.
		x.Context, x.Changed, x.Delete = nil, true, true
	}
	return n
}

// expireContext turns a context past its idle TTL or max age into a tombstone (deleted at once
// when the tombstone is over too, x.Delete). It returns the copy of c being written.
func (x *Expiration) expireContext(p Policy, now time.Time, c, n *Context) *Context {
	cur := c
	if n != nil {
		cur = n
	}
	e, expired := cur.expiry(p, now)
	if !expired {
		return n
	}
	if n == nil {
		n = c.Clone()
	}
	x.Expired = &e
	x.Dropped = make([]Task, len(n.Tasks))
	n.ExpiredTasks = make([]string, len(n.Tasks))
	for i, t := range n.Tasks {
		x.Dropped[i] = *t
		n.ExpiredTasks[i] = t.ID
	}
	n.Tasks = nil
	n.Working = 0
	n.Expired = &e
	if !now.Before(e.At.Add(p.tombstoneTTL())) {
		// Expired so long ago that the tombstone is over too (a sweep
		// that ran late): one call goes all the way.
		x.Context, x.Changed, x.Delete = nil, true, true
		x.Forgotten = n.ExpiredTasks
	}
	return n
}

// notable reports whether an expiration did more than refresh deadlines.
func (x *Expiration) notable() bool {
	return x.Delete || x.Expired != nil || len(x.TimedOut) > 0 || len(x.Unacknowledged) > 0
}
