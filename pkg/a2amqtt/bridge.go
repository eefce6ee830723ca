package a2amqtt

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/a2aproject/a2a-go/v2/a2asrv/taskstore"
	"github.com/google/uuid"
)

// bridge adapts a2a-go's request handler to the profile's task model. It is
// an a2asrv.RequestHandler decorator, so both the A2A v1.0 and the v0.3
// (a2acompat/a2av0) JSON-RPC front ends go through it:
//
//   - requester-generated Task.id: a2a-go answers a message naming an unknown
//     taskId with "task not found" (core A2A lets the server create ids).
//     The bridge records the task under the requester's id (SUBMITTED, in
//     the requester's context) before the handler runs, so a2a-go treats it
//     as an existing task and executes it.
//   - retries/duplicates: a message whose (Task.id, messageId) is being
//     processed or already in the task's history is not executed again; the
//     current task state is returned instead (profile: dedupe by Task.id).
//   - context mismatch: -32602 before anything runs.
//   - a message for a terminal task: UnsupportedOperation (A2A v1.0), where
//     a2a-go would answer InvalidParams.
type bridge struct {
	inner a2asrv.RequestHandler
	store taskstore.Store

	mu      sync.Mutex
	flights map[string]*flight
}

type flight struct {
	done chan struct{}
}

var _ a2asrv.RequestHandler = (*bridge)(nil)

func newBridge(inner a2asrv.RequestHandler, store taskstore.Store) *bridge {
	return &bridge{inner: inner, store: store, flights: map[string]*flight{}}
}

// admission is the outcome of admit.
type admission struct {
	// dup is set when the message is a duplicate; wait on it, then return
	// the stored task.
	dup *flight
	// release must be called when the original request finishes.
	release func()
}

func (b *bridge) admit(ctx context.Context, req *a2a.SendMessageRequest) (admission, error) {
	if req == nil || req.Message == nil {
		return admission{release: func() {}}, nil
	}
	if req.Message.TaskID == "" {
		// No requester task id (A2A v0.3 peers, AcceptMissingTaskID): the server generates it,
		// as in core A2A, and records the task like a requester-generated one, so every
		// executor (which may emit status updates first, as the example agents do) runs under
		// both handlers. a2a-go's default handler would otherwise insist on a Task as the
		// first event (-32006).
		msg := *req.Message
		msg.TaskID = a2a.NewTaskID()
		req.Message = &msg
	}
	msg := req.Message
	key := string(msg.TaskID) + "\x00" + msg.ID
	b.mu.Lock()
	if f, ok := b.flights[key]; ok {
		b.mu.Unlock()
		return admission{dup: f}, nil
	}
	f := &flight{done: make(chan struct{})}
	b.flights[key] = f
	b.mu.Unlock()
	release := func() {
		b.mu.Lock()
		delete(b.flights, key)
		b.mu.Unlock()
		close(f.done)
	}

	stored, err := b.store.Get(ctx, msg.TaskID)
	if errors.Is(err, a2a.ErrTaskNotFound) {
		ctxID := msg.ContextID
		if ctxID == "" {
			// The profile lets the responder pick a context when the
			// requester opted out of conversational continuity.
			ctxID = uuid.NewString()
		}
		now := time.Now().UTC()
		_, cerr := b.store.Create(ctx, &a2a.Task{
			ID:        msg.TaskID,
			ContextID: ctxID,
			Status:    a2a.TaskStatus{State: a2a.TaskStateSubmitted, Timestamp: &now},
		})
		if cerr == nil {
			return admission{release: release}, nil
		}
		if !errors.Is(cerr, taskstore.ErrTaskAlreadyExists) {
			release()
			return admission{}, fmt.Errorf("record task %s: %w", msg.TaskID, cerr)
		}
		stored, err = b.store.Get(ctx, msg.TaskID)
	}
	if err != nil {
		release()
		return admission{}, fmt.Errorf("load task %s: %w", msg.TaskID, err)
	}
	task := stored.Task
	if msg.ContextID != "" && msg.ContextID != task.ContextID {
		release()
		return admission{}, a2a.NewError(a2a.ErrInvalidParams,
			fmt.Sprintf("contextId %q conflicts with task %s, which belongs to context %q", msg.ContextID, task.ID, task.ContextID)).
			WithDetails(map[string]any{"taskId": string(task.ID), "taskContextId": task.ContextID, "contextId": msg.ContextID})
	}
	if slices.ContainsFunc(task.History, func(m *a2a.Message) bool { return m.ID == msg.ID }) {
		// Already processed (the first reply was lost): answer with state.
		release()
		done := &flight{done: make(chan struct{})}
		close(done.done)
		return admission{dup: done}, nil
	}
	if task.Status.State.Terminal() {
		release()
		return admission{}, a2a.NewError(a2a.ErrUnsupportedOperation,
			fmt.Sprintf("task %s is in terminal state %s and accepts no further messages; start a new task in context %s", task.ID, task.Status.State, task.ContextID)).
			WithDetails(map[string]any{"taskId": string(task.ID), "state": string(task.Status.State)})
	}
	return admission{release: release}, nil
}

func (b *bridge) snapshot(ctx context.Context, dup *flight, id a2a.TaskID) (*a2a.Task, error) {
	select {
	case <-dup.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	st, err := b.store.Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("load deduplicated task %s: %w", id, err)
	}
	return st.Task, nil
}

// SendMessage implements a2asrv.RequestHandler.
func (b *bridge) SendMessage(ctx context.Context, req *a2a.SendMessageRequest) (a2a.SendMessageResult, error) {
	adm, err := b.admit(ctx, req)
	if err != nil {
		return nil, err
	}
	if adm.dup != nil {
		return b.snapshot(ctx, adm.dup, req.Message.TaskID)
	}
	defer adm.release()
	return b.inner.SendMessage(ctx, req)
}

// SendStreamingMessage implements a2asrv.RequestHandler.
func (b *bridge) SendStreamingMessage(ctx context.Context, req *a2a.SendMessageRequest) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		adm, err := b.admit(ctx, req)
		if err != nil {
			yield(nil, err)
			return
		}
		if adm.dup != nil {
			t, err := b.snapshot(ctx, adm.dup, req.Message.TaskID)
			yieldSnapshot(t, err, yield)
			return
		}
		defer adm.release()
		for ev, err := range b.inner.SendStreamingMessage(ctx, req) {
			if !yield(ev, err) {
				return
			}
		}
	}
}

// yieldSnapshot answers a stream with a stored task: the Task (history, artifacts), then, when
// the task waits for input, its status again as a status update, which is what ends the stream
// at the requester (an opening Task only ends a stream when terminal, see endsStream).
func yieldSnapshot(t *a2a.Task, err error, yield func(a2a.Event, error) bool) {
	if err != nil || t == nil {
		yield(t, err)
		return
	}
	if !yield(t, nil) {
		return
	}
	if s := t.Status.State; s == a2a.TaskStateInputRequired || s == a2a.TaskStateAuthRequired {
		status := t.Status
		yield(&a2a.TaskStatusUpdateEvent{TaskID: t.ID, ContextID: t.ContextID, Status: status}, nil)
	}
}

// GetTask implements a2asrv.RequestHandler.
func (b *bridge) GetTask(ctx context.Context, req *a2a.GetTaskRequest) (*a2a.Task, error) {
	return b.inner.GetTask(ctx, req)
}

// ListTasks implements a2asrv.RequestHandler.
func (b *bridge) ListTasks(ctx context.Context, req *a2a.ListTasksRequest) (*a2a.ListTasksResponse, error) {
	return b.inner.ListTasks(ctx, req)
}

// CancelTask implements a2asrv.RequestHandler.
func (b *bridge) CancelTask(ctx context.Context, req *a2a.CancelTaskRequest) (*a2a.Task, error) {
	return b.inner.CancelTask(ctx, req)
}

// SubscribeToTask implements a2asrv.RequestHandler.
func (b *bridge) SubscribeToTask(ctx context.Context, req *a2a.SubscribeToTaskRequest) iter.Seq2[a2a.Event, error] {
	return b.inner.SubscribeToTask(ctx, req)
}

// GetTaskPushConfig implements a2asrv.RequestHandler.
func (b *bridge) GetTaskPushConfig(ctx context.Context, req *a2a.GetTaskPushConfigRequest) (*a2a.PushConfig, error) {
	return b.inner.GetTaskPushConfig(ctx, req)
}

// ListTaskPushConfigs implements a2asrv.RequestHandler.
func (b *bridge) ListTaskPushConfigs(ctx context.Context, req *a2a.ListTaskPushConfigRequest) (*a2a.ListTaskPushConfigResponse, error) {
	return b.inner.ListTaskPushConfigs(ctx, req)
}

// CreateTaskPushConfig implements a2asrv.RequestHandler.
func (b *bridge) CreateTaskPushConfig(ctx context.Context, req *a2a.PushConfig) (*a2a.PushConfig, error) {
	return b.inner.CreateTaskPushConfig(ctx, req)
}

// DeleteTaskPushConfig implements a2asrv.RequestHandler.
func (b *bridge) DeleteTaskPushConfig(ctx context.Context, req *a2a.DeleteTaskPushConfigRequest) error {
	return b.inner.DeleteTaskPushConfig(ctx, req)
}

// GetExtendedAgentCard implements a2asrv.RequestHandler.
func (b *bridge) GetExtendedAgentCard(ctx context.Context, req *a2a.GetExtendedAgentCardRequest) (*a2a.AgentCard, error) {
	return b.inner.GetExtendedAgentCard(ctx, req)
}

// ContextTasks lists the tasks of contextID from the task store of the
// responder serving ctx, oldest first, excluding exclude (typically the
// current task). Executors use it to ground answers in prior turns of the
// same conversation (profile: responders MAY use prior task history).
func ContextTasks(ctx context.Context, contextID string, exclude a2a.TaskID) ([]*a2a.Task, error) {
	scope, ok := scopeOf(ctx)
	if !ok {
		return nil, errors.New("a2amqtt: ContextTasks called outside a responder request")
	}
	return listContext(ctx, scope.store, contextID, exclude)
}

func listContext(ctx context.Context, store taskstore.Store, contextID string, exclude a2a.TaskID) ([]*a2a.Task, error) {
	if contextID == "" {
		return nil, nil
	}
	var out []*a2a.Task
	req := &a2a.ListTasksRequest{ContextID: contextID, PageSize: 100, IncludeArtifacts: true}
	for {
		resp, err := store.List(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("list tasks of context %s: %w", contextID, err)
		}
		for _, t := range resp.Tasks {
			if t.ID != exclude {
				out = append(out, t)
			}
		}
		if resp.NextPageToken == "" {
			break
		}
		req.PageToken = resp.NextPageToken
	}
	// Stores list newest first; conversations read oldest first. Tasks carry
	// no creation time, so order by first history message presence and then
	// by last status time (close enough for turn order: a turn completes
	// before the next one starts).
	sort.SliceStable(out, func(i, j int) bool {
		ti, tj := out[i].Status.Timestamp, out[j].Status.Timestamp
		if ti == nil || tj == nil {
			return tj != nil
		}
		return ti.Before(*tj)
	})
	return out, nil
}

// messageAdapter wraps the agent's executor for bridged tasks. Because the
// bridge stores the task before a2a-go runs, a2a-go rejects a bare Message
// answer ("message not allowed after task was stored") and fails the task.
// Over MQTT every request has a requester-created task, so a Message answer
// is turned into what it means there: the task completes with that message
// as its status message.
type messageAdapter struct {
	inner a2asrv.AgentExecutor
}

var (
	_ a2asrv.AgentExecutor         = messageAdapter{}
	_ a2asrv.AgentExecutionCleaner = messageAdapter{}
)

// Execute implements a2asrv.AgentExecutor.
func (m messageAdapter) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	events := m.inner.Execute(ctx, ec)
	if ec.StoredTask == nil {
		return events
	}
	return func(yield func(a2a.Event, error) bool) {
		for ev, err := range events {
			if msg, ok := ev.(*a2a.Message); ok && err == nil {
				cp := *msg
				cp.TaskID, cp.ContextID = ec.TaskID, ec.ContextID
				ev = a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, &cp)
			}
			if !yield(ev, err) {
				return
			}
		}
	}
}

// Cancel implements a2asrv.AgentExecutor.
func (m messageAdapter) Cancel(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return m.inner.Cancel(ctx, ec)
}

// Cleanup implements a2asrv.AgentExecutionCleaner when the agent does.
func (m messageAdapter) Cleanup(ctx context.Context, ec *a2asrv.ExecutorContext, result a2a.SendMessageResult, err error) {
	if c, ok := m.inner.(a2asrv.AgentExecutionCleaner); ok {
		c.Cleanup(ctx, ec, result, err)
	}
}
