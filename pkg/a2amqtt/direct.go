package a2amqtt

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/a2aproject/a2a-go/v2/a2asrv/taskstore"
	"github.com/google/uuid"
)

// NewDirectHandler returns a lightweight a2asrv.RequestHandler for
// responders that need throughput: it runs the executor on the calling
// goroutine, applies each event to the task with structural copies and
// persists it in store before passing it on. It follows the task rules of
// a2a-go's default handler (status messages move to history, artifact
// append/replace, one execution per task at a time, terminal tasks are
// immutable) without its event queues and gob copies; see
// docs/benchmarks.md. Use it with ResponderOptions{Handler: h, TaskStore:
// store}. Push notifications and extended cards are not supported.
func NewDirectHandler(exec a2asrv.AgentExecutor, store taskstore.Store) a2asrv.RequestHandler {
	return &directHandler{exec: exec, store: store, running: map[a2a.TaskID]*execution{}}
}

type directHandler struct {
	exec  a2asrv.AgentExecutor
	store taskstore.Store

	mu      sync.Mutex
	running map[a2a.TaskID]*execution
}

// execution is one running Execute for a task.
type execution struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex
	subs []chan a2a.Event
}

func (e *execution) publish(ev a2a.Event) {
	e.mu.Lock()
	subs := slices.Clone(e.subs)
	e.mu.Unlock()
	for _, s := range subs {
		select {
		case s <- ev:
		default:
			// A subscriber that cannot keep up misses intermediate events;
			// it still gets the final state from GetTask.
		}
	}
}

func (e *execution) subscribe() chan a2a.Event {
	ch := make(chan a2a.Event, 256)
	e.mu.Lock()
	e.subs = append(e.subs, ch)
	e.mu.Unlock()
	return ch
}

func (e *execution) closeSubs() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.subs {
		close(s)
	}
	e.subs = nil
}

// acquire registers a new execution for id, waiting for a running one to
// finish first (a fast follow-up after input-required).
func (h *directHandler) acquire(ctx context.Context, id a2a.TaskID, cancel context.CancelFunc) (*execution, error) {
	for {
		h.mu.Lock()
		cur := h.running[id]
		if cur == nil {
			ex := &execution{cancel: cancel, done: make(chan struct{})}
			h.running[id] = ex
			h.mu.Unlock()
			return ex, nil
		}
		h.mu.Unlock()
		select {
		case <-cur.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (h *directHandler) release(id a2a.TaskID, ex *execution) {
	h.mu.Lock()
	if h.running[id] == ex {
		delete(h.running, id)
	}
	h.mu.Unlock()
	ex.closeSubs()
	close(ex.done)
}

// tracked is the task being executed and its store version.
type tracked struct {
	task    *a2a.Task
	version taskstore.TaskVersion
}

func (h *directHandler) save(ctx context.Context, t *tracked, ev a2a.Event) error {
	v, err := h.store.Update(ctx, &taskstore.UpdateRequest{Task: t.task, Event: ev, PrevVersion: t.version})
	if err != nil {
		return fmt.Errorf("save task %s: %w", t.task.ID, err)
	}
	t.version = v
	return nil
}

// apply integrates one executor event into the task (a2a-go semantics).
func apply(t *a2a.Task, ev a2a.Event) (a2a.Event, error) {
	switch v := ev.(type) {
	case *a2a.Message:
		cp := *v
		cp.TaskID, cp.ContextID = t.ID, t.ContextID
		su := a2a.NewStatusUpdateEvent(t, a2a.TaskStateCompleted, &cp)
		return apply(t, su)
	case *a2a.Task:
		if v.ID != t.ID || v.ContextID != t.ContextID {
			return nil, fmt.Errorf("executor emitted task %s/%s for %s/%s: %w", v.ID, v.ContextID, t.ID, t.ContextID, a2a.ErrInvalidAgentResponse)
		}
		*t = *copyTask(v)
		return v, nil
	case *a2a.TaskStatusUpdateEvent:
		if v.TaskID != t.ID || v.ContextID != t.ContextID {
			return nil, fmt.Errorf("status update for %s/%s on task %s/%s: %w", v.TaskID, v.ContextID, t.ID, t.ContextID, a2a.ErrInvalidAgentResponse)
		}
		if t.Status.Message != nil {
			t.History = append(t.History, t.Status.Message)
		}
		if v.Metadata != nil {
			if t.Metadata == nil {
				t.Metadata = map[string]any{}
			}
			maps.Copy(t.Metadata, copyMeta(v.Metadata))
		}
		st := v.Status
		st.Message = copyMessage(v.Status.Message)
		t.Status = st
		return v, nil
	case *a2a.TaskArtifactUpdateEvent:
		if v.TaskID != t.ID || v.ContextID != t.ContextID {
			return nil, fmt.Errorf("artifact update for %s/%s on task %s/%s: %w", v.TaskID, v.ContextID, t.ID, t.ContextID, a2a.ErrInvalidAgentResponse)
		}
		if v.Artifact == nil || len(v.Artifact.Parts) == 0 {
			return nil, fmt.Errorf("artifact cannot be empty: %w", a2a.ErrInvalidAgentResponse)
		}
		art := copyArtifact(v.Artifact)
		i := slices.IndexFunc(t.Artifacts, func(a *a2a.Artifact) bool { return a.ID == art.ID })
		switch {
		case i < 0 && v.Append:
			return nil, fmt.Errorf("append to unknown artifact %s: %w", art.ID, a2a.ErrInvalidAgentResponse)
		case i < 0:
			t.Artifacts = append(t.Artifacts, art)
		case !v.Append:
			t.Artifacts[i] = art
		default:
			cur := t.Artifacts[i]
			cur.Parts = append(cur.Parts, art.Parts...)
			if art.Metadata != nil {
				if cur.Metadata == nil {
					cur.Metadata = map[string]any{}
				}
				maps.Copy(cur.Metadata, art.Metadata)
			}
		}
		return v, nil
	}
	return nil, fmt.Errorf("unexpected event %T: %w", ev, a2a.ErrInvalidAgentResponse)
}

func validateSend(req *a2a.SendMessageRequest) error {
	switch {
	case req == nil || req.Message == nil:
		return fmt.Errorf("message is required: %w", a2a.ErrInvalidParams)
	case req.Message.ID == "":
		return fmt.Errorf("message ID is required: %w", a2a.ErrInvalidParams)
	case len(req.Message.Parts) == 0:
		return fmt.Errorf("message parts is required: %w", a2a.ErrInvalidParams)
	case req.Message.Role == "":
		return fmt.Errorf("message role is required: %w", a2a.ErrInvalidParams)
	}
	return nil
}

// load returns the task for msg, creating it under the requester's id (or
// a new id when the message names none).
func (h *directHandler) load(ctx context.Context, msg *a2a.Message) (*tracked, error) {
	id := msg.TaskID
	if id == "" {
		id = a2a.TaskID(uuid.NewString())
	}
	st, err := h.store.Get(ctx, id)
	if errors.Is(err, a2a.ErrTaskNotFound) {
		ctxID := msg.ContextID
		if ctxID == "" {
			ctxID = uuid.NewString()
		}
		now := time.Now().UTC()
		task := &a2a.Task{ID: id, ContextID: ctxID, Status: a2a.TaskStatus{State: a2a.TaskStateSubmitted, Timestamp: &now}}
		v, cerr := h.store.Create(ctx, task)
		if cerr == nil {
			return &tracked{task: task, version: v}, nil
		}
		if !errors.Is(cerr, taskstore.ErrTaskAlreadyExists) {
			return nil, fmt.Errorf("create task %s: %w", id, cerr)
		}
		st, err = h.store.Get(ctx, id)
	}
	if err != nil {
		return nil, fmt.Errorf("load task %s: %w", id, err)
	}
	t := st.Task
	if msg.ContextID != "" && msg.ContextID != t.ContextID {
		return nil, fmt.Errorf("message contextId %q differs from task context %q: %w", msg.ContextID, t.ContextID, a2a.ErrInvalidParams)
	}
	if t.Status.State.Terminal() {
		return nil, fmt.Errorf("task %s is in terminal state %s: %w", t.ID, t.Status.State, a2a.ErrUnsupportedOperation)
	}
	return &tracked{task: t, version: st.Version}, nil
}

// run executes one message. emit receives every applied event; returning
// false stops consuming (the execution is then abandoned, as when a
// streaming caller goes away).
func (h *directHandler) run(ctx context.Context, req *a2a.SendMessageRequest, emit func(a2a.Event) bool) (res *a2a.Task, err error) {
	if err := validateSend(req); err != nil {
		return nil, err
	}
	execCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	msg := *req.Message
	if msg.TaskID == "" {
		msg.TaskID = a2a.TaskID(uuid.NewString())
	}
	ex, err := h.acquire(ctx, msg.TaskID, cancel)
	if err != nil {
		return nil, err
	}
	defer h.release(msg.TaskID, ex)
	t, err := h.begin(ctx, &msg)
	if err != nil {
		return nil, err
	}
	ec := executorContext(ctx, req, &msg, t.task)
	r := &directRun{h: h, ctx: ctx, t: t, ex: ex, emit: emit}
	defer func() {
		if c, ok := h.exec.(a2asrv.AgentExecutionCleaner); ok {
			c.Cleanup(execCtx, ec, t.task, r.execErr)
		}
	}()
	defer func() {
		// An executor that panics fails its task (as a2a-go's default handler does) instead of
		// leaving it "working" for ever.
		if v := recover(); v != nil {
			r.execErr = fmt.Errorf("executor panic: %v", v)
			res, err = h.fail(ctx, t, r.execErr, emit)
		}
	}()
	defer func() {
		// Whatever way the run ends, a deferred artifact reaches the store.
		if ferr := r.flush(); ferr != nil && err == nil {
			r.execErr, res, err = ferr, nil, ferr
		}
	}()
	return r.loop(execCtx, ec)
}

// begin loads msg's task under the execution lock (a previous execution of this task may have
// moved it on while this one waited) and records msg in its history, once: a retried request
// carries the same message id.
func (h *directHandler) begin(ctx context.Context, msg *a2a.Message) (*tracked, error) {
	t, err := h.load(ctx, msg)
	if err != nil {
		return nil, err
	}
	msg.ContextID = t.task.ContextID
	if !slices.ContainsFunc(t.task.History, func(m *a2a.Message) bool { return m.ID == msg.ID }) {
		t.task.History = append(t.task.History, msg)
		if err := h.save(ctx, t, msg); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// executorContext is what the executor gets for msg on task: a copy of the stored task, and the
// caller (user, service parameters, tenant) from the call context.
func executorContext(ctx context.Context, req *a2a.SendMessageRequest, msg *a2a.Message, task *a2a.Task) *a2asrv.ExecutorContext {
	ec := &a2asrv.ExecutorContext{
		Message:    msg,
		TaskID:     task.ID,
		StoredTask: copyTask(task),
		ContextID:  task.ContextID,
		Metadata:   req.Metadata,
		Tenant:     req.Tenant,
	}
	if cc, ok := a2asrv.CallContextFrom(ctx); ok {
		ec.User, ec.ServiceParams = cc.User, cc.ServiceParams()
		if ec.Tenant == "" {
			ec.Tenant = cc.Tenant()
		}
	}
	return ec
}

// directRun is one execution of a message by the direct handler: the executor's events applied
// to the task and saved, and the error the execution ended with (for the executor's Cleanup).
//
// Artifact updates are applied at once but persisted together, at most artifactSaveInterval
// after the first unsaved one (a timer, so a stalled executor does not leave the stored task
// behind), with the next status update, or when the run ends: a stream of appends would
// otherwise copy the whole growing task into the store per chunk (quadratic in the chunks).
// Status updates, what a resume, a cancel or a retry reads, are persisted before they are
// sent. mu guards t against the timer's flush.
type directRun struct {
	h       *directHandler
	ctx     context.Context
	t       *tracked
	ex      *execution
	emit    func(a2a.Event) bool
	execErr error

	mu      sync.Mutex
	pending a2a.Event
	timer   *time.Timer
}

// loop feeds the executor's events through step to the subscribers and emit, until the
// executor ends, the stream ends, or emit stops consuming.
func (r *directRun) loop(execCtx context.Context, ec *a2asrv.ExecutorContext) (*a2a.Task, error) {
	first := true
	for ev, err := range r.h.exec.Execute(execCtx, ec) {
		var serr error
		if err == nil {
			ev, err, serr = r.step(ev)
		}
		if err != nil {
			r.execErr = err
			r.mu.Lock()
			r.pending = nil
			r.mu.Unlock()
			return r.h.fail(r.ctx, r.t, err, r.emit)
		}
		if serr != nil {
			return r.saveFailed(serr)
		}
		r.ex.publish(ev)
		if !r.emit(ev) {
			return r.snapshot(), nil
		}
		// An executor may open with a Task snapshot, as core A2A servers do; on a resume it
		// still shows the interrupted state, which ends nothing (see endsStream).
		if endsStream(ev, first) && stateEndsStream(r.t.task.Status.State) {
			break
		}
		first = false
	}
	return r.snapshot(), nil
}

// step applies one event and saves it (or schedules the save): applyErr is the executor's
// mistake (the task fails), saveErr the store's. The deferred unlock keeps a panic here from
// leaving mu held for the final flush.
func (r *directRun) step(ev a2a.Event) (_ a2a.Event, applyErr, saveErr error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev, aerr := apply(r.t.task, ev)
	if aerr != nil {
		r.pending = nil // fail saves the whole task
		r.stopTimerLocked()
		return nil, aerr, nil
	}
	r.pending = ev
	if _, isArtifact := ev.(*a2a.TaskArtifactUpdateEvent); !isArtifact {
		return ev, nil, r.flushLocked()
	}
	if r.timer == nil {
		r.timer = time.AfterFunc(artifactSaveInterval, func() {
			// A failure here is retried by the next save, which writes the whole task.
			_ = r.flush()
		})
	}
	return ev, nil, nil
}

// saveFailed ends a run whose save failed: a task canceled meanwhile reports its stored state.
func (r *directRun) saveFailed(serr error) (*a2a.Task, error) {
	if errors.Is(serr, taskstore.ErrConcurrentModification) {
		st, gerr := r.h.store.Get(r.ctx, r.t.task.ID)
		if gerr == nil && st.Task.Status.State.Terminal() {
			r.emit(st.Task)
			return st.Task, nil
		}
	}
	r.execErr = serr
	return nil, serr
}

func (r *directRun) flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.flushLocked()
}

func (r *directRun) flushLocked() error {
	r.stopTimerLocked()
	if r.pending == nil {
		return nil
	}
	ev := r.pending
	r.pending = nil
	return r.h.save(r.ctx, r.t, ev)
}

func (r *directRun) stopTimerLocked() {
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
}

// snapshot is a copy of the task as applied so far.
func (r *directRun) snapshot() *a2a.Task {
	r.mu.Lock()
	defer r.mu.Unlock()
	return copyTask(r.t.task)
}

// artifactSaveInterval bounds how stale the stored task may be behind the artifact updates
// already streamed to the requester (GetTask during a long stream).
const artifactSaveInterval = 50 * time.Millisecond

// fail records an executor error as TASK_STATE_FAILED (as a2a-go does).
func (h *directHandler) fail(ctx context.Context, t *tracked, cause error, emit func(a2a.Event) bool) (*a2a.Task, error) {
	now := time.Now().UTC()
	msg := a2a.NewMessageForTask(a2a.MessageRoleAgent, t.task, a2a.NewTextPart(cause.Error()))
	ev := &a2a.TaskStatusUpdateEvent{TaskID: t.task.ID, ContextID: t.task.ContextID, Status: a2a.TaskStatus{State: a2a.TaskStateFailed, Message: msg, Timestamp: &now}}
	if _, err := apply(t.task, ev); err != nil {
		return nil, err
	}
	if err := h.save(ctx, t, ev); err != nil {
		return nil, errors.Join(cause, err)
	}
	emit(ev)
	return copyTask(t.task), nil
}

// SendMessage implements a2asrv.RequestHandler. With configuration.returnImmediately the
// result is the task as of the first event while the execution goes on; with
// configuration.historyLength the result's history is cut to that many recent messages.
func (h *directHandler) SendMessage(ctx context.Context, req *a2a.SendMessageRequest) (a2a.SendMessageResult, error) {
	if req != nil && req.Config != nil && req.Config.ReturnImmediately {
		return h.sendReturnImmediately(ctx, req)
	}
	t, err := h.run(ctx, req, func(a2a.Event) bool { return true })
	if err != nil {
		return nil, err
	}
	return withHistoryLength(t, req), nil
}

// sendReturnImmediately runs the execution detached from the caller and answers with the
// task's state at its first event (or its final state, if that comes first).
func (h *directHandler) sendReturnImmediately(ctx context.Context, req *a2a.SendMessageRequest) (a2a.SendMessageResult, error) {
	if err := validateSend(req); err != nil {
		return nil, err
	}
	type outcome struct {
		task *a2a.Task
		err  error
	}
	if req.Message.TaskID == "" {
		cp, msg := *req, *req.Message
		msg.TaskID = a2a.TaskID(uuid.NewString())
		cp.Message = &msg
		req = &cp
	}
	first := make(chan outcome, 1)
	var once sync.Once
	id := req.Message.TaskID
	go func() {
		t, err := h.run(context.WithoutCancel(ctx), req, func(a2a.Event) bool {
			once.Do(func() {
				st, gerr := h.store.Get(context.WithoutCancel(ctx), id)
				if gerr != nil {
					first <- outcome{err: gerr}
					return
				}
				first <- outcome{task: st.Task}
			})
			return true
		})
		once.Do(func() { first <- outcome{task: t, err: err} })
	}()
	select {
	case o := <-first:
		if o.err != nil {
			return nil, o.err
		}
		return withHistoryLength(o.task, req), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// withHistoryLength applies configuration.historyLength to a result task.
func withHistoryLength(t *a2a.Task, req *a2a.SendMessageRequest) *a2a.Task {
	if t == nil || req == nil || req.Config == nil || req.Config.HistoryLength == nil {
		return t
	}
	if n := *req.Config.HistoryLength; n == 0 {
		t.History = []*a2a.Message{}
	} else if n > 0 && n < len(t.History) {
		t.History = t.History[len(t.History)-n:]
	}
	return t
}

// SendStreamingMessage implements a2asrv.RequestHandler.
func (h *directHandler) SendStreamingMessage(ctx context.Context, req *a2a.SendMessageRequest) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		if _, err := h.run(ctx, req, func(ev a2a.Event) bool { return yield(ev, nil) }); err != nil {
			yield(nil, err)
		}
	}
}

// GetTask implements a2asrv.RequestHandler.
func (h *directHandler) GetTask(ctx context.Context, req *a2a.GetTaskRequest) (*a2a.Task, error) {
	if req == nil || req.ID == "" {
		return nil, fmt.Errorf("missing task id: %w", a2a.ErrInvalidParams)
	}
	st, err := h.store.Get(ctx, req.ID)
	if err != nil {
		return nil, fmt.Errorf("get task %s: %w", req.ID, err)
	}
	t := st.Task
	if req.HistoryLength != nil {
		if n := *req.HistoryLength; n == 0 {
			t.History = []*a2a.Message{}
		} else if n > 0 && n < len(t.History) {
			t.History = t.History[len(t.History)-n:]
		}
	}
	return t, nil
}

// ListTasks implements a2asrv.RequestHandler.
func (h *directHandler) ListTasks(ctx context.Context, req *a2a.ListTasksRequest) (*a2a.ListTasksResponse, error) {
	resp, err := h.store.List(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	return resp, nil
}

// CancelTask implements a2asrv.RequestHandler: a running execution is
// stopped first, then the executor's Cancel events are applied.
func (h *directHandler) CancelTask(ctx context.Context, req *a2a.CancelTaskRequest) (*a2a.Task, error) {
	if req == nil || req.ID == "" {
		return nil, fmt.Errorf("missing task id: %w", a2a.ErrInvalidParams)
	}
	h.mu.Lock()
	cur := h.running[req.ID]
	h.mu.Unlock()
	if cur != nil {
		cur.cancel()
		select {
		case <-cur.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	st, err := h.store.Get(ctx, req.ID)
	if err != nil {
		return nil, fmt.Errorf("cancel task %s: %w", req.ID, err)
	}
	t := &tracked{task: st.Task, version: st.Version}
	switch s := t.task.Status.State; {
	case s == a2a.TaskStateCanceled:
		return t.task, nil
	case s.Terminal():
		return nil, fmt.Errorf("task %s is %s: %w", req.ID, s, a2a.ErrTaskNotCancelable)
	}
	ec := &a2asrv.ExecutorContext{TaskID: t.task.ID, StoredTask: copyTask(t.task), ContextID: t.task.ContextID, Metadata: req.Metadata}
	for ev, err := range h.exec.Cancel(ctx, ec) {
		if err != nil {
			return nil, fmt.Errorf("cancel task %s: %w", req.ID, err)
		}
		if ev, err = apply(t.task, ev); err != nil {
			return nil, err
		}
		if err := h.save(ctx, t, ev); err != nil {
			return nil, err
		}
	}
	return copyTask(t.task), nil
}

// SubscribeToTask implements a2asrv.RequestHandler: events of a running
// execution; the stored state for an interrupted task; an error otherwise.
func (h *directHandler) SubscribeToTask(ctx context.Context, req *a2a.SubscribeToTaskRequest) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		if req == nil || req.ID == "" {
			yield(nil, fmt.Errorf("missing task id: %w", a2a.ErrInvalidParams))
			return
		}
		h.mu.Lock()
		cur := h.running[req.ID]
		var ch chan a2a.Event
		if cur != nil {
			ch = cur.subscribe()
		}
		h.mu.Unlock()
		if cur == nil {
			st, err := h.store.Get(ctx, req.ID)
			switch {
			case err != nil:
				yield(nil, fmt.Errorf("subscribe to %s: %w", req.ID, err))
			case st.Task.Status.State.Terminal():
				yield(nil, fmt.Errorf("task %s is %s: %w", req.ID, st.Task.Status.State, a2a.ErrUnsupportedOperation))
			default:
				yieldSnapshot(st.Task, nil, yield)
			}
			return
		}
		for {
			select {
			case ev, ok := <-ch:
				if !ok || !yield(ev, nil) {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}
}

// GetTaskPushConfig implements a2asrv.RequestHandler (unsupported).
func (h *directHandler) GetTaskPushConfig(context.Context, *a2a.GetTaskPushConfigRequest) (*a2a.PushConfig, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

// ListTaskPushConfigs implements a2asrv.RequestHandler (unsupported).
func (h *directHandler) ListTaskPushConfigs(context.Context, *a2a.ListTaskPushConfigRequest) (*a2a.ListTaskPushConfigResponse, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

// CreateTaskPushConfig implements a2asrv.RequestHandler (unsupported).
func (h *directHandler) CreateTaskPushConfig(context.Context, *a2a.PushConfig) (*a2a.PushConfig, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

// DeleteTaskPushConfig implements a2asrv.RequestHandler (unsupported).
func (h *directHandler) DeleteTaskPushConfig(context.Context, *a2a.DeleteTaskPushConfigRequest) error {
	return a2a.ErrPushNotificationNotSupported
}

// GetExtendedAgentCard implements a2asrv.RequestHandler (unsupported).
func (h *directHandler) GetExtendedAgentCard(context.Context, *a2a.GetExtendedAgentCardRequest) (*a2a.AgentCard, error) {
	return nil, a2a.ErrExtendedCardNotConfigured
}
