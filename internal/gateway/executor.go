package gateway

import (
	"context"
	"iter"
	"sync"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
)

// maxMappedTasks bounds the task and context id maps of one HTTP agent; past it the oldest half
// is forgotten (a follow-up in a forgotten task reaches the HTTP agent as a new task).
const maxMappedTasks = 10000

// idMap maps the bus's ids (the requester creates task and context ids: docs/protocol.md) to the
// HTTP agent's (core A2A lets the server create them), so that follow-ups reach the same task
// and context on the HTTP agent and every event carries the requester's ids.
type idMap struct {
	mu    sync.Mutex
	ids   map[string]string
	order []string
}

func (m *idMap) get(local string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ids[local]
}

func (m *idMap) put(local, remote string) {
	if local == "" || remote == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ids == nil {
		m.ids = map[string]string{}
	}
	if _, ok := m.ids[local]; !ok {
		m.order = append(m.order, local)
		if len(m.order) > maxMappedTasks {
			for _, k := range m.order[:maxMappedTasks/2] {
				delete(m.ids, k)
			}
			m.order = append([]string(nil), m.order[maxMappedTasks/2:]...)
		}
	}
	m.ids[local] = remote
}

// httpExecutor runs a bus request on an HTTP A2A agent: an a2asrv.AgentExecutor for the SDK's
// Responder whose work is a call with a2a-go's JSON-RPC client.
type httpExecutor struct {
	remote   a2aclient.Transport
	tasks    idMap
	contexts idMap
}

var _ a2asrv.AgentExecutor = (*httpExecutor)(nil)

// localMessage gives a message of the HTTP agent the bus's ids.
func localMessage(m *a2a.Message, ec *a2asrv.ExecutorContext) *a2a.Message {
	if m == nil {
		return nil
	}
	c := *m
	c.ContextID = ec.ContextID
	if c.TaskID != "" {
		c.TaskID = ec.TaskID
	}
	return &c
}

// localEvents turns one event of the HTTP agent into the bus's: the same event with the
// requester's ids. A Task (a JSON-RPC stream's opening snapshot, or a unary result) gives its
// artifacts, and its status as held: a resumed task's stream opens with a snapshot that still
// shows input-required, which must not end the execution here (the profile's stream-final rule:
// an opening Task ends a stream only when terminal); Execute sends the held status only when no
// later status follows.
func (e *httpExecutor) localEvents(ev a2a.Event, ec *a2asrv.ExecutorContext) (out []a2a.Event, held *a2a.TaskStatusUpdateEvent) {
	switch v := ev.(type) {
	case *a2a.Task:
		e.tasks.put(string(ec.TaskID), string(v.ID))
		e.contexts.put(ec.ContextID, v.ContextID)
		for _, art := range v.Artifacts {
			out = append(out, &a2a.TaskArtifactUpdateEvent{TaskID: ec.TaskID, ContextID: ec.ContextID, Artifact: art})
		}
		st := v.Status
		st.Message = localMessage(st.Message, ec)
		status := &a2a.TaskStatusUpdateEvent{TaskID: ec.TaskID, ContextID: ec.ContextID, Status: st, Metadata: v.Metadata}
		if st.State.Terminal() {
			return append(out, status), nil
		}
		return out, status
	case *a2a.TaskStatusUpdateEvent:
		e.tasks.put(string(ec.TaskID), string(v.TaskID))
		e.contexts.put(ec.ContextID, v.ContextID)
		c := *v
		c.TaskID, c.ContextID = ec.TaskID, ec.ContextID
		c.Status.Message = localMessage(c.Status.Message, ec)
		return []a2a.Event{&c}, nil
	case *a2a.TaskArtifactUpdateEvent:
		c := *v
		c.TaskID, c.ContextID = ec.TaskID, ec.ContextID
		return []a2a.Event{&c}, nil
	case *a2a.Message:
		e.contexts.put(ec.ContextID, v.ContextID)
		return []a2a.Event{localMessage(v, ec)}, nil
	default:
		return []a2a.Event{ev}, nil
	}
}

// Execute implements a2asrv.AgentExecutor: the message goes to the HTTP agent with the HTTP
// agent's ids for the task and context (none for a new task: the server creates it), as a stream,
// and each event comes back with the bus's ids.
func (e *httpExecutor) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		msg := *ec.Message
		msg.TaskID = a2a.TaskID(e.tasks.get(string(ec.TaskID)))
		msg.ContextID = e.contexts.get(ec.ContextID)
		if msg.ContextID == "" {
			msg.ContextID = ec.ContextID
		}
		req := &a2a.SendMessageRequest{Message: &msg}
		var held *a2a.TaskStatusUpdateEvent
		for ev, err := range e.remote.SendStreamingMessage(ctx, nil, req) {
			if err != nil {
				yield(nil, err)
				return
			}
			out, h := e.localEvents(ev, ec)
			if h != nil {
				held = h
			}
			for _, o := range out {
				if _, ok := o.(*a2a.TaskStatusUpdateEvent); ok {
					held = nil
				}
				if !yield(o, nil) {
					return
				}
			}
		}
		if held != nil {
			yield(held, nil)
		}
	}
}

// Cancel implements a2asrv.AgentExecutor: the HTTP agent's task is canceled, and the bus's task
// with it.
func (e *httpExecutor) Cancel(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		if remote := e.tasks.get(string(ec.TaskID)); remote != "" {
			if _, err := e.remote.CancelTask(ctx, nil, &a2a.CancelTaskRequest{ID: a2a.TaskID(remote)}); err != nil {
				yield(nil, err)
				return
			}
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}
