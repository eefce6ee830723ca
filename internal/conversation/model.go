package conversation

import (
	"bytes"
	"slices"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// Method is an A2A v1.0 JSON-RPC method name as carried over MQTT.
type Method string

// The methods the engine rules on. Names are A2A v1.0's (pkg/a2amqtt uses the
// same strings); ParseMethod also accepts the A2A v0.3 names.
const (
	MethodSendMessage          Method = "SendMessage"
	MethodSendStreamingMessage Method = "SendStreamingMessage"
	MethodGetTask              Method = "GetTask"
	MethodListTasks            Method = "ListTasks"
	MethodCancelTask           Method = "CancelTask"
	MethodSubscribeToTask      Method = "SubscribeToTask"
)

// ParseMethod maps an A2A v1.0 or v0.3 method name to a Method. ok is false
// for methods the engine does not rule on (the service forwards those).
func ParseMethod(name string) (m Method, ok bool) {
	switch name {
	case string(MethodSendMessage), "message/send":
		return MethodSendMessage, true
	case string(MethodSendStreamingMessage), "message/stream":
		return MethodSendStreamingMessage, true
	case string(MethodGetTask), "tasks/get":
		return MethodGetTask, true
	case string(MethodListTasks), "tasks/list":
		return MethodListTasks, true
	case string(MethodCancelTask), "tasks/cancel":
		return MethodCancelTask, true
	case string(MethodSubscribeToTask), "tasks/resubscribe":
		return MethodSubscribeToTask, true
	}
	return Method(name), false
}

// ParseState maps an A2A v1.0 ("TASK_STATE_INPUT_REQUIRED") or v0.3
// ("input-required") task state to a2a-go's TaskState; unknown strings give
// TaskStateUnspecified, which the engine ignores.
func ParseState(s string) a2a.TaskState {
	switch a2a.TaskState(s) {
	case a2a.TaskStateSubmitted, a2a.TaskStateWorking, a2a.TaskStateInputRequired,
		a2a.TaskStateAuthRequired, a2a.TaskStateCompleted, a2a.TaskStateFailed,
		a2a.TaskStateCanceled, a2a.TaskStateRejected:
		return a2a.TaskState(s)
	}
	switch strings.ToLower(s) {
	case "submitted":
		return a2a.TaskStateSubmitted
	case "working":
		return a2a.TaskStateWorking
	case "input-required":
		return a2a.TaskStateInputRequired
	case "auth-required":
		return a2a.TaskStateAuthRequired
	case "completed":
		return a2a.TaskStateCompleted
	case "failed":
		return a2a.TaskStateFailed
	case "canceled", "cancelled":
		return a2a.TaskStateCanceled
	case "rejected":
		return a2a.TaskStateRejected
	}
	return a2a.TaskStateUnspecified
}

// active reports whether a task in state s holds a concurrency slot: the
// agent is (or is about to be) working on it.
func active(s a2a.TaskState) bool {
	return s == a2a.TaskStateSubmitted || s == a2a.TaskStateWorking
}

// interrupted reports whether s is a state in which the task waits for the
// requester (profile: stream-final, resumable with the same task id).
func interrupted(s a2a.TaskState) bool {
	return s == a2a.TaskStateInputRequired || s == a2a.TaskStateAuthRequired
}

// ExpiryReason says which policy window expired a context. The values are
// the wire values of error.data.reason.
type ExpiryReason string

// Expiry reasons.
const (
	ExpiredIdleTTL ExpiryReason = "idle_ttl"
	ExpiredMaxAge  ExpiryReason = "max_age"
)

// Expiry records why and when a context expired.
type Expiry struct {
	Reason ExpiryReason `json:"reason"`
	At     time.Time    `json:"at"`
}

// Stream is one reply stream (one MQTT correlation) the service relays for a
// task: where replies go and which message started it. It is persisted so a
// restarted service replica can still route the agent's late replies.
type Stream struct {
	Correlation   []byte    `json:"correlation"`
	ResponseTopic string    `json:"responseTopic,omitempty"`
	Requester     string    `json:"requester,omitempty"`
	Method        Method    `json:"method"`
	MessageID     string    `json:"messageId,omitempty"`
	Since         time.Time `json:"since"`
}

// Task is the engine's summary of one A2A task: enough to rule on the next
// message, not the task's content (artifacts and messages stay with the
// agent).
type Task struct {
	ID        string        `json:"id"`
	State     a2a.TaskState `json:"state"`
	CreatedAt time.Time     `json:"createdAt"`
	UpdatedAt time.Time     `json:"updatedAt"`
	// WaitingSince is when the task entered input-required/auth-required;
	// the input-required timeout counts from it.
	WaitingSince time.Time `json:"waitingSince,omitzero"`
	// MessageID is the message that started the current run (first turn or
	// last resume); a send repeating it is a retry, not a new turn.
	MessageID string `json:"messageId,omitempty"`
	// PrevState is the state before the current run started (unspecified
	// for a new task); an agent error before any event reverts to it.
	PrevState a2a.TaskState `json:"prevState,omitempty"`
	// Streams are the live reply streams of the task.
	Streams []Stream `json:"streams,omitempty"`
	// StatusMessage explains a state the engine itself set (input-required
	// timeout).
	StatusMessage string `json:"statusMessage,omitempty"`
	// Seq orders the tasks of a context (Context.TaskSeq when it was
	// created), so a store that keeps one record per task can rebuild
	// Context.Tasks in order.
	Seq uint64 `json:"seq,omitempty"`
	// Notify is the stream on which the task's last input-required or
	// auth-required was relayed: the requester that got it is told there
	// if the engine later fails the task (input-required timeout).
	Notify *Stream `json:"notify,omitempty"`
	// Continuation is the hint of the task's last input-required or
	// auth-required status (nil: none), with the accepted_history_digest
	// the service stamped into it. While the task waits, the next message
	// must fit it (resume_scope, expected_input). Never mutated in place.
	Continuation *Continuation `json:"continuation,omitempty"`
	// AgentTaskID and AgentContextID are the ids the agent uses for this
	// task when they differ from the requester's: a core A2A server creates
	// its own task ids (issue 12.5). The service translates between them.
	AgentTaskID    string `json:"agentTaskId,omitempty"`
	AgentContextID string `json:"agentContextId,omitempty"`
}

// Terminal reports whether the task is completed, failed, canceled or
// rejected (A2A v1.0: accepts no further messages).
func (t *Task) Terminal() bool { return t.State.Terminal() }

// Tracks reports whether a reply stream with this (requester's) correlation data is open: its
// route has not ended. A reply on a route that ended (a replay) is not the task's any more.
func (t *Task) Tracks(correlation []byte) bool { return t.stream(correlation) >= 0 }

func (t *Task) stream(correlation []byte) int {
	return slices.IndexFunc(t.Streams, func(s Stream) bool { return bytes.Equal(s.Correlation, correlation) })
}

// Context is one conversation (A2A contextId) of one agent with the
// summaries of its most recent tasks, oldest first.
type Context struct {
	ID           string    `json:"id"`
	CreatedAt    time.Time `json:"createdAt"`
	LastActivity time.Time `json:"lastActivity"`
	// Requester is who opened the context: its live contexts count against
	// that caller's share of the agent (Policy.CallerShare).
	Requester string `json:"requester,omitempty"`
	// Tasks are shared between a context and its copies (copy-on-write per
	// task, see own): never modify a *Task reached from a stored context.
	Tasks []*Task `json:"tasks,omitempty"`
	// Working counts tasks in submitted/working: the concurrency slots in
	// use. Kept as a counter so the limit check is O(1); the property tests
	// check it against a recount.
	Working int `json:"working"`
	// Expired is set once the context expired: it is then a tombstone
	// without tasks, kept for Policy.TombstoneTTL to answer "expired".
	Expired *Expiry `json:"expired,omitempty"`
	// ExpiredTasks are the ids of the tasks a tombstone had: they stay
	// indexed so a late resume that names only its task id still gets
	// "context expired", and a task id can't be reused in another context
	// while the tombstone lasts.
	ExpiredTasks []string `json:"expiredTasks,omitempty"`
	// ExpiresAt is when the context will expire under the policy in force
	// when it was last changed (zero: never, or already expired). Stores
	// index it to count live contexts.
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	// NextDeadline is the earliest time Expire has something to do: context
	// expiry, an input-required timeout, or the end of a tombstone. Stores
	// index it for the sweeper. Zero: nothing scheduled.
	NextDeadline time.Time `json:"nextDeadline,omitzero"`
	// Deadlines is the fingerprint of the policy durations ExpiresAt and
	// NextDeadline were computed with; a different policy recomputes them.
	Deadlines uint64 `json:"deadlines,omitempty"`
	// TaskSeq is the Seq of the next task created in the context.
	TaskSeq uint64 `json:"taskSeq,omitempty"`
}

// Task returns the task with the given id, or nil.
func (c *Context) Task(id string) *Task {
	if c == nil {
		return nil
	}
	for _, t := range c.Tasks {
		if t.ID == id {
			return t
		}
	}
	return nil
}

// index returns the position of task id in c.Tasks, or -1.
func (c *Context) index(id string) int {
	for i, t := range c.Tasks {
		if t.ID == id {
			return i
		}
	}
	return -1
}

// own replaces task i of a cloned context by a private copy and returns it:
// the per-task copy-on-write step. Only call it on a context returned by
// Clone (or built by the engine), never on a stored one.
func (c *Context) own(i int) *Task {
	t := *c.Tasks[i]
	t.Streams = slices.Clone(t.Streams)
	c.Tasks[i] = &t
	return &t
}

// Live reports whether the context holds a conversation at now: it exists,
// is not a tombstone, and its expiry (under p) has not passed.
func (c *Context) Live(p Policy, now time.Time) bool {
	if c == nil || c.Expired != nil {
		return false
	}
	_, expired := c.expiry(p, now)
	return !expired
}

// expiry returns the earliest expiry under p that has passed at now.
func (c *Context) expiry(p Policy, now time.Time) (Expiry, bool) {
	var e Expiry
	found := false
	if p.IdleTTL > 0 {
		if at := c.LastActivity.Add(p.IdleTTL); !now.Before(at) {
			e, found = Expiry{Reason: ExpiredIdleTTL, At: at}, true
		}
	}
	if p.MaxAge > 0 {
		if at := c.CreatedAt.Add(p.MaxAge); !now.Before(at) && (!found || at.Before(e.At)) {
			e, found = Expiry{Reason: ExpiredMaxAge, At: at}, true
		}
	}
	return e, found
}

// Clone returns a copy whose task list can be changed; the tasks themselves
// stay shared until own copies one (copy-on-write keeps the allocation of a
// decision small, which keeps GC assists, and so tail latency, low).
func (c *Context) Clone() *Context {
	if c == nil {
		return nil
	}
	n := *c
	if c.Expired != nil {
		e := *c.Expired
		n.Expired = &e
	}
	n.ExpiredTasks = slices.Clone(c.ExpiredTasks)
	if c.Tasks == nil {
		return &n
	}
	n.Tasks = make([]*Task, len(c.Tasks), len(c.Tasks)+1)
	copy(n.Tasks, c.Tasks)
	return &n
}

// DeepClone returns a copy sharing nothing with c (tests, callers that
// want to modify a context outside the engine).
func (c *Context) DeepClone() *Context {
	n := c.Clone()
	if n == nil {
		return nil
	}
	for i := range n.Tasks {
		t := n.own(i)
		for j := range t.Streams {
			t.Streams[j].Correlation = bytes.Clone(t.Streams[j].Correlation)
		}
	}
	return n
}

// refresh recomputes ExpiresAt and NextDeadline under p. Every function that
// returns a changed context calls it last, so the stored indexes always
// match the stored record.
func (c *Context) refresh(p Policy) {
	c.Deadlines = p.fingerprint()
	if c.Expired != nil {
		c.ExpiresAt = time.Time{}
		c.NextDeadline = c.Expired.At.Add(p.tombstoneTTL())
		return
	}
	var exp time.Time
	if p.IdleTTL > 0 {
		exp = c.LastActivity.Add(p.IdleTTL)
	}
	if p.MaxAge > 0 {
		if m := c.CreatedAt.Add(p.MaxAge); exp.IsZero() || m.Before(exp) {
			exp = m
		}
	}
	c.ExpiresAt = exp
	next := exp
	if p.InputRequiredTimeout > 0 || (p.FirstEventTimeout > 0 && c.Working > 0) {
		for _, t := range c.Tasks {
			var dl time.Time
			switch {
			case p.InputRequiredTimeout > 0 && interrupted(t.State):
				dl = t.WaitingSince.Add(p.InputRequiredTimeout)
			case p.FirstEventTimeout > 0 && t.State == a2a.TaskStateSubmitted:
				dl = t.UpdatedAt.Add(p.FirstEventTimeout)
			default:
				continue
			}
			if next.IsZero() || dl.Before(next) {
				next = dl
			}
		}
	}
	c.NextDeadline = next
}

// evict drops the oldest finished tasks while the context holds more than
// the history bound. Unfinished tasks are never evicted: they are the live
// state the rules depend on.
func (c *Context) evict(p Policy) (evicted []string) {
	limit := p.history()
	for len(c.Tasks) > limit {
		i := slices.IndexFunc(c.Tasks, func(t *Task) bool { return t.Terminal() })
		if i < 0 {
			return evicted
		}
		evicted = append(evicted, c.Tasks[i].ID)
		c.Tasks = slices.Delete(c.Tasks, i, i+1)
	}
	return evicted
}

// TaskIDs returns the task ids a store indexes for c: its tasks, or a
// tombstone's ExpiredTasks.
func (c *Context) TaskIDs() []string {
	if c == nil {
		return nil
	}
	if c.Expired != nil {
		return c.ExpiredTasks
	}
	ids := make([]string, len(c.Tasks))
	for i, t := range c.Tasks {
		ids[i] = t.ID
	}
	return ids
}

// TaskDiff returns the indexed task ids (TaskIDs) present in after but not
// before (added) and in before but not after (removed). Stores use it to
// keep their task-id index in step with a context; either may be nil.
func TaskDiff(before, after *Context) (added, removed []string) {
	if before != nil && after != nil && before.Expired == nil && after.Expired == nil {
		return diffIDs(len(before.Tasks), func(i int) string { return before.Tasks[i].ID },
			len(after.Tasks), func(i int) string { return after.Tasks[i].ID })
	}
	b, a := before.TaskIDs(), after.TaskIDs()
	return diffIDs(len(b), func(i int) string { return b[i] }, len(a), func(i int) string { return a[i] })
}

// mentions reports whether any of ids is among the n ids of list.
func mentions(ids []string, n int, list func(int) string) bool {
	for i := 0; i < n; i++ {
		if slices.Contains(ids, list(i)) {
			return true
		}
	}
	return false
}

func diffIDs(nb int, b func(int) string, na int, a func(int) string) (added, removed []string) {
	// The engine only appends tasks and deletes some, so after is before
	// minus removals plus a suffix: one merge pass finds both in O(n).
	j := 0
	for i := 0; i < nb; i++ {
		if j < na && a(j) == b(i) {
			j++
			continue
		}
		removed = append(removed, b(i))
	}
	for ; j < na; j++ {
		added = append(added, a(j))
	}
	if len(added) == 0 || len(removed) == 0 {
		return added, removed
	}
	// Both non-empty (a context at its task cap gains one and drops the
	// oldest: every turn of a long conversation): the pass is exact unless
	// the lists were reordered, which shows an id in both. Check that
	// directly while it is cheap; only reordered or long lists pay for sets.
	if len(added)*nb+len(removed)*na <= 1024 && !mentions(removed, na, a) && !mentions(added, nb, b) {
		return added, removed
	}
	// Reordered lists (not produced by the engine): recompute exactly with sets.
	inB := make(map[string]bool, nb)
	for i := 0; i < nb; i++ {
		inB[b(i)] = true
	}
	inA := make(map[string]bool, na)
	for i := 0; i < na; i++ {
		inA[a(i)] = true
	}
	added, removed = added[:0], removed[:0]
	for i := 0; i < na; i++ {
		if !inB[a(i)] {
			added = append(added, a(i))
		}
	}
	for i := 0; i < nb; i++ {
		if !inA[b(i)] {
			removed = append(removed, b(i))
		}
	}
	return added, removed
}
