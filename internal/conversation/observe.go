package conversation

import (
	"slices"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// EventKind classifies a reply from the agent.
type EventKind string

// Event kinds.
const (
	// EventStatus is a TaskStatusUpdateEvent (stream item).
	EventStatus EventKind = "status"
	// EventArtifact is a TaskArtifactUpdateEvent: activity, no state change.
	EventArtifact EventKind = "artifact"
	// EventTask is a Task object: a unary result (SendMessage, GetTask,
	// CancelTask) or the first item of a stream.
	EventTask EventKind = "task"
	// EventMessage is a direct Message result: the agent answered without
	// keeping a task running, so the run is complete (as pkg/a2amqtt's
	// bridge records it).
	EventMessage EventKind = "message"
	// EventError is a JSON-RPC error reply.
	EventError EventKind = "error"
)

// Event is what the engine needs of one reply the agent published.
type Event struct {
	Kind      EventKind
	TaskID    string
	ContextID string
	// State is the task state for EventStatus/EventTask (v0.3 names:
	// convert with ParseState).
	State       a2a.TaskState
	Correlation []byte
	// Final marks the last reply of its correlation (a unary result, or a
	// stream the transport saw end). Terminal and interrupted states end a
	// stream anyway.
	Final bool
	// Snapshot: a Task object opening a stream (core A2A servers send the
	// task as it stands first; on a resume it still shows input-required).
	// Unless terminal, it only acknowledges the run.
	Snapshot bool
	// Continuation is the hint of an input-required/auth-required status
	// (with the service's digest), recorded with the task.
	Continuation *Continuation
	// AgentTaskID and AgentContextID are the ids the agent's reply used when
	// they differ from the requester's (a core A2A server's own task ids).
	AgentTaskID, AgentContextID string
}

// Outcome is what Observe did with a reply event. The service relays the
// event to the requester whatever the outcome: the engine never blocks
// replies, it only learns from them.
type Outcome struct {
	// Known: the event's task is tracked in a live context.
	Known bool
	// Context is the context after the event; nil when none or Delete.
	Context *Context
	// Changed: persist Context (or delete the stored record when Delete).
	Changed bool
	// Delete: the context lost its only task (the agent refused the first
	// message) and is removed.
	Delete bool
	// Task is the task after the event (nil when unknown or removed).
	Task *Task
	// Stream is the tracked stream of the event's correlation (its
	// Response Topic is where the reply goes), nil when untracked.
	Stream *Stream
	// StreamEnded: this reply ended Stream.
	StreamEnded bool
	// SlotFreed: the task left submitted/working, freeing a concurrency
	// slot of the context.
	SlotFreed bool
	// Expirations are time-driven changes applied first (see Decide).
	Expirations []Expiration
}

// Observe applies one reply event to the context that holds its task. It
// never mutates c. A terminal state frees the task's slot at once, so a
// follow-up that the requester sends the instant it sees the completion is
// not refused by MaxConcurrentTasksPerContext: the reverse proxy observes
// the completion before relaying it.
func Observe(p Policy, now time.Time, c *Context, ev Event) Outcome {
	o := Outcome{Context: c}
	if c != nil {
		if x := Expire(p, now, c); x.Changed {
			if x.notable() {
				o.Expirations = append(o.Expirations, x)
			}
			o.Changed = true
			c = x.Context
			o.Context = c
		}
	}
	if c == nil || c.Expired != nil {
		o.Delete = o.Changed && o.Context == nil
		return o
	}
	i := c.index(ev.TaskID)
	if i < 0 {
		return o
	}
	o.Known = true
	n := c.Clone()
	t := n.own(i)
	si := -1
	if ev.Correlation != nil {
		si = t.stream(ev.Correlation)
	}
	if si >= 0 {
		s := t.Streams[si]
		o.Stream = &s
	}
	wasActive := active(t.State)
	mapped := mapAgentIDs(t, ev)
	endStream, remove := applyEvent(t, ev, si, now)
	o.StreamEnded = endStreams(t, si, endStream)
	if !remove && onlyActivityMoved(p, now, c, c.Tasks[i], t, mapped) {
		// Nothing but the activity clock moved, and it moved less than the idle TTL could
		// notice: skip the write. Streams of artifact chunks would otherwise cost one store
		// write each.
		o.Task = c.Tasks[i]
		return o
	}
	return commitObserved(p, now, n, i, t, remove, wasActive, o)
}

// mapAgentIDs records the agent's own task and context ids an event names; it reports whether
// they are new.
func mapAgentIDs(t *Task, ev Event) (mapped bool) {
	if ev.AgentTaskID != "" && ev.AgentTaskID != t.AgentTaskID {
		t.AgentTaskID, mapped = ev.AgentTaskID, true
	}
	if ev.AgentContextID != "" && ev.AgentContextID != t.AgentContextID {
		t.AgentContextID, mapped = ev.AgentContextID, true
	}
	return mapped
}

// applyEvent moves task t (its own copy) by one event on stream si (-1: unknown). It reports
// whether the event ends its stream and whether the task must be removed (the agent refused
// the first message of a task that never ran).
func applyEvent(t *Task, ev Event, si int, now time.Time) (endStream, remove bool) {
	endStream = ev.Final
	switch ev.Kind {
	case EventStatus, EventTask:
		if applyState(t, ev, si, now) {
			endStream = true
		}
	case EventArtifact:
		if t.State == a2a.TaskStateSubmitted {
			// An artifact acknowledges the run as well as a status does.
			t.State = a2a.TaskStateWorking
		}
	case EventMessage:
		if !t.Terminal() {
			t.State = a2a.TaskStateCompleted
			t.WaitingSince = time.Time{}
		}
		endStream = true
	case EventError:
		endStream = true
		// The agent refused the message that started this run before
		// reporting any state (it is still submitted): undo the run, so a
		// refused first message leaves no task and a refused resume leaves
		// the task waiting as before.
		if t.State == a2a.TaskStateSubmitted && si == 0 {
			if t.PrevState == a2a.TaskStateUnspecified {
				remove = true
			} else {
				t.State = t.PrevState
				t.PrevState = a2a.TaskStateUnspecified
			}
		}
	}
	return endStream, remove
}

// applyState applies a status (or task snapshot) event; it reports whether it ends the stream
// (a pause or a terminal state).
func applyState(t *Task, ev Event, si int, now time.Time) (endStream bool) {
	s := ev.State
	if s == a2a.TaskStateUnspecified || t.Terminal() {
		// Terminal is final: a late or replayed event cannot reopen a
		// task (nor take a slot again).
		return false
	}
	if s == a2a.TaskStateSubmitted || (ev.Snapshot && !s.Terminal()) {
		// The agent has the task: "submitted" from the agent, or the
		// task snapshot a core A2A server opens a stream with (on a
		// resume it still shows the state before the answer), only
		// acknowledges the run; it neither pauses nor ends it.
		if active(t.State) {
			t.State = a2a.TaskStateWorking
		}
		return false
	}
	switch {
	case interrupted(s):
		if !interrupted(t.State) {
			t.WaitingSince = now
		}
		t.Continuation = ev.Continuation
		switch {
		case si >= 0:
			n := t.Streams[si]
			t.Notify = &n
		case len(t.Streams) > 0:
			n := t.Streams[0]
			t.Notify = &n
		}
		endStream = true
	case s.Terminal():
		t.WaitingSince = time.Time{}
		endStream = true
	default:
		t.WaitingSince = time.Time{}
	}
	t.State = s
	return endStream
}

// endStreams closes the streams an event ended and reports whether the event's own stream
// ended: every stream when the run is over (finished or waiting for input: retries' streams
// too), else the event's stream when the event ends it.
func endStreams(t *Task, si int, endStream bool) (ended bool) {
	if !active(t.State) {
		ended = len(t.Streams) > 0 && si >= 0
		t.Streams = nil
		return ended
	}
	if endStream && si >= 0 {
		t.Streams = slices.Delete(t.Streams, si, si+1)
		return true
	}
	return false
}

// onlyActivityMoved reports whether an event changed nothing of task t (was old) but the
// activity clock, by less than the idle TTL can notice.
func onlyActivityMoved(p Policy, now time.Time, c *Context, old, t *Task, mapped bool) bool {
	return !mapped && t.State == old.State && t.PrevState == old.PrevState && t.WaitingSince.Equal(old.WaitingSince) &&
		t.Continuation == old.Continuation && len(t.Streams) == len(old.Streams) && now.Sub(c.LastActivity) < activityResolution(p)
}

// commitObserved finishes the new context n after an event on its task i (t, or removed): the
// working count, the activity clock, eviction and the derived fields.
func commitObserved(p Policy, now time.Time, n *Context, i int, t *Task, remove, wasActive bool, o Outcome) Outcome {
	if remove {
		n.Tasks = slices.Delete(n.Tasks, i, i+1)
		t = nil
	} else {
		t.UpdatedAt = now
	}
	nowActive := t != nil && active(t.State)
	switch {
	case wasActive && !nowActive:
		n.Working--
		o.SlotFreed = true
	case !wasActive && nowActive:
		n.Working++
	}
	n.LastActivity = now
	if len(n.Tasks) == 0 {
		// Only a refused first message empties a context: it never
		// started, so it must not count as an active context.
		o.Context, o.Changed, o.Delete = nil, true, true
		return o
	}
	var id string
	if t != nil {
		id = t.ID
	}
	n.evict(p)
	n.refresh(p)
	o.Context, o.Changed = n, true
	o.Task = n.Task(id)
	return o
}

// activityResolution is how stale LastActivity may get before an event that
// changes nothing else is written: a second, or a tenth of a short idle TTL.
func activityResolution(p Policy) time.Duration {
	r := time.Second
	if p.IdleTTL > 0 && p.IdleTTL/10 < r {
		r = p.IdleTTL / 10
	}
	return r
}
