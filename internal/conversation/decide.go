package conversation

import (
	"bytes"
	"fmt"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// Request is what the engine needs of one JSON-RPC request to an agent.
type Request struct {
	Method Method
	// TaskID and ContextID are params.message.taskId/contextId for the send
	// methods, params.id (task id) for GetTask/CancelTask/SubscribeToTask and
	// params.contextId for ListTasks.
	TaskID    string
	ContextID string
	// MessageID is params.message.messageId (send methods); a send that
	// repeats the message a task is running is a retry, not a new turn.
	MessageID string
	// Correlation is the MQTT Correlation Data; ResponseTopic the MQTT
	// Response Topic. Both are recorded so replies can be routed after a
	// restart.
	Correlation   []byte
	ResponseTopic string
	// Requester identifies the caller (for example its MQTT client id).
	Requester string
	// Approval: the message carries an approval answer (an approve/deny
	// data part), which a task waiting with expected_input approval needs.
	Approval bool
}

// View is the stored state a decision needs: one context and two agent-wide
// facts. A store builds it inside its atomic check-and-update.
type View struct {
	// ContextID is the context the view was loaded for: the request's
	// contextId, or the task's context when the request carried none.
	ContextID string
	// Context is the stored context (nil: unknown). Never mutated.
	Context *Context
	// TaskContextID is the context that holds Request.TaskID in the store
	// ("" when the task is unknown).
	TaskContextID string
	// LiveContexts is how many unexpired contexts the agent holds now.
	LiveContexts int
	// CallerContexts is how many of them Request.Requester opened, and
	// Callers how many distinct requesters opened them, the request's own
	// counted even when it holds none (the fair share, Policy.CallerShare).
	CallerContexts, Callers int
}

// Kind classifies a decision.
type Kind string

// Decision kinds.
const (
	// KindNewContext: unknown context, the request starts it (no error).
	KindNewContext Kind = "new_context"
	// KindNewTask: a new task in a known context (a follow-up turn).
	KindNewTask Kind = "new_task"
	// KindResume: a new message for an input-required/auth-required task.
	KindResume Kind = "resume"
	// KindRetry: a repeat of the message the task is running or ran. With
	// Forward false it is a duplicate delivery of a tracked correlation:
	// its replies already flow, drop it. With Forward true (fresh
	// correlation) forward it: the agent deduplicates by task id and answers
	// with the task's state.
	KindRetry Kind = "retry"
	// KindRead: GetTask/ListTasks, forwarded unchanged.
	KindRead Kind = "read"
	// KindCancel: CancelTask of an unfinished (or unknown) task, forwarded;
	// the canceled reply frees the slot.
	KindCancel Kind = "cancel"
	// KindSubscribe: SubscribeToTask, forwarded; the stream is tracked.
	KindSubscribe Kind = "subscribe"
	// KindPassthrough: a method the engine does not rule on.
	KindPassthrough Kind = "passthrough"
	// KindReject: answer Err, do not forward.
	KindReject Kind = "reject"
)

// Decision is the engine's ruling on a request.
type Decision struct {
	Kind Kind
	// Forward: send the request to the agent.
	Forward bool
	// Err is the rejection (Kind == KindReject).
	Err *Error
	// Context is the context after the decision (nil: none). It is the
	// stored pointer when nothing changed.
	Context *Context
	// Changed: persist Context (or delete the stored record when Delete).
	Changed bool
	// Delete: the stored record must be removed (a tombstone's retention
	// ended and nothing replaced it).
	Delete bool
	// Task is the addressed task after the decision (nil when unknown).
	Task *Task
	// Expirations are time-driven changes applied before ruling (input
	// timeouts, context expiry) that the service may act on.
	Expirations []Expiration
}

// Decide rules on one request against the stored view. It never mutates
// v.Context.
func Decide(p Policy, now time.Time, v View, req Request) Decision {
	d := Decision{Context: v.Context}
	c := v.Context
	if c != nil {
		if x := Expire(p, now, c); x.Changed {
			if x.notable() {
				d.Expirations = append(d.Expirations, x)
			}
			d.Changed = true
			c = x.Context
			d.Context = c
		}
	}
	var t *Task
	taskCtx := v.TaskContextID
	if req.TaskID != "" {
		if t = c.Task(req.TaskID); t != nil {
			taskCtx = c.ID
		}
	}

	switch req.Method {
	case MethodSendMessage, MethodSendStreamingMessage:
		decideSend(p, now, v, req, c, t, taskCtx, &d)
	case MethodGetTask, MethodListTasks:
		d.Kind, d.Forward = KindRead, true
	case MethodCancelTask:
		if t != nil && t.Terminal() {
			d.reject(a2aError(now, a2a.ErrTaskNotCancelable,
				fmt.Sprintf("task %s is in terminal state %s and cannot be canceled", t.ID, t.State),
				map[string]any{"taskId": t.ID, "state": string(t.State)}))
			break
		}
		d.Kind, d.Forward = KindCancel, true
	case MethodSubscribeToTask:
		if t != nil && t.Terminal() {
			// A2A v1.0: subscribing to a task in a terminal state is an
			// unsupported operation; GetTask returns its final state.
			d.reject(a2aError(now, a2a.ErrUnsupportedOperation,
				fmt.Sprintf("task %s is in terminal state %s; there is nothing to subscribe to, use GetTask", t.ID, t.State),
				map[string]any{"taskId": t.ID, "state": string(t.State)}))
			break
		}
		d.Kind, d.Forward = KindSubscribe, true
		if t != nil && req.Correlation != nil && t.stream(req.Correlation) < 0 {
			n := c.Clone()
			nt := n.own(n.index(t.ID))
			nt.addStream(p, req, now)
			n.refresh(p)
			t = nt
			d.Context, d.Changed = n, true
		}
	default:
		d.Kind, d.Forward = KindPassthrough, true
	}
	if d.Kind != KindReject && d.Task == nil && t != nil {
		d.Task = t
	}
	d.Delete = d.Changed && d.Context == nil
	return d
}

func (d *Decision) reject(e *Error) {
	d.Kind, d.Forward, d.Err = KindReject, false, e
}

func decideSend(p Policy, now time.Time, v View, req Request, c *Context, t *Task, taskCtx string, d *Decision) {
	ctxID, e := sendContextID(p, now, v, req, c, taskCtx)
	if e != nil {
		d.reject(e)
		return
	}
	switch {
	case t == nil:
		decideNewTask(p, now, v, req, c, ctxID, d)
	case t.Terminal():
		decideTerminal(now, req, c, t, d)
	case interrupted(t.State):
		decideResume(p, now, req, c, t, d)
	default: // submitted or working
		decideRunning(p, now, req, c, t, d)
	}
}

// sendContextID checks a send's ids and returns the context it addresses (the task's, when the
// task is known), or the error that refuses it.
func sendContextID(p Policy, now time.Time, v View, req Request, c *Context, taskCtx string) (string, *Error) {
	if req.TaskID == "" {
		return "", errInvalidParams(now, "message.taskId is required: over MQTT the requester creates task ids (A2A over MQTT profile)", nil)
	}
	if req.MessageID == "" {
		return "", errInvalidParams(now, "message.messageId is required", map[string]any{"taskId": req.TaskID})
	}
	ctxID := req.ContextID
	if taskCtx != "" {
		if ctxID != "" && ctxID != taskCtx {
			return "", errContextMismatch(now, req.TaskID, taskCtx, ctxID)
		}
		ctxID = taskCtx
	}
	if ctxID == "" {
		return "", errInvalidParams(now,
			fmt.Sprintf("message.contextId is required to start task %s: over MQTT the requester creates context ids (A2A over MQTT profile)", req.TaskID),
			map[string]any{"taskId": req.TaskID})
	}
	if v.ContextID != "" && v.ContextID != ctxID {
		// The caller loaded the wrong context; refusing beats corrupting it.
		return "", a2aError(now, a2a.ErrInternalError,
			fmt.Sprintf("internal error: state of context %q loaded for a request in context %q", v.ContextID, ctxID), nil)
	}
	if c != nil && c.Expired != nil {
		return "", errContextExpired(ctxID, *c.Expired, p)
	}
	return ctxID, nil
}

// decideTerminal: a send to a finished task is refused, unless it repeats the message that
// finished it (its reply was lost; the agent answers the repeat with the finished task).
func decideTerminal(now time.Time, req Request, c *Context, t *Task, d *Decision) {
	if req.MessageID == t.MessageID {
		d.Kind, d.Forward = KindRetry, true
		return
	}
	d.reject(errTerminalTask(now, t, c.ID))
}

// decideResume: a send to a task waiting for input resumes it, within the context's limit of
// concurrent tasks.
func decideResume(p Policy, now time.Time, req Request, c *Context, t *Task, d *Decision) {
	if req.MessageID == t.MessageID {
		d.Kind, d.Forward = KindRetry, true
		return
	}
	if e := resumeMismatch(c, t, req); e != nil {
		// Before the limit: waiting would not make this answer fit.
		d.reject(e)
		return
	}
	if limit := p.MaxConcurrentTasksPerContext; limit > 0 && c.Working >= limit {
		d.reject(errContextBusy(c, limit))
		return
	}
	n := c.Clone()
	nt := n.own(n.index(t.ID))
	nt.PrevState = nt.State
	nt.State = a2a.TaskStateSubmitted
	nt.MessageID = req.MessageID
	nt.UpdatedAt = now
	nt.Streams = nil
	nt.Notify = nil
	nt.addStream(p, req, now)
	n.Working++
	n.LastActivity = now
	n.refresh(p)
	d.accept(KindResume, n, nt)
}

// decideRunning: a send to a task in a run is a redelivery or a retry of the message that
// started the run; any other message is refused (the task is busy).
func decideRunning(p Policy, now time.Time, req Request, c *Context, t *Task, d *Decision) {
	if req.Correlation != nil && t.stream(req.Correlation) >= 0 {
		// QoS 1 redelivery of a request already forwarded: its
		// replies are flowing on that correlation.
		d.Kind, d.Forward = KindRetry, false
		return
	}
	if req.MessageID != t.MessageID {
		d.reject(errTaskBusy(c, t))
		return
	}
	// The requester retried with fresh correlation data (profile
	// retry rule). Forward; track the new stream too.
	n := c.Clone()
	nt := n.own(n.index(t.ID))
	nt.addStream(p, req, now)
	n.refresh(p)
	d.Kind, d.Forward = KindRetry, true
	d.Context, d.Changed, d.Task = n, true, nt
}

// decideNewTask: a send naming an unknown task starts it, in a new context within the agent's
// and the caller's limits of live contexts, or in an existing one within its limit of
// concurrent tasks.
func decideNewTask(p Policy, now time.Time, v View, req Request, c *Context, ctxID string, d *Decision) {
	kind := KindNewTask
	var n *Context
	if c == nil {
		if l := p.MaxActiveContextsPerAgent; l > 0 && v.LiveContexts >= l {
			d.reject(errActiveContexts(ctxID, v.LiveContexts, l))
			return
		}
		if l := p.CallerShare(v.Callers); l > 0 && v.CallerContexts >= l {
			d.reject(errCallerContexts(ctxID, req.Requester, v.CallerContexts, l))
			return
		}
		kind = KindNewContext
		n = &Context{ID: ctxID, CreatedAt: now, Requester: req.Requester}
	} else {
		if e := newTaskMismatch(c); e != nil {
			d.reject(e)
			return
		}
		if limit := p.MaxConcurrentTasksPerContext; limit > 0 && c.Working >= limit {
			d.reject(errContextBusy(c, limit))
			return
		}
		n = c.Clone()
	}
	nt := &Task{
		ID:        req.TaskID,
		State:     a2a.TaskStateSubmitted,
		CreatedAt: now,
		UpdatedAt: now,
		MessageID: req.MessageID,
		Seq:       n.TaskSeq,
	}
	n.TaskSeq++
	nt.addStream(p, req, now)
	n.Tasks = append(n.Tasks, nt)
	n.Working++
	n.LastActivity = now
	n.evict(p)
	n.refresh(p)
	d.accept(kind, n, n.Task(req.TaskID))
}

func (d *Decision) accept(k Kind, n *Context, t *Task) {
	d.Kind, d.Forward = k, true
	d.Context, d.Changed, d.Task = n, true, t
}

// addStream tracks a reply stream, dropping the oldest past the bound.
func (t *Task) addStream(p Policy, req Request, now time.Time) {
	if req.Correlation == nil {
		return
	}
	if t.stream(req.Correlation) >= 0 {
		return
	}
	if limit := p.maxStreams(); len(t.Streams) >= limit {
		t.Streams = append(t.Streams[:0], t.Streams[len(t.Streams)-limit+1:]...)
	}
	t.Streams = append(t.Streams, Stream{
		Correlation:   bytes.Clone(req.Correlation),
		ResponseTopic: req.ResponseTopic,
		Requester:     req.Requester,
		Method:        req.Method,
		MessageID:     req.MessageID,
		Since:         now,
	})
}
