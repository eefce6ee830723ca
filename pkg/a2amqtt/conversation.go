package a2amqtt

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/google/uuid"
)

// Conversation holds a multi-turn conversation with one agent (user story
// 08): a requester-generated context id shared by every turn, a fresh
// Task.id per turn, and resumption of a task that stopped at
// input-required/auth-required with the same Task.id and context id (the
// transport generates fresh Correlation Data per publish).
type Conversation struct {
	tr a2aclient.Transport

	mu    sync.Mutex
	state ConversationState
}

// ConversationState is the persistable part of a Conversation.
type ConversationState struct {
	// ContextID is the UUIDv4 shared by all turns.
	ContextID string `json:"contextId"`
	// Agent is informational ("org/unit/agent").
	Agent string `json:"agent,omitempty"`
	// Tasks lists the Task.ids of past turns, oldest first.
	Tasks []a2a.TaskID `json:"tasks,omitempty"`
	// Pending is the task waiting for input (input-required or
	// auth-required); the next turn resumes it.
	Pending *PendingTask `json:"pending,omitempty"`
	// Transcript is the conversation as this requester saw it: one A2A Task per turn (oldest
	// first, at most MaxTranscriptTasks) with the messages sent and received and the artifacts.
	// It is what the conversation supplies as history when the agent asks for it
	// (history_policy client_supplied, or SetSupplyHistory).
	Transcript []*a2a.Task `json:"transcript,omitempty"`
	// SupplyHistory makes every turn carry the transcript (SuppliedHistory). It is set when the
	// agent's continuation hint says history_policy client_supplied.
	SupplyHistory bool `json:"supplyHistory,omitempty"`
}

// MaxTranscriptTasks bounds ConversationState.Transcript (the oldest turns are dropped).
const MaxTranscriptTasks = 20

// PendingTask is an interrupted task and the agent's question.
type PendingTask struct {
	TaskID   a2a.TaskID    `json:"taskId"`
	State    a2a.TaskState `json:"state"`
	Question string        `json:"question,omitempty"`
	// Continuation is the agent's continuation hint, when it declared one: what kind of answer
	// it expects (e.g. ExpectApproval: answer with ApprovalMessage), how to resume, where it
	// takes history from.
	Continuation *Continuation `json:"continuation,omitempty"`
}

// NewConversation starts a conversation with a new UUIDv4 context id.
func NewConversation(tr a2aclient.Transport) *Conversation {
	c := &Conversation{tr: tr, state: ConversationState{ContextID: uuid.NewString()}}
	if t, ok := tr.(*Transport); ok {
		c.state.Agent = t.Target()
	}
	return c
}

// ResumeConversation continues a conversation from saved state.
func ResumeConversation(tr a2aclient.Transport, st ConversationState) (*Conversation, error) {
	if _, err := uuid.Parse(st.ContextID); err != nil {
		return nil, fmt.Errorf("a2amqtt: conversation context id %q: %w", st.ContextID, err)
	}
	return &Conversation{tr: tr, state: st}, nil
}

// ContextID returns the conversation's context id.
func (c *Conversation) ContextID() string { return c.State().ContextID }

// State returns a copy of the persistable state.
func (c *Conversation) State() ConversationState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.state
	st.Tasks = append([]a2a.TaskID(nil), c.state.Tasks...)
	if c.state.Pending != nil {
		p := *c.state.Pending
		if p.Continuation != nil {
			h := *p.Continuation
			p.Continuation = &h
		}
		st.Pending = &p
	}
	st.Transcript = make([]*a2a.Task, 0, len(c.state.Transcript))
	for _, t := range c.state.Transcript {
		st.Transcript = append(st.Transcript, copyTask(t))
	}
	if len(st.Transcript) == 0 {
		st.Transcript = nil
	}
	return st
}

// SetSupplyHistory makes every following turn carry the conversation's transcript as supplied
// history (or stops it); an agent asks for it with history_policy client_supplied.
func (c *Conversation) SetSupplyHistory(on bool) {
	c.mu.Lock()
	c.state.SupplyHistory = on
	c.mu.Unlock()
}

// Pending returns the interrupted task the next turn will resume, if any.
func (c *Conversation) Pending() (PendingTask, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state.Pending == nil {
		return PendingTask{}, false
	}
	return *c.state.Pending, true
}

// Save writes the state as JSON.
func (c *Conversation) Save(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(c.State()); err != nil {
		return fmt.Errorf("a2amqtt: save conversation: %w", err)
	}
	return nil
}

// SaveFile writes the state to path atomically (temp file + rename), so a
// crash never leaves a truncated conversation behind.
func (c *Conversation) SaveFile(path string) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".conversation-*")
	if err != nil {
		return fmt.Errorf("a2amqtt: save conversation: %w", err)
	}
	defer os.Remove(f.Name())
	if err := c.Save(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("a2amqtt: save conversation: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("a2amqtt: save conversation: %w", err)
	}
	return nil
}

// LoadConversationState reads state written by Save.
func LoadConversationState(r io.Reader) (ConversationState, error) {
	var st ConversationState
	if err := json.NewDecoder(r).Decode(&st); err != nil {
		return st, fmt.Errorf("a2amqtt: load conversation: %w", err)
	}
	return st, nil
}

// LoadConversationFile reads state from path.
func LoadConversationFile(path string) (ConversationState, error) {
	f, err := os.Open(path)
	if err != nil {
		return ConversationState{}, fmt.Errorf("a2amqtt: load conversation: %w", err)
	}
	defer f.Close()
	return LoadConversationState(f)
}

// nextRequest builds the next turn: resume the pending task or start a new
// one, always in the conversation's context.
func (c *Conversation) nextRequest(msg *a2a.Message) *a2a.SendMessageRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := *msg
	if m.ID == "" {
		m.ID = uuid.NewString()
	}
	if m.Role == "" {
		m.Role = a2a.MessageRoleUser
	}
	m.ContextID = c.state.ContextID
	switch p := c.state.Pending; {
	case p != nil && p.Continuation != nil && p.Continuation.ResumeScope == ResumeNewTaskInContext:
		// The agent asked for the answer in a new task of the context; the paused task is left
		// to it (the conversation service refuses the answer on the paused task).
		m.TaskID = a2a.TaskID(uuid.NewString())
		c.state.Pending = nil
	case p != nil:
		m.TaskID = p.TaskID
	default:
		m.TaskID = a2a.TaskID(uuid.NewString())
	}
	req := &a2a.SendMessageRequest{Message: &m}
	if c.state.SupplyHistory {
		var prior []*a2a.Task
		for _, t := range c.state.Transcript {
			if t.ID != m.TaskID {
				prior = append(prior, copyTask(t))
			}
		}
		SupplyHistory(req, SuppliedHistory{Tasks: prior})
	}
	c.recordLocked(m.TaskID, func(t *a2a.Task) { t.History = append(t.History, copyMessage(&m)) })
	return req
}

// recordLocked applies fn to the transcript's task id (created at the end when new).
func (c *Conversation) recordLocked(id a2a.TaskID, fn func(*a2a.Task)) {
	for _, t := range c.state.Transcript {
		if t.ID == id {
			fn(t)
			return
		}
	}
	t := &a2a.Task{ID: id, ContextID: c.state.ContextID, Status: a2a.TaskStatus{State: a2a.TaskStateSubmitted}}
	fn(t)
	c.state.Transcript = append(c.state.Transcript, t)
	if n := len(c.state.Transcript) - MaxTranscriptTasks; n > 0 {
		c.state.Transcript = slices.Delete(c.state.Transcript, 0, n)
	}
}

// recordEventLocked folds an event of task id into the transcript: status messages join the
// task's history, artifacts its artifacts (a2a-go's rules).
func (c *Conversation) recordEventLocked(id a2a.TaskID, ev a2a.Event) {
	c.recordLocked(id, func(t *a2a.Task) {
		switch v := ev.(type) {
		case *a2a.Task:
			known := map[string]bool{}
			for _, m := range t.History {
				known[m.ID] = true
			}
			for _, m := range v.History {
				if m != nil && !known[m.ID] {
					t.History = append(t.History, copyMessage(m))
					known[m.ID] = true
				}
			}
			for _, a := range v.Artifacts {
				_, _ = apply(t, &a2a.TaskArtifactUpdateEvent{TaskID: t.ID, ContextID: t.ContextID, Artifact: a})
			}
			t.Status = v.Status
			t.Status.Message = nil
			if m := v.Status.Message; m != nil && !known[m.ID] {
				t.History = append(t.History, copyMessage(m))
			}
		case *a2a.TaskStatusUpdateEvent:
			t.Status = v.Status
			t.Status.Message = nil
			if v.Status.Message != nil {
				t.History = append(t.History, copyMessage(v.Status.Message))
			}
		case *a2a.TaskArtifactUpdateEvent:
			ev := *v
			ev.TaskID, ev.ContextID = t.ID, t.ContextID
			_, _ = apply(t, &ev)
		case *a2a.Message:
			t.Status = a2a.TaskStatus{State: a2a.TaskStateCompleted}
			t.History = append(t.History, copyMessage(v))
		}
	})
}

// observe updates state from an event of the current turn.
func (c *Conversation) observe(taskID a2a.TaskID, ev a2a.Event) {
	var state a2a.TaskState
	var status *a2a.Message
	switch v := ev.(type) {
	case *a2a.Task:
		state, status = v.Status.State, v.Status.Message
	case *a2a.TaskStatusUpdateEvent:
		state, status = v.Status.State, v.Status.Message
	case *a2a.Message:
		state = a2a.TaskStateCompleted
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recordEventLocked(taskID, ev)
	if state == "" {
		return
	}
	if len(c.state.Tasks) == 0 || c.state.Tasks[len(c.state.Tasks)-1] != taskID {
		c.state.Tasks = append(c.state.Tasks, taskID)
	}
	switch {
	case state == a2a.TaskStateInputRequired || state == a2a.TaskStateAuthRequired:
		p := &PendingTask{TaskID: taskID, State: state, Question: TextOf(status)}
		if hint, ok, err := ContinuationOf(status); ok && err == nil {
			p.Continuation = &hint
			if hint.HistoryPolicy == HistoryClientSupplied {
				c.state.SupplyHistory = true
			}
		}
		c.state.Pending = p
	case state.Terminal():
		c.state.Pending = nil
	}
}

// Send runs one non-streaming turn with text and returns the result.
func (c *Conversation) Send(ctx context.Context, text string) (a2a.SendMessageResult, error) {
	return c.SendMessage(ctx, a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text)))
}

// SendMessage runs one non-streaming turn with msg (its task/context ids
// are set by the conversation).
func (c *Conversation) SendMessage(ctx context.Context, msg *a2a.Message) (a2a.SendMessageResult, error) {
	req := c.nextRequest(msg)
	res, err := c.tr.SendMessage(ctx, nil, req)
	if err != nil {
		return nil, err
	}
	c.observe(req.Message.TaskID, res)
	return res, nil
}

// Stream runs one streaming turn; the stream ends at completion or when the
// agent asks for input (then Pending reports the question).
func (c *Conversation) Stream(ctx context.Context, msg *a2a.Message) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		req := c.nextRequest(msg)
		for ev, err := range c.tr.SendStreamingMessage(ctx, nil, req) {
			if err == nil {
				c.observe(req.Message.TaskID, ev)
			}
			if !yield(ev, err) {
				return
			}
		}
	}
}

// Forget drops the pending task so the next turn starts a new task (e.g.
// the user changed their mind instead of answering).
func (c *Conversation) Forget() {
	c.mu.Lock()
	c.state.Pending = nil
	c.mu.Unlock()
}

// TextOf concatenates the text parts of a message ("" for nil).
func TextOf(m *a2a.Message) string {
	if m == nil {
		return ""
	}
	var parts []string
	for _, p := range m.Parts {
		if t := p.Text(); t != "" {
			parts = append(parts, t)
		}
	}
	return strings.Join(parts, "\n")
}

// ResultText extracts the human-readable answer of a turn: the status
// message, else the artifacts' text, else a Message's text.
func ResultText(res a2a.SendMessageResult) string {
	switch v := res.(type) {
	case *a2a.Message:
		return TextOf(v)
	case *a2a.Task:
		if s := TextOf(v.Status.Message); s != "" {
			return s
		}
		var parts []string
		for _, a := range v.Artifacts {
			for _, p := range a.Parts {
				if t := p.Text(); t != "" {
					parts = append(parts, t)
				}
			}
		}
		return strings.Join(parts, "\n")
	}
	return ""
}
